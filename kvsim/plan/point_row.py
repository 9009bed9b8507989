"""One plan point's row and the estimates its SLOs are judged on.

A simulated point's latency percentiles are **pooled** over every request of its
replications, with a bootstrap interval over sessions (:meth:`ReplicationSet.latency`;
the mean of the runs' own when a runner gives summaries only); the other figures are
means (Student-t) or, for peaks, the largest run's.  Each failure code
(:mod:`kvsim.metrics.failures`) gets its own column (failed requests per run), and the
row keeps what the workload asked of the point (``peak_concurrent_requests``,
``longest_request_tokens``, largest over runs), which explains rows that come out
identical (:mod:`kvsim.plan.explain`).

NOTE: ``*_low``/``*_high`` are the interval's ends; ``latency_requests`` is how many
requests the pooled TTFT percentile rests on.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from kvsim.metrics.failures import FAILURE_CODES
from kvsim.plan.flags import engine_flags
from kvsim.plan.replicate import ReplicationSet
from kvsim.plan.slo import Constraints, Verdict, measured_recall
from kvsim.scenario import scenario_hash

LATENCY_KEYS = ("ttft_p95_s", "itl_p95_s", "e2e_p95_s", "ttft_p50_s", "itl_p50_s")
WORKLOAD_PEAKS = ("peak_concurrent_requests", "longest_request_tokens")
FAILURE_COLUMNS = tuple(f"failed_{c}_requests" for c in FAILURE_CODES)


def estimates(reps: ReplicationSet, c: Constraints, conservative: bool,
              static_fraction: float) -> dict[str, Any]:
    """The figures :func:`kvsim.plan.slo.judge` judges: the pooled latency percentiles
    (or their interval's upper end when ``conservative``), the peak device fraction, the
    OOM risk (or its Wilson upper end) and the recall (or its lower end)."""
    est: dict[str, Any] = {}
    for b in c.latency:
        iv = reps.latency(b.key)
        est[b.key] = iv.high if conservative else iv.estimate
    peak = reps.peak("peak_device_fraction")
    est["device_fraction"] = static_fraction if math.isnan(peak) else peak
    risk = reps.oom_risk()
    est["oom_risk"] = risk.high if conservative else risk.estimate
    if any(measured_recall(r.summary) for r in reps.runs):
        iv = reps.metric("recall_mean")
        est["recall"] = iv.low if conservative else iv.estimate
    return est


def point_row(p: Any, v: Verdict, how: str, reps: ReplicationSet | None,
              static_fraction: float, slo_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The plan table's row of point ``p`` (kvsim.plan.search._Point) judged ``v``."""
    row: dict[str, Any] = {
        "kv_dtype": p.kv or (p.scenario.engine.cache_type_k if p.scenario else ""),
        "policy": p.policy, "context_tokens": p.context, "parallel": p.parallel,
        "feasible": v.feasible, "binding": "" if v.feasible else v.binding,
        "tightest": v.binding, "evaluated": how, "verified": pd.NA,
        "static_device_fraction": static_fraction, "peak_device_fraction": static_fraction,
        "replications": 0, "scenario_hash": scenario_hash(p.scenario) if p.scenario else "",
        "notes": "; ".join(v.notes)}
    slack = {k.name: k.slack for k in v.checks}
    row["binding_slack"] = slack.get(v.binding, math.nan)
    row["session_tokens"] = getattr(p, "session_tokens", 0) or math.nan
    if reps is None:
        return row
    row["replications"] = reps.n
    row["p95_pooled"] = reps.pooled
    for key in dict.fromkeys((*LATENCY_KEYS, *slo_keys)):
        iv = reps.latency(key, interval=key in slo_keys or "_p95" in key)
        row[key], row[f"{key}_low"], row[f"{key}_high"] = iv.estimate, iv.low, iv.high
        if key == "ttft_p95_s" and reps.pooled:
            row["latency_requests"] = iv.n
    peak = reps.peak("peak_device_fraction")
    row["peak_device_fraction"] = static_fraction if math.isnan(peak) else peak
    risk = reps.oom_risk()
    row.update(oom_risk=risk.estimate, oom_risk_low=risk.low, oom_risk_high=risk.high,
               oom_count=sum(1 for r in reps.runs if r.oom_reason))
    row["oom_reasons"] = "; ".join(sorted({r.oom_reason for r in reps.runs if r.oom_reason}))
    row["failed_requests"] = reps.metric("failed_requests").estimate
    row.update({f"failed_{c}_requests": n for c, n in reps.failures().items()})
    for key in WORKLOAD_PEAKS:
        row[key] = reps.peak(key)
    if any(measured_recall(r.summary) for r in reps.runs):
        row["accuracy_mean"] = reps.metric("recall_mean").estimate
    row["flags"] = engine_flags(p.scenario) if p.scenario else ""
    return row
