"""Pure data for the report's first screen: verdicts, and runs or cards side by side.

- :func:`run_verdicts`: each run's verdict (:func:`kvsim.plan.advice.run_verdict`) against
  the report's SLOs (``--slo``), else the run's scenario ``slo`` section, else kvsim's
  defaults — what ``kvsim report A B`` shows when no command handed one over;
- :func:`comparison`: with several runs, one row per metric (memory, p95s, recall,
  failures by code, throughput while busy), one column per run, and each later run's
  difference from the first (``+0.25 GiB (+12 %)``);
- :func:`card_rows`: a GPU comparison as one row per card — latency, memory, flags and
  verdict.

No Plotly and no HTML here (kvsim.report.page renders them); tested without rendering.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from kvsim.config.units import format_latency
from kvsim.metrics.accuracy import recall_measured
from kvsim.metrics.failures import FAILURE_CODES

# (summary key, label, kind): kind says how a value and a difference read
METRICS = (("peak_device_bytes", "peak device memory", "gib"),
           ("peak_device_fraction", "peak device fraction", "share"),
           ("ttft_p50_s", "TTFT p50", "latency"), ("ttft_p95_s", "TTFT p95", "latency"),
           ("ttft_p99_s", "TTFT p99", "latency"), ("itl_p95_s", "ITL p95", "latency"),
           ("e2e_p95_s", "E2E p95", "latency"), ("prefix_hit_rate", "prefix hit rate", "share"),
           ("recall_mean", "recall proxy (mean)", "score"),
           ("output_tokens_per_busy_s", "output tokens/s while busy", "rate"),
           ("preemptions", "preemptions", "count"), ("failed_requests", "failed requests",
                                                      "count"))


def run_verdicts(runs: Sequence[Any], labels: Sequence[str],
                 slo: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """``{"name", "headline", "details", "meets"}`` per run (module doc)."""
    from kvsim.plan.advice import DEFAULT_SLOS, run_verdict
    from kvsim.plan.slo import build_constraints
    from kvsim.report.data_run import run_config

    out = []
    for label, res in zip(labels, runs):
        summary = dict(getattr(res, "summary", None) or {})
        config, _ = run_config(res)
        if slo:
            texts, source = [f"{k.removesuffix('_s')}={v}s" for k, v in slo.items()], "--slo"
        elif config.get("slo"):
            texts = [f"{k}={v}" for k, v in config["slo"].items()]
            source = "the scenario's slo section"
        else:
            texts, source = list(DEFAULT_SLOS), "kvsim's defaults"
        v = run_verdict(summary, build_constraints(texts), getattr(res, "requests", None),
                        source=source)
        out.append({"name": label, "headline": v.headline, "details": list(v.details),
                    "meets": v.meets})
    return out


def _value(summary: dict[str, Any], key: str) -> float:
    if key == "recall_mean" and not recall_measured(summary, key):
        return math.nan
    v = summary.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def _text(v: float, kind: str) -> str:
    if math.isnan(v):
        return "-"
    if kind == "gib":
        return f"{v / 2**30:.2f} GiB"
    if kind == "share":
        return f"{v:.1%}"
    if kind == "latency":
        return format_latency(v)
    if kind == "score":
        return f"{v:.3f}"
    if kind == "rate":
        return f"{v:,.1f}"
    return f"{v:,.0f}"


def _delta(v: float, first: float, kind: str) -> str:
    if math.isnan(v) or math.isnan(first):
        return "-"
    d = v - first
    if kind == "share":
        return f"{100 * d:+.1f} pt"
    rel = f" ({d / first:+.0%})" if first else ""
    if kind == "gib":
        return f"{d / 2**30:+.2f} GiB{rel}"
    if kind == "latency":
        sign = "+" if d >= 0 else "-"
        return f"{sign}{format_latency(abs(d))}{rel}"
    if kind == "score":
        return f"{d:+.3f}"
    if kind == "rate":
        return f"{d:+,.1f}{rel}"
    return f"{d:+,.0f}"


def comparison(runs: Sequence[Any], labels: Sequence[str]) -> pd.DataFrame | None:
    """Runs side by side with their differences from the first (module doc): columns
    ``metric``, ``key``, then per run its label (the value as text) and, after the first,
    ``Δ <label>``; a ``value:<label>`` column per run keeps the number.  None for fewer
    than two runs."""
    if len(runs) < 2:
        return None
    summaries = [dict(getattr(r, "summary", None) or {}) for r in runs]
    metrics = list(METRICS) + [
        (f"failed_{c}_requests", f"failed: {c}", "count") for c in FAILURE_CODES
        if any(_value(s, f"failed_{c}_requests") > 0 for s in summaries)]
    rows = []
    for key, label, kind in metrics:
        values = [_value(s, key) for s in summaries]
        if all(math.isnan(v) for v in values):
            continue
        row: dict[str, Any] = {"metric": label, "key": key}
        for i, (name, v) in enumerate(zip(labels, values)):
            row[name] = _text(v, kind)
            row[f"value:{name}"] = v
            if i:
                row[f"Δ {name}"] = _delta(v, values[0], kind)
        rows.append(row)
    return pd.DataFrame(rows)


def _getter(r: dict[str, Any]) -> Any:
    """``num(key)``: the row's cell as a float (NaN when absent or not a number)."""
    def num(key: str) -> float:
        v = r.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan

    return num


CARD_COLUMNS = (("gpu", "card"), ("verdict", "verdict"), ("context", "context × parallel"),
                ("ttft", "TTFT p95"), ("itl", "ITL p95"), ("memory", "peak memory"),
                ("risk", "OOM risk"), ("sessions", "max sessions"), ("price", "USD / session"),
                ("flags", "launch flags"))


def card_rows(compare: pd.DataFrame | None) -> list[dict[str, str]]:
    """One dict of texts per card (keys of :data:`CARD_COLUMNS`) from a GPU comparison
    table (kvsim.plan.compare.COMPARE_COLUMNS; absent columns read '-')."""
    if compare is None or not len(compare):
        return []
    out = []
    for r in compare.to_dict("records"):
        num = _getter(r)
        feasible = bool(r.get("feasible"))
        lo, hi = num("ttft_p95_s_low"), num("ttft_p95_s_high")
        both = not (math.isnan(lo) or math.isnan(hi))
        ci = f" (CI {format_latency(lo)}–{format_latency(hi)})" if both else ""
        risk = num("oom_risk")
        out.append({
            "gpu": str(r.get("gpu", "")),
            "verdict": str(r.get("verdict") or ("meets every target" if feasible
                                                else "nothing on the grid meets every target")),
            "context": f"{int(num('best_context_tokens')):,} × {int(num('best_parallel'))}"
            if feasible else "-",
            "ttft": format_latency(num("ttft_p95_s")) + ci if feasible else "-",
            "itl": format_latency(num("itl_p95_s")) if feasible else "-",
            "memory": f"{num('peak_device_fraction'):.0%}" if feasible else "-",
            "risk": (f"{risk:.2g} ({num('oom_risk_low'):.0%}–{num('oom_risk_high'):.0%})"
                     if not math.isnan(risk) else "-"),
            "sessions": "-" if math.isnan(num("max_parallel"))
            else f"{int(num('max_parallel'))}",
            "price": "-" if math.isnan(num("usd_per_session"))
            else f"{num('usd_per_session'):,.0f}",
            "flags": str(r.get("flags") or "-")})
    return out
