"""Compare measured Results (``kvsim replay``) with predicted ones (``kvsim simulate``).

:func:`compare_results` is what ``kvsim compare MEASURED PREDICTED`` prints: one row per metric
(TTFT/E2E/ITL percentiles, token and request totals, ``*_match`` shares) with the measured and
predicted value, the error (predicted − measured) and the relative error (error / measured).
:func:`compare_requests` gives the per-request join behind the ``*_match`` rows. Only requests
that ended count (:func:`kvsim.metrics.summary.ended`).

NOTE: both sides are read from their tables, not their summaries; only the calibrated spreads
(``itl_spread``, ``ttft_spread``) come from the summary (:mod:`kvsim.metrics.spread`).
Design: docs/design/calibration.md (every row's definition).
"""

from __future__ import annotations

import math

import pandas as pd

from kvsim.metrics.results import Results
from kvsim.metrics.spread import spread_quantiles, with_spread
from kvsim.metrics.summary import ended, itl_runs, percentiles, read_prompt_tokens

QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
TOTALS = ("prompt_tokens", "cached_tokens", "computed_prompt_tokens", "output_tokens")


def _metrics(r: Results) -> dict[str, float]:
    req, itl = ended(r.requests, r.itl)
    # NOTE: a failed request's e2e_s is NaN (both sides); the prediction's calibrated
    # prefill spread, when it had one, widens its TTFTs as in its summary
    ttft = with_spread(req["ttft_s"], r.summary.get("ttft_spread") or ())
    out: dict[str, float] = {**percentiles("ttft", pd.Series(ttft)),
                             **percentiles("e2e", req["e2e_s"])}
    # exact over affine runs (gap_delta_s) and run-length rows; a prediction made with a
    # calibrated step-time spread carries it (recorded in its summary)
    vals = spread_quantiles(*itl_runs(itl), r.summary.get("itl_spread") or (),
                            [q for _, q in QUANTILES])
    for (k, _), v in zip(QUANTILES, vals):
        out[f"itl_{k}_s"] = v
    out["requests"] = float(len(req))
    out["failed_requests"] = float(req["failed"].astype(bool).sum())
    for col in TOTALS:
        out[col] = float(read_prompt_tokens(req).sum() if col == "prompt_tokens"
                         else req[col].sum())
    return out


def compare_requests(measured: Results, predicted: Results) -> pd.DataFrame:
    """Per request: measured vs predicted prompt tokens read (:func:`read_prompt_tokens`),
    cached and computed prompt tokens, and failure."""
    cols = ["request_id", "prompt_tokens", "cached_tokens", "computed_prompt_tokens", "failed"]

    def side(r: Results) -> pd.DataFrame:
        return r.requests.assign(prompt_tokens=read_prompt_tokens(r.requests))[cols] \
            .set_index("request_id")

    m, p = side(measured), side(predicted)
    j = m.join(p, how="outer", suffixes=("_measured", "_predicted"))
    for c in ("cached_tokens", "computed_prompt_tokens", "prompt_tokens"):
        j[f"{c}_equal"] = j[f"{c}_measured"] == j[f"{c}_predicted"]
    return j.reset_index()


def check_pair(measured: Results, predicted: Results) -> list[str]:
    """Notes on a pair that is not one workload measured and predicted: their
    ``request_id`` sets differ (the percentiles and totals then compare two workloads,
    and the ``*_match`` rows cover only the requests in both), MEASURED is not a
    ``kvsim replay`` result, PREDICTED not a ``kvsim simulate`` one, or either side
    stopped before every request ended (a replay whose server died, a cut-short run)."""
    m_ids = set(measured.requests["request_id"].astype(str))
    p_ids = set(predicted.requests["request_id"].astype(str))
    notes = []
    if m_ids != p_ids:
        notes.append(f"MEASURED and PREDICTED hold different requests ({len(m_ids - p_ids)} "
                     f"only in MEASURED, {len(p_ids - m_ids)} only in PREDICTED: another "
                     f"trace, seed or sample): percentiles and totals compare two workloads, "
                     f"the *_match rows cover the {len(m_ids & p_ids)} requests in both")
    if measured.source != "measured":
        notes.append(f"MEASURED is a {measured.source} result, not a kvsim replay: the "
                     "errors below are between two predictions")
    if predicted.source != "simulated":
        notes.append(f"PREDICTED is a {predicted.source} result, not a kvsim simulate")
    for side, r in (("MEASURED", measured), ("PREDICTED", predicted)):
        n = int(r.summary.get("unfinished_requests") or 0)
        if n:
            why = r.summary.get("stopped_reason") or "it was cut short"
            notes.append(f"{side} stopped early ({why}) with {n} unfinished requests: only "
                         "the requests that ended are compared")
    return notes


def compare_results(measured: Results, predicted: Results) -> pd.DataFrame:
    """One row per metric: measured, predicted, error and relative error."""
    mm, pp = _metrics(measured), _metrics(predicted)
    rows = [(k, mm[k], pp[k]) for k in mm]
    per = compare_requests(measured, predicted)
    # NOTE: a request missing on one side has no count to match: the share is over both
    per = per[per["prompt_tokens_measured"].notna() & per["prompt_tokens_predicted"].notna()]
    n = len(per)
    for c in ("cached_tokens", "computed_prompt_tokens"):
        share = float(per[f"{c}_equal"].sum()) / n if n else math.nan
        rows.append(((f"{c.removesuffix('_prompt_tokens').removesuffix('_tokens')}"
                     "_tokens_match"), 1.0, share))
    df = pd.DataFrame(rows, columns=["metric", "measured", "predicted"])
    df["error"] = df["predicted"] - df["measured"]
    df["rel_error"] = df["error"] / df["measured"].where(df["measured"] != 0)
    return df
