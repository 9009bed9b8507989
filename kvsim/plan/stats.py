"""Confidence intervals for planning answers over seeded replications.

A plan is only as good as its spread: one lucky run says nothing about the next
evening.  Two intervals are used, both from scipy:

- **Wilson score interval** for a share of replications (OOM risk = replications
  with an OOM-class event / replications).  Wilson keeps a sensible, non-degenerate
  interval at 0 of N and N of N, where the normal approximation collapses to a point.
- **Bootstrap percentile interval** for the mean over replications of a per-run
  statistic (e.g. each run's p95 TTFT).  Percentile (not BCa) because a metric that
  is identical in every run (a static reservation) is a normal, degenerate case here.

NOTE: NaN values (a run where no request completed has no TTFT percentile) are
dropped before estimating; the number of values actually used is returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from kvsim.errors import InputError


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval."""

    estimate: float
    low: float
    high: float
    n: int
    confidence: float = 0.95


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> Interval:
    """Share ``successes / trials`` with its Wilson score interval."""
    if trials <= 0:
        raise InputError("replications", trials, "need at least one replication for a risk")
    if not 0 <= successes <= trials:
        raise InputError("successes", successes, f"must lie in [0, {trials}]")
    ci = stats.binomtest(int(successes), int(trials)).proportion_ci(
        confidence_level=confidence, method="wilson")
    return Interval(successes / trials, float(ci.low), float(ci.high), int(trials), confidence)


def bootstrap_mean(values: list[float] | np.ndarray, confidence: float = 0.95,
                   seed: int = 0, n_resamples: int = 2000) -> Interval:
    """Mean of ``values`` with a bootstrap percentile interval (NaNs dropped).

    One value → the interval is that value's point (no spread can be estimated from
    a single run; the caller reports ``n``).  No value → all NaN, ``n = 0``.
    """
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, confidence)
    mean = float(x.mean())
    if x.size == 1 or float(x.max()) == float(x.min()):
        return Interval(mean, mean, mean, int(x.size), confidence)
    res = stats.bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                          method="percentile", random_state=np.random.default_rng(seed))
    low = float(res.confidence_interval.low)
    high = float(res.confidence_interval.high)
    return Interval(mean, min(low, mean), max(high, mean), int(x.size), confidence)
