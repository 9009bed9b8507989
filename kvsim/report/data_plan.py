"""Pure data functions for the planning figures: plan grid, GPU comparison,
policy comparison and sweeps (no Plotly here).

The tables come from ``kvsim.plan`` and from several runs side by side
(``kvsim compare``).  The columns each function expects are listed in its docstring; that
list is the contract with the planning code.  Absent optional columns are simply
not shown; an absent required column raises :class:`kvsim.errors.InputError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvsim.errors import InputError
from kvsim.metrics.accuracy import recall_measured
from kvsim.report.data_recall import recall_overall
from kvsim.report.data_run import nonempty
from kvsim.report.labels import run_labels

PLAN_REQUIRED = ("context_tokens", "parallel", "feasible", "binding", "peak_device_fraction")
COMPARE_REQUIRED = ("gpu", "feasible", "best_parallel", "best_context_tokens")
POLICY_REQUIRED = ("label",)
POLICY_METRICS = ("peak_device_bytes", "peak_kv_allocated_bytes", "ttft_p95_s", "itl_p95_s",
                  "accuracy_mean", "accuracy_worst", "accuracy_below_half")
# summary.json keys of each POLICY_METRICS column, first found wins (kvsim.metrics.accuracy)
SUMMARY_KEYS = {"accuracy_mean": ("accuracy_mean", "recall_mean"),
                "accuracy_worst": ("accuracy_worst", "recall_worst"),
                "accuracy_below_half": ("accuracy_below_half", "recall_share_below_0_5")}
SWEEP_METRICS = ("ttft_p95_s", "itl_p95_s", "peak_device_fraction", "oom_risk",
                 "accuracy_mean", "tokens_per_s", "failed_requests")
# short cell labels for binding constraints
BINDING_SHORT = {"ttft_p95": "TTFT", "itl_p95": "ITL", "device_fraction": "MEM",
                 "oom_risk": "OOM", "recall": "ACC", "failed": "FAIL", "load": "LOAD",
                 "offload": "SPILL", "config": "CONF", "kv_pool": "POOL"}


def require_columns(df: pd.DataFrame, needed: Sequence[str], table: str) -> None:
    """Raise a one-line InputError naming every missing column of ``table``."""
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise InputError(f"{table} table", ", ".join(missing),
                         f"missing column(s); expected {', '.join(needed)}")


def plan_grids(plan: pd.DataFrame | None) -> list[dict[str, Any]]:
    """Context × parallel grids of the plan points, one per (kv_dtype, policy).

    Expected columns of the plan table (one row per point tried):
    ``context_tokens`` (int), ``parallel`` (int), ``feasible`` (bool), ``binding`` (str:
    the violated constraint that decided infeasibility — ``ttft_p95``, ``itl_p95``,
    ``device_fraction``, ``oom_risk``, ``recall``, ``failed``…; "" when feasible),
    ``peak_device_fraction`` (float); optional ``kv_dtype``, ``policy`` (grouping),
    ``ttft_p95_s``, ``itl_p95_s``, ``oom_risk``, ``accuracy_mean`` (hover).

    Each grid: ``label``, ``group`` (its kv_dtype / policy values), ``contexts,
    parallels`` (sorted axis values), ``fraction``,
    ``feasible`` (float 1/0, NaN = not tried) and ``binding`` (str) as
    (len(contexts), len(parallels)) arrays, plus ``hover`` strings.
    """
    if not nonempty(plan):
        return []
    require_columns(plan, PLAN_REQUIRED, "plan")
    keys = [c for c in ("kv_dtype", "policy") if c in plan.columns]
    groups = plan.groupby(keys, sort=False, dropna=False) if keys else [((), plan)]
    grids = []
    for key, sub in groups:
        key = key if isinstance(key, tuple) else (key,)
        contexts = np.sort(sub["context_tokens"].unique())
        parallels = np.sort(sub["parallel"].unique())
        shape = (len(contexts), len(parallels))
        fraction = np.full(shape, np.nan)
        feasible = np.full(shape, np.nan)
        binding = np.full(shape, "", dtype=object)
        hover = np.full(shape, "not tried", dtype=object)
        ci = {v: i for i, v in enumerate(contexts)}
        pj = {v: j for j, v in enumerate(parallels)}
        for r in sub.to_dict("records"):
            i, j = ci[r["context_tokens"]], pj[r["parallel"]]
            fraction[i, j] = float(r["peak_device_fraction"])
            feasible[i, j] = 1.0 if bool(r["feasible"]) else 0.0
            binding[i, j] = "" if bool(r["feasible"]) else str(r["binding"] or "?")
            hover[i, j] = _plan_hover(r)
        label = " · ".join(f"{k}={v}" for k, v in zip(keys, key)
                           if pd.notna(v) and v != "") or "plan"
        grids.append({"label": label, "contexts": contexts, "parallels": parallels,
                      "fraction": fraction, "feasible": feasible, "binding": binding,
                      "hover": hover, "group": dict(zip(keys, key))})
    return grids


def _plan_hover(r: dict[str, Any]) -> str:
    parts = [f"context {int(r['context_tokens'])} × parallel {int(r['parallel'])}",
             f"peak device {100 * float(r['peak_device_fraction']):.1f}%",
             "feasible" if bool(r["feasible"]) else f"binding: {r['binding']}"]
    for col, fmt in (("ttft_p95_s", "mean TTFT p95 {:.3g} s"), ("itl_p95_s", "mean ITL p95 {:.3g} s"),
                     ("oom_risk", "OOM risk {:.3g}"), ("accuracy_mean", "recall {:.3g}")):
        if col in r and pd.notna(r[col]):
            parts.append(fmt.format(float(r[col])))
    return "<br>".join(parts)


def binding_label(binding: str) -> str:
    """Short cell label for a binding constraint (first 4 letters when unknown)."""
    return BINDING_SHORT.get(binding, binding[:4].upper())


def gpu_comparison(compare: pd.DataFrame | None) -> pd.DataFrame | None:
    """GPU comparison rows, in the given order.

    Expected columns: ``gpu`` (str), ``feasible`` (bool), ``best_parallel`` (int,
    0 when nothing is feasible), ``best_context_tokens`` (int); optional
    ``kv_dtype``, ``price_usd``, ``usd_per_session`` (price / feasible concurrent
    sessions), ``ttft_p95_s``, ``itl_p95_s``, ``peak_device_fraction``, ``oom_risk``,
    ``oom_risk_low``, ``oom_risk_high``.
    """
    if not nonempty(compare):
        return None
    require_columns(compare, COMPARE_REQUIRED, "compare")
    out = compare.reset_index(drop=True).copy()
    out["gpu"] = out["gpu"].astype(str)
    sessions_col = "max_parallel" if "max_parallel" in out.columns else "best_parallel"
    if "usd_per_session" not in out.columns and "price_usd" in out.columns:
        sessions = out[sessions_col].where(out["feasible"].astype(bool) & (
            out[sessions_col] > 0))
        out["usd_per_session"] = out["price_usd"] / sessions
    return out


def runs_table(results: Sequence[Any]) -> pd.DataFrame | None:
    """Side-by-side summary of several runs (the policy comparison table).

    One row per run: ``label`` (:func:`kvsim.report.labels.run_labels`: the scenario
    name, and what differs where runs share it), then every metric of
    ``POLICY_METRICS`` found in the run's summary (under the keys of
    :data:`SUMMARY_KEYS`); accuracy falls back to the run's ``references`` table
    (mean / worst / share < 0.5 over all events).
    """
    if len(results) < 2:
        return None
    rows = []
    for res, label in zip(results, run_labels(results)):
        summary = getattr(res, "summary", None) or {}
        row: dict[str, Any] = {"label": label}
        for m in POLICY_METRICS:
            # NOTE: a recall score is null (NaN once loaded) without reference events
            # (older folders: 1.0 beside 0 events): recall_measured
            if m in SUMMARY_KEYS:
                value = next((summary[k] for k in SUMMARY_KEYS[m]
                              if recall_measured(summary, k)), None)
            else:
                value = None if pd.isna(summary.get(m)) else summary[m]
            if value is not None:
                row[m] = float(value)
        overall = recall_overall(getattr(res, "references", None))
        if "accuracy_mean" not in row and overall is not None:
            row.update(accuracy_mean=overall["mean"], accuracy_worst=overall["worst"],
                       accuracy_below_half=overall["below_half"])
        rows.append(row)
    return pd.DataFrame(rows)


def policy_comparison(table: pd.DataFrame | None) -> pd.DataFrame | None:
    """Policy comparison: ``label`` plus the metric columns of ``POLICY_METRICS`` present.

    Expected columns: ``label`` (policy / run name) and any of
    ``peak_device_bytes, peak_kv_allocated_bytes, ttft_p95_s, itl_p95_s,
    accuracy_mean, accuracy_worst, accuracy_below_half``.  ``None`` when fewer than
    two rows or no metric column.
    """
    if not nonempty(table) or len(table) < 2:
        return None
    require_columns(table, POLICY_REQUIRED, "policy comparison")
    metrics = [m for m in POLICY_METRICS if m in table.columns and table[m].notna().any()]
    if not metrics:
        return None
    out = table[["label", *metrics]].reset_index(drop=True).copy()
    out["label"] = out["label"].astype(str)
    return out


def sweep_dimensions(sweep: pd.DataFrame | None) -> dict[str, Any] | None:
    """Parallel-coordinates dimensions of a sweep table.

    Expected: one row per scenario; factor columns are the columns between ``point``
    and ``scenario_hash`` (``kvsim.plan.sweep.combined_table``), or else those named
    by a dotted scenario key (``engine.parallel``); metric columns are summary
    keys (``ttft_p95_s``, ``itl_p95_s``, ``peak_device_fraction``, ``oom_risk``,
    ``accuracy_mean``, ``tokens_per_s``, ``failed_requests``).  Non-numeric factors are
    coded 0..k-1 with their values as tick labels.
    """
    if not nonempty(sweep):
        return None
    cols = list(sweep.columns)
    if "point" in cols and "scenario_hash" in cols:  # kvsim.plan.sweep.combined_table
        factors = cols[cols.index("point") + 1: cols.index("scenario_hash")]
    else:
        factors = [c for c in cols if "." in c]
    metrics = [c for c in SWEEP_METRICS if c in sweep.columns and sweep[c].notna().any()]
    if not factors or not metrics:
        return None
    dims = []
    for c in [*factors, *metrics]:
        col = sweep[c]
        if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            dims.append({"label": c, "values": col.to_numpy(dtype=float)})
        else:
            # NOTE: a listed sweep may set a key in some points only: those read "(unset)"
            # (pandas' astype(str) keeps NaN, which does not sort among strings)
            text = col.map(lambda v: "(unset)" if v is None or v != v else str(v))
            cats = sorted(text.unique())
            code = {v: i for i, v in enumerate(cats)}
            dims.append({"label": c, "values": text.map(code).to_numpy(dtype=float),
                         "tickvals": list(range(len(cats))), "ticktext": cats})
    color = sweep[metrics[0]].to_numpy(dtype=float)
    return {"dimensions": dims, "color": color, "color_label": metrics[0], "rows": len(sweep)}
