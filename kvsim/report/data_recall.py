"""Pure data functions for the recall-proxy figures (docs/design/DESIGN.md §3.6; no Plotly here).

They read a run's ``references`` table (one row per scored reference event,
:mod:`kvsim.metrics.results`): ``session_id`` and ``score`` (the multiplier m in
[0, 1]) are required, ``outcome`` (INTACT, DEGRADED, RECOVERED, LOST, COLLAPSE) is
optional.  The proxy is reported per session: mean, worst, and the share of events
below 0.5, so "less memory" never hides "wrong answers".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

BELOW = 0.5  # docs/design/DESIGN.md §3.6: "share of events below 0.5"
DROPPED = ("LOST", "COLLAPSE")  # outcomes whose span is gone


def _usable(references: Any) -> bool:
    return isinstance(references, pd.DataFrame) and len(references) > 0 \
        and {"session_id", "score"} <= set(references.columns)


def accuracy_per_session(references: pd.DataFrame | None) -> pd.DataFrame | None:
    """Accuracy proxy per session from the reference-event table.

    Returns ``session_id, events, mean, worst, below_half`` (share of events with
    m < 0.5) and ``dropped`` (events LOST or COLLAPSE; 0 without an ``outcome``
    column), sorted by mean then worst, ascending (the worst sessions first).
    ``None`` without reference events.
    """
    if references is None or not _usable(references):
        return None
    outcome = references["outcome"].astype(str) if "outcome" in references.columns \
        else pd.Series("", index=references.index)
    score = references["score"].astype(float)
    ref = pd.DataFrame({"session_id": references["session_id"].astype(str), "score": score,
                        "_below": (score < BELOW).astype(float),
                        "_dropped": outcome.isin(DROPPED).astype(int)})
    g = ref.groupby("session_id", sort=False)
    out = pd.DataFrame({"events": g["score"].size(), "mean": g["score"].mean(),
                        "worst": g["score"].min(), "below_half": g["_below"].mean(),
                        "dropped": g["_dropped"].sum()})
    return out.reset_index().sort_values(["mean", "worst", "session_id"], kind="stable"
                                         ).reset_index(drop=True)


def recall_overall(references: pd.DataFrame | None) -> dict[str, float] | None:
    """Over all events: ``mean``, ``worst``, ``below_half`` and ``session_mean_worst``
    (the lowest session mean); the summary's ``recall_*`` keys for runs without them."""
    per = accuracy_per_session(references)
    if references is None or per is None:
        return None
    score = references["score"].astype(float)
    return {"mean": float(score.mean()), "worst": float(score.min()),
            "below_half": float((score < BELOW).mean()),
            "session_mean_worst": float(per["mean"].min())}


def session_recall_cdf(references: pd.DataFrame | None) -> dict[str, Any] | None:
    """Distribution of the per-session mean recall, to overlay several runs.

    ``x`` (sorted session means), ``p`` (share of sessions ≤ x), ``sessions`` (count),
    ``worst`` (the lowest session mean), ``below_half`` (share of sessions whose mean
    is below 0.5); ``None`` without reference events.
    """
    per = accuracy_per_session(references)
    if per is None:
        return None
    x = np.sort(per["mean"].to_numpy(dtype=float))
    return {"x": x, "p": np.arange(1, len(x) + 1) / len(x), "sessions": len(x),
            "worst": float(x[0]), "below_half": float((x < BELOW).mean())}
