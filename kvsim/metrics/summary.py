"""The run summary: latency percentiles, throughput, memory peaks, cache and failures.

Percentiles use one definition everywhere — the smallest observed value with at
least q of the samples at or below it (numpy ``inverted_cdf``) — so TTFT/E2E
percentiles and the inter-token percentiles agree, every reported value is one that
actually occurred, and a plan's percentile pooled over its runs is this one over their
union (:mod:`kvsim.metrics.pooled`).  Each latency has p50, p90, p95, p99 and its mean,
as benchmark_serving and GuideLLM report them.  Inter-token gaps come as affine runs (``itl`` table,
:mod:`kvsim.metrics.records`); their percentiles are exact over the expanded gaps
(:mod:`kvsim.metrics.gaps`) without expanding them; with a calibrated step-time
spread they are those of the gaps times that spread (:mod:`kvsim.metrics.spread`).

A run cut short keeps the requests still running or waiting at its stop as rows with
status ``unfinished`` (:mod:`kvsim.metrics.records`): they count in ``requests``,
``unfinished_requests`` and every token and preemption total (what the engine did up
to the stop), but not in the latency percentiles, which cover the requests that
ended (finished or failed): an unfinished request has no E2E, and its TTFT or gaps
so far would mix a partial sample into the distribution.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from kvsim.metrics import gaps, spread
from kvsim.metrics.failures import (
    CODE_KIND,
    FAILURE_CODE,
    FAILURE_CODES,
    FAILURE_KINDS,
    failure_code,
)
from kvsim.metrics.records import (
    ABANDON_EVENT,
    FAILED,
    FINISHED,
    ITL_DELTA,
    NEW_CHAT_EVENT,
    STATUS,
    UNFINISHED,
)

QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p95", 0.95), ("p99", 0.99))
PERCENTILE_METHOD = "inverted_cdf"  # NOTE: the one definition (module doc)


def percentiles(name: str, values: pd.Series | np.ndarray) -> dict[str, float]:
    """``{name}_p50_s``, ``_p90_s``, ``_p95_s``, ``_p99_s`` and ``_mean_s`` of the finite
    ``values`` (``inverted_cdf``)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return {f"{name}_{k}_s": math.nan for k in (*(k for k, _ in QUANTILES), "mean")}
    out = {f"{name}_{k}_s": float(np.percentile(v, q * 100, method=PERCENTILE_METHOD))
           for k, q in QUANTILES}
    out[f"{name}_mean_s"] = float(v.mean())
    return out


def itl_runs(itl: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gap_s, gap_delta_s, count) arrays of an ``itl`` table (delta 0 when absent)."""
    g = itl["gap_s"].to_numpy(dtype=np.float64)
    d = itl[ITL_DELTA].to_numpy(dtype=np.float64) if ITL_DELTA in itl.columns \
        else np.zeros_like(g)
    return g, d, itl["count"].to_numpy(dtype=np.int64)


def itl_quantile(itl: pd.DataFrame, q: float) -> float:
    """Exact ``inverted_cdf`` quantile over every gap of an ``itl`` table."""
    return gaps.quantile(*itl_runs(itl), q)


def request_status(requests: pd.DataFrame) -> np.ndarray:
    """Each row's ``status``: the column, or (older folders, measured replays, which
    kept no unfinished rows) ``failed`` / ``finished`` from the ``failed`` column."""
    if STATUS in requests.columns:
        return requests[STATUS].to_numpy(dtype=object)
    failed = requests["failed"].fillna(False).to_numpy(dtype=bool) \
        if "failed" in requests.columns else np.zeros(len(requests), dtype=bool)
    return np.where(failed, FAILED, FINISHED).astype(object)


def unfinished_mask(requests: pd.DataFrame) -> np.ndarray:
    """True for the rows of requests still running or waiting when the run stopped."""
    return request_status(requests) == UNFINISHED


def ended(requests: pd.DataFrame, itl: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of ``requests`` and ``itl`` of the requests that ended (finished or
    failed), over which latency percentiles are taken (module doc)."""
    cut = unfinished_mask(requests)
    if not cut.any():
        return requests, itl
    out = requests[cut]["request_id"]
    return requests[~cut], itl[~itl["request_id"].isin(out)]


def looked_up(requests: pd.DataFrame) -> np.ndarray:
    """True for the requests whose prompt the engine looked up in its prefix cache:
    every request it scheduled.  One it never scheduled — rejected at entry (a prompt
    over its context: "maximum context length exceeded") or still waiting when the
    run stopped — had no lookup, as in vLLM's prefix-cache queries
    (docs/reference/engines.md §1.8).
    NOTE: a measured replay has no scheduling times: its finished requests count."""
    if "first_scheduled_s" not in requests.columns:
        return np.ones(len(requests), dtype=bool)
    scheduled = requests["first_scheduled_s"].notna().to_numpy(dtype=bool)
    return scheduled | (request_status(requests) == FINISHED)


def read_prompt_tokens(requests: pd.DataFrame) -> pd.Series:
    """Per request, the prompt tokens the engine read: as sent, less what it truncated
    away to fit its context (Ollama; ``truncated_prompt_tokens``, 0 where unknown)."""
    if "truncated_prompt_tokens" not in requests.columns:
        return requests["prompt_tokens"]
    return requests["prompt_tokens"] - requests["truncated_prompt_tokens"]


def prefix_hit_rate(requests: pd.DataFrame) -> float:
    """Prompt tokens served from the prefix cache over the prompt tokens the engine
    looked up — the prompts of the requests it scheduled (:func:`looked_up`), as sent
    less what it truncated away (vLLM's prefix_cache_hits / prefix_cache_queries,
    docs/reference/engines.md §1.8)."""
    req = requests[looked_up(requests)]
    read = int(read_prompt_tokens(req).sum())
    return int(req["cached_tokens"].sum()) / read if read > 0 else 0.0


def summarize(requests: pd.DataFrame, itl: pd.DataFrame, memory: pd.DataFrame,
              steps: pd.DataFrame, *, static_device_bytes: int, device_bytes: int,
              preemptions: int, evictions: int = 0, sim_time_s: float,
              decode_spread: tuple[float, ...] = (),
              prefill_spread: tuple[float, ...] = ()) -> dict[str, Any]:
    """The flat summary dict written to ``summary.json``.

    ``decode_spread`` / ``prefill_spread``: calibrated spreads that the inter-token
    percentiles and mean / the TTFT percentiles carry (:mod:`kvsim.metrics.spread`);
    recorded as ``itl_spread`` / ``ttft_spread`` (only when there is one).
    Percentiles cover the requests that ended; totals every request (module doc).
    """
    out: dict[str, Any] = {}
    done, done_itl = ended(requests, itl)
    out.update(percentiles("ttft", spread.with_spread(done["ttft_s"], prefill_spread)))
    out["latency_requests"] = int(np.isfinite(done["ttft_s"].to_numpy(dtype=float)).sum())
    out.update(percentiles("queue", done["queue_s"]))
    out.update(percentiles("e2e", done["e2e_s"]))
    runs = itl_runs(done_itl)
    for (k, _), v in zip(QUANTILES, spread.spread_quantiles(*runs, decode_spread,
                                                             [q for _, q in QUANTILES])):
        out[f"itl_{k}_s"] = v
    out["itl_mean_s"] = spread.spread_mean(*runs, decode_spread)
    if decode_spread:
        out["itl_spread"] = list(decode_spread)
    if prefill_spread:
        out["ttft_spread"] = list(prefill_spread)
    output_tokens = int(requests["output_tokens"].sum())
    unfinished = int(unfinished_mask(requests).sum())
    # NOTE: cut short, the unfinished requests' tokens came up to the stop
    end = sim_time_s if unfinished else requests["finish_s"].max()
    span = (end - requests["arrival_s"].min()) if len(requests) else 0.0
    out["output_tokens"] = output_tokens
    out["tokens_per_s"] = float(output_tokens / span) if span and not math.isnan(span) else 0.0
    out.update(busy(requests, end if unfinished else math.nan))
    peak_res = int(memory["kv_reserved_bytes"].max()) if len(memory) else 0
    peak_alloc = int(memory["kv_allocated_bytes"].max()) if len(memory) else 0
    out["peak_kv_reserved_bytes"] = peak_res
    out["peak_kv_allocated_bytes"] = peak_alloc
    out["peak_kv_cached_bytes"] = int(memory["kv_cached_bytes"].max()) if len(memory) else 0
    out["peak_host_kv_bytes"] = int(memory["host_kv_bytes"].max()) if len(memory) else 0
    out["peak_device_bytes"] = static_device_bytes + peak_res
    out["device_bytes"] = device_bytes
    out["peak_device_fraction"] = (static_device_bytes + peak_res) / device_bytes
    prompt = int(requests["prompt_tokens"].sum())
    out["prompt_tokens"] = prompt
    out["cached_tokens"] = int(requests["cached_tokens"].sum())
    out["computed_prompt_tokens"] = int(requests["computed_prompt_tokens"].sum())
    out["recomputed_tokens"] = int(requests["recomputed_tokens"].sum())
    out["prefix_hit_rate"] = prefix_hit_rate(requests)
    out["preemptions"] = int(preemptions)
    out["evictions"] = int(evictions)
    out["failed_requests"] = int(requests["failed"].sum())
    out.update(failed_by_reason(requests))
    out["truncated_requests"] = int(requests["truncated"].sum())
    out["truncated_prompt_tokens"] = int(requests["truncated_prompt_tokens"].sum())
    out["requests"] = len(requests)
    out["unfinished_requests"] = unfinished
    out["steps"] = int(steps["steps"].sum()) if len(steps) else 0
    out["sim_time_s"] = float(sim_time_s)
    return out


def failure_codes(requests: pd.DataFrame) -> pd.Series:
    """Each failed request's code (:mod:`kvsim.metrics.failures`): its ``failure_code``
    column, or (older folders, measured replays) the code of its ``failure_reason``."""
    if "failed" not in requests.columns:
        return pd.Series(dtype=object)
    failed = requests[requests["failed"].fillna(False).astype(bool)]
    if FAILURE_CODE in failed.columns:
        return failed[FAILURE_CODE].astype(str)
    if "failure_reason" not in failed.columns:
        return pd.Series(["engine_error"] * len(failed), index=failed.index, dtype=object)
    return failed["failure_reason"].fillna("").astype(str).map(failure_code)


def failed_by_reason(requests: pd.DataFrame) -> dict[str, int]:
    """``failed_<code>_requests`` for each code and ``failed_<kind>_requests`` for each
    kind of :mod:`kvsim.metrics.failures` (too long, busy, memory: the OOM-class ones)."""
    counts = failure_codes(requests).value_counts()
    out = {f"failed_{c}_requests": int(counts.get(c, 0)) for c in FAILURE_CODES}
    for kind in FAILURE_KINDS:
        out[f"failed_{kind}_requests"] = sum(out[f"failed_{c}_requests"]
                                             for c, k in CODE_KIND.items() if k == kind)
    return out


def busy(requests: pd.DataFrame, stop_s: float = math.nan) -> dict[str, Any]:
    """How busy the server was: ``busy_s`` (the time at least one request was in it,
    arrival to end — the union of those intervals), ``output_tokens_per_busy_s`` (output
    tokens over that time: what it delivered while in use, not a whole-day average),
    ``peak_concurrent_requests`` (the most requests in it at once) and
    ``longest_request_tokens`` (the largest prompt + output of one request: the context
    one session needed).  A request without an end (failed at entry, unfinished at a
    stop) ends at its last known time, or ``stop_s`` when unfinished."""
    if not len(requests):
        return {"busy_s": 0.0, "output_tokens_per_busy_s": 0.0, "peak_concurrent_requests": 0,
                "longest_request_tokens": 0}
    start = requests["arrival_s"].to_numpy(dtype=float)
    end = requests["finish_s"].to_numpy(dtype=float)
    for col in ("first_token_s", "first_scheduled_s"):
        if col in requests.columns:
            end = np.where(np.isnan(end), requests[col].to_numpy(dtype=float), end)
    if not math.isnan(stop_s):
        end = np.where(unfinished_mask(requests), stop_s, end)
    end = np.where(np.isnan(end), start, np.maximum(end, start))
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    # NOTE: a new busy interval starts where an arrival comes after every earlier end
    new = np.r_[True, s[1:] > e[:-1]]
    last = np.r_[np.flatnonzero(new)[1:] - 1, len(s) - 1]
    busy_s = float((e[last] - s[new]).sum())
    ev = np.r_[start, end]
    step = np.r_[np.ones(len(start)), -np.ones(len(end))]
    by = np.lexsort((step, ev))  # NOTE: at a tie an end comes before an arrival
    tokens = int(requests["output_tokens"].sum())
    need = (requests["prompt_tokens"] + requests["output_tokens"]).max()
    return {"busy_s": busy_s,
            "output_tokens_per_busy_s": tokens / busy_s if busy_s > 0 else 0.0,
            "peak_concurrent_requests": int(np.cumsum(step[by]).max()),
            "longest_request_tokens": int(need)}


def session_outcomes(events: pd.DataFrame) -> dict[str, int]:
    """What sessions did after a failed request, from the ``events`` table: ``new_chats``
    (turns that opened a new chat) and ``abandoned_turns`` (turns an ended session dropped).
    """
    kinds = events["kind"] if len(events) else pd.Series([], dtype=object)
    return {"new_chats": int((kinds == NEW_CHAT_EVENT).sum()),
            "abandoned_turns": int((kinds == ABANDON_EVENT).sum())}


def device_peaks(peak_kv_reserved_bytes: int, devices: Any) -> dict[str, Any]:
    """Several GPUs: each GPU's peak (its fixed bytes plus its part of the pool's peak
    reserved KV) and the fullest one's fraction, which is the box's
    ``peak_device_fraction`` (the planning line holds per GPU).

    ``devices``: :class:`kvsim.core.build.DevicePart` rows whose ``kv_bytes`` sum to the
    pool's reserved bytes.  {} for one GPU."""
    if not devices:
        return {}
    total_kv = sum(d.kv_bytes for d in devices)
    rows = []
    for d in devices:
        kv = peak_kv_reserved_bytes * d.kv_bytes // total_kv if total_kv else 0
        peak = d.static_bytes + kv
        rows.append({"index": d.index, "gpu": d.gpu, "static_bytes": d.static_bytes,
                     "kv_bytes": d.kv_bytes, "peak_device_bytes": peak,
                     "device_bytes": d.device_bytes,
                     "peak_device_fraction": peak / d.device_bytes})
    return {"peak_device_fraction": max(r["peak_device_fraction"] for r in rows),
            "gpus": rows}
