"""A plan's answer in words: the verdict, the nearest miss, and rows that come out equal.

- :func:`plan_verdict`: the recommended point and why it meets every target (pooled p95
  with its interval and the requests it rests on, memory, OOM risk with its Wilson
  interval, the tightest constraint) — or, when nothing is feasible, the **nearest
  miss** (the point whose binding constraint is least violated) and what would help;
- :func:`identical_rows`: simulated points whose latencies and failures are the same,
  and why — the workload never had more requests at once than the smallest
  ``parallel`` among them, and no request needed more tokens than the smallest session
  among them may hold (the rows' ``peak_concurrent_requests``,
  ``longest_request_tokens`` and ``session_tokens``, :mod:`kvsim.plan.point_row`).
Design: docs/design/answers.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from kvsim.config.units import format_latency
from kvsim.metrics.failures import CODE_KIND, CODE_WORDS
from kvsim.plan.advice import MIN_REQUESTS, binding_words, format_limit
from kvsim.plan.point_row import FAILURE_COLUMNS
from kvsim.plan.slo import Constraints

SIMULATED = ("simulated", "pruned+simulated")
MEMORY = ("load", "offload", "device_fraction", "kv_pool")


def _f(v: Any) -> float:
    """A cell as a float (NaN for None, NA or text)."""
    return float(v) if isinstance(v, int | float | np.number) and not isinstance(v, bool) \
        else math.nan


def _point(r: Any) -> str:
    return f"context {int(r['context_tokens']):,} × parallel {int(r['parallel'])}" + (
        f" (kv {r['kv_dtype']})" if r.get("kv_dtype") else "")


def _latency(r: Any, key: str) -> str:
    v = _f(r.get(key))
    if math.isnan(v):
        return "-"
    lo, hi = _f(r.get(f"{key}_low")), _f(r.get(f"{key}_high"))
    both = not (math.isnan(lo) or math.isnan(hi))
    ci = f" (95 % CI {format_latency(lo)}–{format_latency(hi)})" if both else ""
    return format_latency(v) + ci


def _targets(r: Any, c: Constraints) -> str:
    parts = []
    for b in c.latency:
        metric, pct = b.name.split("_")
        v = _f(r.get(b.key))
        mark = "≤" if not math.isnan(v) and v <= b.limit_s else ">"
        parts.append(f"{metric.upper()} {pct} {_latency(r, b.key)} {mark} "
                     f"{format_limit(b.limit_s)}")
    n = _f(r.get("latency_requests"))
    pooled = r.get("p95_pooled")
    if isinstance(pooled, bool | np.bool_) and pooled and not math.isnan(n) and n:
        runs = int(r["replications"])
        parts.append(f"pooled over {int(n):,} requests of {runs} run{'s' if runs != 1 else ''}")
    frac = _f(r.get("peak_device_fraction"))
    parts.append(f"peak {frac:.0%} of device memory (line {c.max_device_fraction:.0%})")
    risk, lo, hi = (_f(r.get(k)) for k in ("oom_risk", "oom_risk_low", "oom_risk_high"))
    if not math.isnan(risk):
        parts.append(f"OOM risk {risk:.2g} (95 % CI {lo:.0%}–{hi:.0%})")
    return "; ".join(parts)


def _failures(r: Any) -> str:
    """The failed requests per run by code, and what the too-long ones mean."""
    codes = {col[7:-9]: r[col] for col in FAILURE_COLUMNS
             if col in r and r[col] == r[col] and r[col] > 0}
    if not codes:
        return ""
    text = "failed requests per run: " + ", ".join(f"{n:.3g} {c}" for c, n in codes.items())
    if all(CODE_KIND[c] == "too_long" for c in codes):
        text += " (longer than one session's context: no OOM, no target; a larger context " \
            "serves them)"
    return text


def nearest_miss(table: pd.DataFrame) -> dict[str, Any] | None:
    """The infeasible point whose binding constraint is least violated (simulated points
    first: a memory wall is no near miss when some point ran)."""
    if table.empty or "binding_slack" not in table:
        return None
    bad = table[~table["feasible"].astype(bool) & table["binding_slack"].notna()
                & (table["binding"] != "config")]
    ran = bad[bad["evaluated"].isin(SIMULATED)]
    pool = ran if len(ran) else bad
    if pool.empty:
        return None
    return pool.loc[pool["binding_slack"].astype(float).idxmax()].to_dict()


def _help(r: dict[str, Any], table: pd.DataFrame) -> str:
    """What would help the nearest miss, from its binding constraint."""
    b = str(r.get("binding", ""))
    if b in MEMORY:
        return ("a smaller KV type (--kv q8_0, half the bytes) or a card with more memory "
                "(kvsim compare --gpus …)")
    if b == "oom_risk":
        codes = [col[7:-9] for col in FAILURE_COLUMNS
                 if r.get(col, 0) == r.get(col, 0) and (r.get(col) or 0) > 0
                 and CODE_KIND[col[7:-9]] == "memory"]
        what = ", ".join(f"{c} ({CODE_WORDS[c]})" for c in codes) or "KV memory"
        return f"runs failed for {what}: a larger context (pool) or a smaller KV type"
    if b == "recall":
        return "a policy that keeps more of the context (--policy none)"
    key = f"{b}_s"
    if key in table:
        ran = table[table["evaluated"].isin(SIMULATED) & table[key].notna()]
        if len(ran):
            best = ran.loc[ran[key].astype(float).idxmin()]
            return (f"every point on the grid misses it; the lowest {b.replace('_', ' ')} is "
                    f"{format_latency(best[key])} at {_point(best)}: fewer sessions at once, "
                    "smaller weights or a faster card (kvsim compare --gpus …)")
    return "a faster card or more memory (kvsim compare --gpus …)"


def plan_verdict(table: pd.DataFrame, rec: dict[str, Any] | None, c: Constraints
                 ) -> list[str]:
    """The verdict lines of a plan (module doc), the first one starting "verdict:"."""
    if rec is not None:
        f = _failures(rec)
        but = ", but some requests failed" if f else ""
        lines = [(f"verdict: {_point(rec)} meets every target{but} — {_targets(rec, c)}; "
                  f"tightest: {rec.get('tightest', '')}")]
        if f:
            lines.append(f)
        return lines + _few(rec)
    miss = nearest_miss(table)
    if miss is None:
        return ["verdict: nothing on the grid meets every target ("
                + "; ".join(c.describe()) + ") and no point could be judged"]
    b = str(miss.get("binding", ""))
    slack = _f(miss.get("binding_slack"))
    over = f" ({-slack:.1%} over)" if not math.isnan(slack) and slack > -math.inf else ""
    lines = [(f"verdict: nothing on the grid meets every target; nearest miss: {_point(miss)}"
              f" — binding {b} ({binding_words(b)}){over}: {_targets(miss, c)}"),
             f"what would help: {_help(miss, table)}"]
    if f := _failures(miss):
        lines.insert(1, f)
    return lines + _few(miss)


def _few(r: Any) -> list[str]:
    """A warning when the pooled p95 rests on fewer than :data:`MIN_REQUESTS` requests."""
    n = _f(r.get("latency_requests"))
    if math.isnan(n) or n >= MIN_REQUESTS:
        return []
    return [(f"the pooled p95 rests on {int(n)} requests (fewer than {MIN_REQUESTS}: it is "
             "one of the largest few); raise --replications or workload.days")]


def identical_rows(table: pd.DataFrame) -> list[str]:
    """One line per group of simulated points with equal latencies and failures, with
    why (module doc)."""
    cols = [c for c in ("ttft_p95_s", "itl_p95_s", "e2e_p95_s", "failed_requests")
            if c in table]
    if table.empty or "ttft_p95_s" not in cols:
        return []
    if "peak_concurrent_requests" not in table:  # NOTE: a runner without the workload's peaks
        return []
    ran = table[table["evaluated"].isin(SIMULATED) & table["ttft_p95_s"].notna()
                & table["peak_concurrent_requests"].notna()]
    out = []
    keys = [c for c in ("kv_dtype", "policy") if c in ran]
    for _, g in ran.groupby(keys + [ran[c].round(9) for c in cols], dropna=False):
        if len(g) < 2:
            continue
        pts = ", ".join(f"{int(r.context_tokens):,} × {int(r.parallel)}"
                        for r in g.itertuples())
        out.append(f"context × parallel {pts} give identical latency and failures: "
                   + _why_same(g))
    return out


def _why_same(g: pd.DataFrame) -> str:
    why = []
    conc = g["peak_concurrent_requests"].max() if "peak_concurrent_requests" in g else math.nan
    if not math.isnan(conc) and g["parallel"].min() >= conc:
        why.append(f"the workload never had more than {int(conc)} requests at once, and "
                   f"each of these serves at least {int(g['parallel'].min())}")
    longest = g["longest_request_tokens"].max() if "longest_request_tokens" in g else math.nan
    held = g["session_tokens"].min() if "session_tokens" in g else math.nan
    if not math.isnan(longest) and not math.isnan(held) and held > longest:
        why.append(f"no request needed more than {int(longest):,} tokens, and each lets one "
                   f"session hold at least {int(held):,}")
    return "; ".join(why) or "their requests ran the same way (the same steps, no failure " \
        "that differs): the larger settings only reserve more memory"
