"""Inter-token percentiles with a calibrated step-time spread.

A simulated gap ``g`` stands for ``g·J``, ``J`` drawn from the measured ratios
(``LatencyFit.decode_spread``), independent of ``g``; the percentiles are those of that
product distribution, computed (quantiles × spread quantiles, ``inverted_cdf``), not sampled,
so a run stays deterministic. TTFT likewise with ``LatencyFit.prefill_spread``
(:func:`with_spread`).

NOTE: only the reported percentiles and mean carry the spread; the ``itl`` and ``requests``
tables and the timeline keep the simulated values. The mean is the simulated mean times the
spread's mean.
Design: docs/design/calibration.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kvsim.metrics import gaps

RESOLUTION = 1024
RUN_POINTS = 16
EXPAND_MAX = 1 << 20


def _weighted_values(g: np.ndarray, d: np.ndarray, n: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Every gap (weight 1) up to EXPAND_MAX gaps; beyond, each run as at most
    RUN_POINTS evenly spaced gaps, each weighted n / points."""
    if int(n.sum()) <= EXPAND_MAX:
        vals = gaps.expand(g, d, n)
        return vals, np.ones_like(vals)
    m = np.minimum(n, RUN_POINTS)
    starts = np.cumsum(m) - m
    j = np.arange(int(m.sum()), dtype=np.int64) - np.repeat(starts, m)
    mm = np.repeat(m, m)
    nn = np.repeat(n, m)
    # the j-th of m points sits at index round(j·(n−1)/(m−1)) of its run
    k = np.where(mm > 1, np.rint(j * (nn - 1) / np.maximum(mm - 1, 1)), 0)
    return np.repeat(g, m) + k * np.repeat(d, m), nn / mm


def base_quantiles(gap_s, delta_s, count, resolution: int = RESOLUTION) -> np.ndarray:
    """The simulated gaps' quantiles at ``(i + 0.5) / resolution``, i = 0..resolution−1."""
    g, d, n = gaps.as_runs(gap_s, delta_s, count)
    vals, w = _weighted_values(g, d, n)
    order = np.argsort(vals, kind="stable")
    vals, cw = vals[order], np.cumsum(w[order])
    probs = (np.arange(resolution) + 0.5) / resolution
    idx = np.searchsorted(cw, probs * cw[-1], side="left")
    return vals[np.minimum(idx, len(vals) - 1)]


def spread_quantiles(gap_s, delta_s, count, spread: Sequence[float],
                     qs: Sequence[float]) -> list[float]:
    """``inverted_cdf`` quantiles of gap × spread (plain gap quantiles without one)."""
    g, d, n = gaps.as_runs(gap_s, delta_s, count)
    if not len(n):
        return [math.nan] * len(qs)
    if not len(spread):
        return gaps.quantiles(g, d, n, qs)
    prod = np.sort(np.multiply.outer(base_quantiles(g, d, n), np.asarray(spread)).ravel())
    return [float(np.percentile(prod, 100 * q, method="inverted_cdf")) for q in qs]


def spread_mean(gap_s, delta_s, count, spread: Sequence[float]) -> float:
    """Mean of gap × spread: the gaps' mean times the spread's (independent)."""
    m = gaps.mean(gap_s, delta_s, count)
    return m * float(np.mean(spread)) if len(spread) else m


def with_spread(values, spread: Sequence[float]) -> np.ndarray:
    """Finite ``values`` (one per request, e.g. TTFT) times every spread quantile, as one
    equally weighted sample of value × J (the values themselves without a spread)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not len(spread):
        return v
    return np.multiply.outer(v, np.asarray(spread, dtype=np.float64)).ravel()
