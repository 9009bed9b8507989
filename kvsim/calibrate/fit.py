"""Fit the calibrated step-time model to measured timing points.

Each :class:`~kvsim.latency.artifact.TimingPoint` contributes one row: its summed
step features (:func:`~kvsim.latency.artifact.point_features`) and its measured time.
Coefficients are found by bounded linear least squares (``scipy.optimize.lsq_linear``,
all coefficients ≥ 0 so no fitted cost is negative) on *relative* residuals — every row
is divided by its measured time — because step times span orders of magnitude and the
quantity users care about (MAPE) is relative.

NOTE: the fit error is reported in-sample over the same points (MAPE and worst APE);
the validity range is the per-step feature range those points covered, which is what
the calibrated latency model clamps to (or refuses outside of).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np
from scipy.optimize import lsq_linear

from kvsim.errors import InputError
from kvsim.latency.artifact import (
    FEATURES,
    FeatureRange,
    LatencyFit,
    TimingPoint,
    point_features,
    point_step_ranges,
)


def fit_one(points: list[TimingPoint], small_chunk_tokens: int = 0) -> LatencyFit:
    """Fit one cache dtype's points (all of the same ``cache_type``); prefill chunks
    shorter than ``small_chunk_tokens`` get their own attention coefficient."""
    if not points:
        raise InputError("points", 0, "at least one timing point is needed to fit")
    x = np.array([point_features(p, small_chunk_tokens) for p in points])
    t = np.array([p.measured_s for p in points])
    scale = 1.0 / t
    # NOTE: normalise columns so the solver sees comparable magnitudes; undo afterwards.
    col = np.abs(x).max(axis=0)
    col[col == 0] = 1.0
    res = lsq_linear((x / col) * scale[:, None], np.ones_like(t), bounds=(0.0, np.inf),
                     method="bvls")
    coef = res.x / col
    ape = np.abs(x @ coef - t) / t
    return LatencyFit(
        cache_type=points[0].cache_type,
        coefficients_s={name: float(v) for name, v in zip(FEATURES, coef)},
        mape=float(ape.mean()), max_ape=float(ape.max()), points=len(points),
        valid=_valid_ranges(points, small_chunk_tokens),
        max_context=max(p.context + (p.steps - 1 if p.kind == "decode" else p.tokens)
                        for p in points),
        max_batch=max(p.batch for p in points), small_chunk_tokens=small_chunk_tokens)


def _valid_ranges(points: list[TimingPoint], small_chunk_tokens: int
                  ) -> dict[str, FeatureRange]:
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for p in points:
        for name, (a, b) in point_step_ranges(p, small_chunk_tokens).items():
            if (p.kind == "prefill") != name.startswith("prefill"):
                continue  # a decode point says nothing about the prefill range
            lo[name] = min(lo.get(name, a), a)
            hi[name] = max(hi.get(name, b), b)
    out = {}
    for name in FEATURES[1:]:
        out[name] = FeatureRange(min=lo.get(name, 0.0), max=hi.get(name, 0.0))
    return out


def fit_points(points: Iterable[TimingPoint], small_chunk_tokens: int = 0
               ) -> dict[str, LatencyFit]:
    """Fit every cache dtype present in ``points``."""
    by_type: dict[str, list[TimingPoint]] = defaultdict(list)
    for p in points:
        by_type[p.cache_type].append(p)
    return {k: fit_one(v, small_chunk_tokens) for k, v in sorted(by_type.items())}
