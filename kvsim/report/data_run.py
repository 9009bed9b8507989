"""Pure data functions for the per-run report figures (no Plotly here).

Each function takes the tables of one :class:`kvsim.metrics.results.Results`
(DataFrames following ``notes/results.md``) and returns plain data — NumPy
arrays, small DataFrames, dicts — or ``None`` when the run has nothing to show
(the page then prints a one-line note instead of an empty figure).  They are
tested on hand-built tables, without rendering.

Memory accounting follows docs/design/DESIGN.md §3.1: device = driver reserve + display/other
+ weights + activations + KV pool (reserved), and inside the pool allocated (by
block state) + cached prefix blocks + reserved-but-free.

NOTE: ``kv_allocated_bytes`` and ``kv_cached_bytes`` are taken as disjoint parts of
``kv_reserved_bytes`` (live blocks vs evictable cached prefix blocks); any further
``kv_<state>_bytes`` column (e.g. ``kv_quant_bytes``) is the part of *allocated*
held in that state, and ``host_<...>_bytes`` columns are the host tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvsim.metrics import gaps
from kvsim.metrics.records import weighted_quantile
from kvsim.metrics.spread import base_quantiles, spread_quantiles, with_spread
from kvsim.metrics.summary import itl_runs, looked_up, read_prompt_tokens, unfinished_mask
from kvsim.report.data_recall import accuracy_per_session  # noqa: F401 - part of this API
from kvsim.report.downsample import DEFAULT_BUCKETS, minmax_rows, thin_monotone

GIB = float(2**30)
_POOL_COLS = ("kv_reserved_bytes", "kv_allocated_bytes", "kv_cached_bytes")
_BREAKDOWN = (  # (label, summary key) of the static device rows, docs/design/DESIGN.md §3.1
    ("driver reserve", "driver_reserve_bytes"), ("display / other", "display_reserve_bytes"),
    ("weights", "weights_gpu_bytes"), ("activations", "activation_bytes"),
    ("engine overhead", "engine_overhead_bytes"))
CDF_EXPAND_MAX = 1 << 22  # gaps expanded for the exact step CDF (32 MB)
SLOT_ALLOCATORS = ("slots", "unified")
# event kinds that move KV bytes over PCIe, by direction
# NOTE: every event kind that carries KV bytes over the link: policy paths, the
# llama.cpp RAM cache (cache_save / idle_save), vLLM swap and the paged host tier
D2H_KINDS = frozenset({"offload", "backup", "swap_out", "writeback", "cache_save",
                       "idle_save", "host_store"})
H2D_KINDS = frozenset({"restore", "recall", "promote", "swap_in", "host_load"})


def nonempty(df: Any) -> bool:
    """True when ``df`` is a DataFrame with at least one row."""
    return isinstance(df, pd.DataFrame) and len(df) > 0


def scenario_config(scenario: dict[str, Any] | None) -> tuple[dict[str, Any], str]:
    """``(resolved config, hash)`` from a ``scenario.json`` document.

    Accepts ``{"scenario": {...}, "hash": "..."}`` or the flat resolved dict with an
    optional ``hash`` / ``scenario_hash`` key.
    """
    doc = dict(scenario or {})
    digest = str(doc.pop("hash", doc.pop("scenario_hash", "")) or "")
    inner = doc.get("scenario")
    if isinstance(inner, dict) and ("gpu" in inner or "model" in inner):
        return inner, digest
    return doc, digest


def run_config(results: Any) -> tuple[dict[str, Any], str]:
    """``(resolved scenario dict, scenario hash)`` of a Results-like object."""
    config, digest = scenario_config(getattr(results, "scenario", None))
    return config, str(getattr(results, "scenario_hash", "") or digest)


def time_scale(span_s: float) -> tuple[float, str]:
    """Divisor and axis label that keep a time axis readable (s, min or h)."""
    if span_s > 3 * 3600:
        return 3600.0, "time (h)"
    if span_s > 3 * 60:
        return 60.0, "time (min)"
    return 1.0, "time (s)"


def static_layers(summary: dict, config: dict) -> list[tuple[str, int]]:
    """The constant device rows below the KV pool, as ``(label, bytes)``.

    Taken from summary keys (``driver_reserve_bytes``, ``display_reserve_bytes``,
    ``weights_gpu_bytes``, ``activation_bytes``, ``engine_overhead_bytes``) when
    present, else recomputed from the resolved scenario with
    :func:`kvsim.engines.budget.memory_budget`.  NOTE: the parts are used only if they
    add up to ``peak_device_bytes - peak_kv_reserved_bytes`` from the summary; if not
    (or if nothing is known) one combined row of exactly that size is drawn, so the
    plotted peak is always the simulated one.
    """
    static = None
    if summary.get("peak_device_bytes") is not None and summary.get(
            "peak_kv_reserved_bytes") is not None:
        static = int(summary["peak_device_bytes"]) - int(summary["peak_kv_reserved_bytes"])
    parts = [(label, int(summary[k])) for label, k in _BREAKDOWN if _finite(summary.get(k))]
    if not parts:
        parts = _budget_parts(config)
    if parts and (static is None or sum(v for _, v in parts) == static):
        return [(label, v) for label, v in parts if v > 0]
    return [("weights, activations & reserves", static)] if static else []


def _finite(value: Any) -> bool:
    return value is not None and np.isfinite(float(value))


def _budget_parts(config: dict) -> list[tuple[str, int]]:
    from kvsim.engines.budget import box_reserves, memory_budget
    from kvsim.scenario import Scenario

    try:
        sc = Scenario.model_validate(config)
        b = memory_budget(sc.gpu, sc.model, sc.weights, sc.engine, **box_reserves(sc))
    except Exception:
        return []
    return [("driver reserve", b.driver_reserve_bytes),
            ("display / other", b.display_reserve_bytes), ("weights", b.weights_gpu_bytes),
            ("activations", b.activation_bytes), ("engine overhead", b.engine_overhead_bytes)]


def memory_stack(memory: pd.DataFrame | None, summary: dict | None,
                 scenario: dict | None, buckets: int = DEFAULT_BUCKETS) -> dict | None:
    """Device memory as stacked layers over time, plus the host tier.

    Returns ``{"time_s", "device_layers": [(label, bytes array)], "device_total_bytes",
    "host_layers", "capacity_bytes", "peak_device_bytes", "peak_time_s"}`` or ``None``
    without memory samples.  The device total is summed in integer bytes before
    down-sampling (min/max buckets keyed on the total), so its maximum is the exact
    simulated peak.
    """
    if not nonempty(memory) or "kv_reserved_bytes" not in memory.columns:
        return None
    summary = summary or {}
    config, _ = scenario_config(scenario)
    mem = memory.sort_values("time_s", kind="stable").reset_index(drop=True)
    layers = [(label, np.full(len(mem), v, dtype=np.int64))
              for label, v in static_layers(summary, config)]
    static = sum((v for _, v in layers), np.zeros(len(mem), dtype=np.int64))
    reserved = mem["kv_reserved_bytes"].to_numpy(dtype=np.int64)
    allocated = _col(mem, "kv_allocated_bytes")
    cached = _col(mem, "kv_cached_bytes")
    if (config.get("engine") or {}).get("allocator") in SLOT_ALLOCATORS:
        # NOTE: slot engines count idle slots' cached prompts inside "allocated" (their
        # cells stay in use); the paged pool counts cached free blocks apart from it.
        allocated = allocated - np.minimum(cached, allocated)
    states = [c for c in mem.columns if c.startswith("kv_") and c.endswith("_bytes")
              and c not in _POOL_COLS]
    in_states = np.zeros(len(mem), dtype=np.int64)
    for c in states:
        in_states += _col(mem, c)
    layers.append(("KV allocated (full)", allocated - in_states))
    for c in states:
        layers.append((f"KV {c[3:-6].replace('_', ' ')}", _col(mem, c)))
    layers.append(("KV cached prefix", cached))
    layers.append(("KV reserved, free", np.maximum(reserved - allocated - cached, 0)))
    total = static + reserved
    host_cols = [c for c in mem.columns if c.startswith("host_") and c.endswith("_bytes")]
    frame = pd.DataFrame({"time_s": mem["time_s"].to_numpy(dtype=float), "_total": total})
    frame["_alloc"] = allocated
    frame["_host"] = sum((_col(mem, c) for c in host_cols), np.zeros(len(mem), dtype=np.int64))
    kept = minmax_rows(frame.reset_index(), "time_s", ["_total", "_alloc", "_host"], buckets)
    idx = kept["index"].to_numpy()
    peak_i = int(np.argmax(total))
    capacity = summary.get("device_bytes") or (config.get("gpu") or {}).get("memory_bytes")
    return {
        "time_s": frame["time_s"].to_numpy()[idx],
        "device_layers": [(label, v[idx]) for label, v in layers if v.any()],
        "device_total_bytes": total[idx],
        "host_layers": [(c[5:-6].replace("_", " ") or "host", _col(mem, c)[idx])
                        for c in host_cols if _col(mem, c).any()],
        "capacity_bytes": float(capacity) if capacity else None,
        "peak_device_bytes": int(total[peak_i]),
        "peak_time_s": float(frame["time_s"].iloc[peak_i]),
    }


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df.columns:
        return np.zeros(len(df), dtype=np.int64)
    return df[name].fillna(0).to_numpy(dtype=np.int64)


def session_phases(requests: pd.DataFrame | None) -> pd.DataFrame | None:
    """One row per drawn phase: ``session_id, request_id, turn, phase, start_s, end_s``.

    Phases: queue (arrival → first scheduled), prefill (→ first token), decode
    (→ finish) and think (previous turn's finish → this arrival, same session).
    Phases with an unknown or negative extent (a failed request has NaN times) are
    left out.
    """
    if not nonempty(requests):
        return None
    req = requests.sort_values(["session_id", "turn"], kind="stable")
    prev_finish = req.groupby("session_id", sort=False)["finish_s"].shift(1)
    spans = {
        "think": (prev_finish, req["arrival_s"]),
        "queue": (req["arrival_s"], req["first_scheduled_s"]),
        "prefill": (req["first_scheduled_s"], req["first_token_s"]),
        "decode": (req["first_token_s"], req["finish_s"]),
    }
    parts = []
    for phase, (start, end) in spans.items():
        part = pd.DataFrame({
            "session_id": req["session_id"].astype(str), "request_id": req["request_id"],
            "turn": req["turn"], "phase": phase,
            "start_s": start.astype(float), "end_s": end.astype(float)})
        ok = np.isfinite(part["start_s"]) & np.isfinite(part["end_s"]) & (
            part["end_s"] >= part["start_s"])
        parts.append(part[ok])
    return pd.concat(parts, ignore_index=True)


def session_order(requests: pd.DataFrame | None) -> list[str]:
    """Session ids ordered by their first arrival (ties by id)."""
    if not nonempty(requests):
        return []
    first = requests.groupby(requests["session_id"].astype(str))["arrival_s"].min()
    return [str(s) for s in first.reset_index().sort_values(["arrival_s", "session_id"])[
        "session_id"]]


def session_markers(requests: pd.DataFrame | None, events: pd.DataFrame | None
                    ) -> pd.DataFrame | None:
    """Turn arrivals, failures and preemptions to mark on the session timeline.

    Columns ``session_id, request_id, kind ("turn" | "failed" | "preempt"), time_s,
    detail``; turn marks keep short turns visible on a week-long axis.
    A failure sits at the request's last known time (finish, first token, first
    scheduled, arrival); preemptions come from ``events`` rows of kind ``preempt``.
    """
    if not nonempty(requests):
        return None
    rows = [(str(r.session_id), r.request_id, "turn", float(r.arrival_s), f"turn {r.turn}")
            for r in requests.itertuples(index=False)]
    failed = requests[requests["failed"].astype(bool)]
    for r in failed.itertuples(index=False):
        times = [r.finish_s, r.first_token_s, r.first_scheduled_s, r.arrival_s]
        when = next((float(t) for t in times if pd.notna(t)), float("nan"))
        rows.append((str(r.session_id), r.request_id, "failed", when, str(r.failure_reason)))
    if nonempty(events) and {"kind", "request_id"} <= set(events.columns):
        owner = dict(zip(requests["request_id"], requests["session_id"].astype(str)))
        pre = events[events["kind"] == "preempt"]
        for r in pre.itertuples(index=False):
            if r.request_id in owner:
                rows.append((owner[r.request_id], r.request_id, "preempt", float(r.time_s),
                             str(getattr(r, "detail", ""))))
    return pd.DataFrame(rows, columns=["session_id", "request_id", "kind", "time_s", "detail"])


def ttft_cdf(requests: pd.DataFrame | None, max_points: int = 2000,
             spread: Sequence[float] = ()) -> dict | None:
    """Empirical CDF of TTFT over the requests that ended (not those unfinished at a
    stop, as in the summary) and produced a first token (times a calibrated prefill
    ``spread``, the summary's ``ttft_spread``, as in the summary)."""
    return _request_cdf(requests, "ttft_s", max_points, spread)


def e2e_cdf(requests: pd.DataFrame | None, max_points: int = 2000) -> dict | None:
    """Empirical CDF of end-to-end latency over the requests that finished."""
    return _request_cdf(requests, "e2e_s", max_points)


def _request_cdf(requests: pd.DataFrame | None, column: str, max_points: int,
                 spread: Sequence[float] = ()) -> dict | None:
    if not nonempty(requests) or column not in requests.columns:
        return None
    values = requests[column].to_numpy(dtype=float)[~unfinished_mask(requests)]
    x = np.sort(with_spread(values, spread))
    if len(x) == 0:
        return None
    p = np.arange(1, len(x) + 1) / len(x)
    n = int(np.isfinite(values).sum())  # requests, not request × spread values
    xs, ps = thin_monotone(x, p, max_points)
    ones = [1] * len(x)
    return {"x_s": xs, "p": ps, "n": n, "p50_s": weighted_quantile(x.tolist(), ones, 0.5),
            "p95_s": weighted_quantile(x.tolist(), ones, 0.95)}


def itl_cdf(itl: pd.DataFrame | None, max_points: int = 2000,
            spread: Sequence[float] = ()) -> dict | None:
    """CDF of inter-token gaps from the ``itl`` table (affine runs, notes/results.md).

    Each row stands for ``count`` gaps ``gap_s + k·gap_delta_s`` (delta 0 or absent:
    run-length rows).  Up to :data:`CDF_EXPAND_MAX` gaps the exact step CDF is built
    from the expanded values; beyond, it is evaluated exactly at ``max_points``
    evenly spaced gap values.  p50/p95 are exact either way.  With a calibrated
    step-time ``spread`` (the summary's ``itl_spread``) the curve and percentiles are
    those of gap × spread, as in the summary (:mod:`kvsim.metrics.spread`).
    """
    if not nonempty(itl):
        return None
    g, d, n = itl_runs(itl)
    g, d, n = gaps.as_runs(g, d, n)
    total = int(n.sum())
    if not total:
        return None
    if len(spread):
        x = np.sort(np.multiply.outer(base_quantiles(g, d, n), np.asarray(spread)).ravel())
        xs, ps = thin_monotone(x, np.arange(1, x.size + 1) / x.size, max_points)
        p50, p95 = spread_quantiles(g, d, n, spread, (0.5, 0.95))
        return {"x_s": xs, "p": ps, "n": total, "p50_s": p50, "p95_s": p95}
    p50, p95 = gaps.quantiles(g, d, n, (0.5, 0.95))
    if not d.any() or total <= CDF_EXPAND_MAX:
        if d.any():
            g, n = np.unique(gaps.expand(g, d, n), return_counts=True)
        grouped = pd.Series(n, index=g).groupby(level=0, sort=True).sum()
        x = grouped.index.to_numpy(dtype=float)
        w = grouped.to_numpy(dtype=float)
        p = np.cumsum(w) / w.sum()
        xs, ps = thin_monotone(x, p, max_points)
    else:
        last = g + (n - 1) * d
        xs = np.linspace(float(np.minimum(g, last).min()), float(np.maximum(g, last).max()),
                         max_points)
        ps = np.array([gaps.count_le(float(x), g, d, n) for x in xs]) / total
    return {"x_s": xs, "p": ps, "n": total, "p50_s": p50, "p95_s": p95}


def concurrency(memory: pd.DataFrame | None, steps: pd.DataFrame | None,
                buckets: int = DEFAULT_BUCKETS) -> dict | None:
    """Running/waiting requests (memory samples) and engine batch size (steps) over time."""
    out: dict[str, Any] = {}
    if nonempty(memory) and {"running", "waiting"} <= set(memory.columns):
        m = minmax_rows(memory[["time_s", "running", "waiting"]], "time_s",
                        ["running", "waiting"], buckets)
        out["samples"] = {c: m[c].to_numpy() for c in ("time_s", "running", "waiting")}
    if nonempty(steps) and "batch_size" in steps.columns:
        s = minmax_rows(steps[["start_s", "batch_size"]], "start_s", ["batch_size"], buckets)
        out["steps"] = {"time_s": s["start_s"].to_numpy(), "batch_size": s["batch_size"].to_numpy()}
    return out or None


def pcie_traffic(events: pd.DataFrame | None, transfers: pd.DataFrame | None = None,
                 max_points: int = 2000) -> dict | None:
    """Cumulative PCIe bytes per direction over time, and exact totals.

    Uses a ``transfers`` table (``start_s, end_s, direction ("h2d"|"d2h"), bytes``) when
    the run has one, else ``events`` rows whose kind moves KV (:data:`D2H_KINDS` → d2h,
    :data:`H2D_KINDS` → h2d), each counted at its time.  Cumulative curves are monotone, so thinning keeps the final total.
    ``None`` when no byte crossed the link.
    """
    if nonempty(transfers):
        t = pd.DataFrame({"time_s": transfers["start_s"].astype(float),
                          "direction": transfers["direction"].astype(str).str.lower(),
                          "bytes": transfers["bytes"].astype(float)})
    elif nonempty(events) and "bytes" in events.columns:
        kind = events["kind"].astype(str)
        direction = np.where(kind.isin(D2H_KINDS), "d2h",
                             np.where(kind.isin(H2D_KINDS), "h2d", ""))
        t = pd.DataFrame({"time_s": events["time_s"].astype(float), "direction": direction,
                          "bytes": events["bytes"].fillna(0).astype(float)})
    else:
        return None
    t = t[(t["bytes"] > 0) & t["direction"].isin(("h2d", "d2h"))]
    if t.empty:
        return None
    out: dict[str, Any] = {"totals_bytes": {}, "series": {}}
    for d in ("h2d", "d2h"):
        sub = t[t["direction"] == d].sort_values("time_s", kind="stable")
        if sub.empty:
            continue
        x, y = thin_monotone(sub["time_s"].to_numpy(), np.cumsum(sub["bytes"].to_numpy()),
                             max_points)
        out["series"][d] = {"time_s": x, "cumulative_bytes": y}
        out["totals_bytes"][d] = float(sub["bytes"].sum())
    return out


def prefix_hits(requests: pd.DataFrame | None) -> dict | None:
    """Cumulative token-weighted prefix hit rate by arrival: Σcached / Σ(prompt looked
    up: as sent, less what the engine truncated away) so far, over the requests the
    engine looked up (:func:`kvsim.metrics.summary.looked_up`), as summary.json's."""
    if not nonempty(requests) or "cached_tokens" not in requests.columns:
        return None
    req = requests[looked_up(requests)].sort_values("arrival_s", kind="stable")
    if not len(req):
        return None
    prompt = read_prompt_tokens(req).to_numpy(dtype=float)
    if prompt.sum() <= 0:
        return None
    cached = req["cached_tokens"].to_numpy(dtype=float)
    cum_p = np.cumsum(prompt)
    ok = cum_p > 0
    return {"time_s": req["arrival_s"].to_numpy(dtype=float)[ok],
            "hit_rate": (np.cumsum(cached)[ok] / cum_p[ok]),
            "overall": float(cached.sum() / prompt.sum())}

