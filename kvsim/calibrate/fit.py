"""Fit the calibrated step-time model to measured timing points.

Each :class:`~kvsim.latency.artifact.TimingPoint` contributes one row: its summed
step features (:func:`~kvsim.latency.artifact.point_features`) and its measured time.
Coefficients are found by bounded linear least squares (``scipy.optimize.lsq_linear``,
all coefficients ≥ 0 so no fitted cost is negative) on *relative* residuals — every row
is divided by its measured time — because step times span orders of magnitude and the
quantity users care about (MAPE) is relative.

The KV knee (``LatencyFit.kv_knee_tokens``): a decode step's cost per KV token read
can rise once the step reads more than some amount — measured on llama-server's CPU
backend, four slots at 512 tokens took 5.1 ms a step where the straight line through the
smaller points gave 4.1 (docs/design/calibration.md). The knee is searched over the
decode points' own per-step KV sizes (and the midpoints between them), then refined
between the best one's neighbours; the knee whose fit leaves the least relative error is
kept if it lowers that error by more than noise would (an F test of the two extra
parameters, p < 0.01), else none.

NOTE: the fit error is reported in-sample over the same points (MAPE and worst APE);
the validity range is the per-step feature range those points covered, which is what
the calibrated latency model clamps to (or refuses outside of).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from itertools import pairwise

import numpy as np
from scipy.optimize import lsq_linear, minimize_scalar

from kvsim.errors import InputError
from kvsim.latency.artifact import (
    FEATURES,
    FeatureRange,
    LatencyFit,
    TimingPoint,
    decode_step_kv,
    kv_spill,
    point_features,
    point_step_ranges,
)


def fit_one(points: list[TimingPoint], small_chunk_tokens: int = 0) -> LatencyFit:
    """Fit one cache dtype's points (all of the same ``cache_type``); prefill chunks
    shorter than ``small_chunk_tokens`` get their own attention coefficient, decode KV
    beyond the best knee (module doc) its own per-token cost."""
    if not points:
        raise InputError("points", 0, "at least one timing point is needed to fit")
    t = np.array([p.measured_s for p in points])
    coef, knee = _best_knee(points, t, small_chunk_tokens)
    x = np.array([point_features(p, small_chunk_tokens, knee) for p in points])
    ape = np.abs(x @ coef - t) / t
    return LatencyFit(
        cache_type=points[0].cache_type,
        coefficients_s={name: float(v) for name, v in zip(FEATURES, coef)},
        mape=float(ape.mean()), max_ape=float(ape.max()), points=len(points),
        valid=_valid_ranges(points, small_chunk_tokens, knee),
        max_context=max(p.context + (p.steps - 1 if p.kind == "decode" else p.tokens)
                        for p in points),
        max_batch=max(p.batch for p in points), small_chunk_tokens=small_chunk_tokens,
        kv_knee_tokens=knee)


MIN_GAIN = 1e-9
"""A knee is kept only if it lowers the fit's cost (half the sum of squared relative
errors) by more than this: on points a straight line fits, rounding decides nothing."""
EXACT_RSS = 1e-9
"""A knee fit whose sum of squared relative errors is at most this fits its points
exactly: no noise is left to test it against (:func:`_knee_pays`)."""


def knee_candidates(points: list[TimingPoint]) -> list[int]:
    """The KV knees tried (module doc): every decode point's first and last per-step KV
    size and the midpoints between neighbours, strictly inside their range (a knee at
    or below every step's KV would only restate ``decode_kv``)."""
    sizes = sorted({int(v) for p in points if p.kind == "decode"
                    for v in decode_step_kv(p)[[0, -1]]})
    mids = [(a + b) // 2 for a, b in pairwise(sizes)]
    return sorted({k for k in sizes + mids if sizes[0] < k < sizes[-1]})


def _best_knee(points: list[TimingPoint], t: np.ndarray, small_chunk_tokens: int
               ) -> tuple[np.ndarray, int]:
    """The coefficients and knee of the least cost (0: none): the best candidate, then
    refined between its neighbours (``scipy.optimize.minimize_scalar``, bounded), kept
    only where it pays (:func:`_knee_pays`)."""
    base = np.array([point_features(p, small_chunk_tokens) for p in points])
    kv = [decode_step_kv(p) for p in points]

    def solve(knee: int) -> tuple[np.ndarray, float, int]:
        x = base.copy()
        x[:, -1] = [kv_spill(k, knee).sum() for k in kv]
        return (*_solve(x, t), knee)

    best = line = solve(0)
    cands = knee_candidates(points)
    at = -1
    for i, knee in enumerate(cands):
        trial = solve(knee)
        if trial[1] < best[1] - MIN_GAIN and trial[0][-1] > 0:
            best, at = trial, i
    if at >= 0:
        lo, hi = cands[max(at - 1, 0)], cands[min(at + 1, len(cands) - 1)]
        res = minimize_scalar(lambda k: solve(round(k))[1], bounds=(lo, hi),
                              method="bounded", options={"xatol": 0.5})
        trial = solve(round(res.x))
        if trial[1] < best[1] and trial[0][-1] > 0:
            best = trial
    if best[2] and not _knee_pays(points, line[1], best):
        best = line
    return best[0], best[2]


KNEE_ALPHA = 0.01
"""A knee must lower the residuals more than noise would with this probability (the
nested-model F test of :func:`_knee_pays`)."""


def _knee_pays(points: list[TimingPoint], line_cost: float,
               knee_fit: tuple[np.ndarray, float, int]) -> bool:
    """Whether the knee's two extra parameters (its place and its cost) lower the sum of
    squared relative errors by more than noise would: an F test of the knee fit against
    the straight line (``scipy.stats.f``, p < :data:`KNEE_ALPHA`).  Points the knee fits
    exactly keep it (no noise to test against).

    NOTE: the knee is searched for, so the test's p is optimistic (Davies' problem);
    the small alpha allows for it."""
    from scipy.stats import f as f_dist

    rss_line, rss_knee = 2 * line_cost, 2 * knee_fit[1]
    params = int(np.count_nonzero(knee_fit[0])) + 1
    dof = len(points) - params
    if rss_knee <= EXACT_RSS:
        return True
    if dof <= 0:
        return False
    stat = ((rss_line - rss_knee) / 2) / (rss_knee / dof)
    return bool(f_dist.sf(stat, 2, dof) < KNEE_ALPHA)


def _solve(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares of times ``t`` on features ``x``, on relative
    residuals: (coefficients, cost)."""
    # NOTE: normalise columns so the solver sees comparable magnitudes; undo afterwards.
    col = np.abs(x).max(axis=0)
    col[col == 0] = 1.0
    res = lsq_linear((x / col) / t[:, None], np.ones_like(t), bounds=(0.0, np.inf),
                     method="bvls")
    return res.x / col, float(res.cost)


def _valid_ranges(points: list[TimingPoint], small_chunk_tokens: int, knee: int
                  ) -> dict[str, FeatureRange]:
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for p in points:
        for name, (a, b) in point_step_ranges(p, small_chunk_tokens, knee).items():
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
