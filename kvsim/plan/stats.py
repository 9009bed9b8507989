"""Confidence intervals for planning answers over seeded replications.

A plan is only as good as its spread: one lucky run says nothing about the next
evening.  Two intervals are used, both from scipy:

- **Wilson score interval** for a share of replications (OOM risk = replications
  with an OOM-class event / replications).  Wilson keeps a sensible, non-degenerate
  interval at 0 of N and N of N, where the normal approximation collapses to a point.
- **Student-t interval** for the mean over replications of a per-run statistic
  (e.g. each run's p95 TTFT): mean ± t(n−1)·s/√n, the quantile from ``scipy.stats.t``.
  At the run counts a plan uses (2–8) a bootstrap percentile interval is far too
  narrow — resampling n values cannot show spread they do not have: on skewed data it
  held the true mean in about 48 % of 2-run, 70 % of 3-run and 85 % of 8-run plans.
  The t interval is exact for normally distributed runs at any n; on skewed runs
  (lognormal, σ = 1) it holds the true mean in only 81–88 % of cases at n = 2–8
  (``tests/plan/test_stats_coverage.py`` measures both), so its upper end is a
  planning bound, not a guarantee.

NOTE: one value gives no interval (no spread can be estimated from a single run):
``low`` and ``high`` are NaN, never the value itself.  Values identical in every run
(a static reservation) give a zero-width interval, which is what they are.  NaN values
(a run where no request completed has no TTFT percentile) are dropped before
estimating; the number of values actually used is returned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from kvsim.errors import InputError

MEAN_INTERVAL = "student-t"
"""What :func:`mean_interval` computes (for labels in tables and notes)."""


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval (NaN ends: unknown)."""

    estimate: float
    low: float
    high: float
    n: int
    confidence: float = 0.95

    @property
    def bounded(self) -> bool:
        """Are both ends known (False for a single run)?"""
        return not (math.isnan(self.low) or math.isnan(self.high))


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> Interval:
    """Share ``successes / trials`` with its Wilson score interval."""
    if trials <= 0:
        raise InputError("replications", trials, "need at least one replication for a risk")
    if not 0 <= successes <= trials:
        raise InputError("successes", successes, f"must lie in [0, {trials}]")
    ci = stats.binomtest(int(successes), int(trials)).proportion_ci(
        confidence_level=confidence, method="wilson")
    return Interval(successes / trials, float(ci.low), float(ci.high), int(trials), confidence)


def mean_interval(values: list[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    """Mean of ``values`` with its Student-t confidence interval (NaNs dropped).

    One value → ``low``/``high`` NaN (unknown, see the module NOTE).  No value → all
    NaN, ``n = 0``.
    """
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    nan = float("nan")
    if x.size == 0:
        return Interval(nan, nan, nan, 0, confidence)
    mean = float(x.mean())
    if x.size == 1:
        return Interval(mean, nan, nan, 1, confidence)
    if float(x.max()) == float(x.min()):
        return Interval(mean, mean, mean, int(x.size), confidence)
    half = float(stats.t.ppf((1 + confidence) / 2, x.size - 1)) * float(x.std(ddof=1)) \
        / math.sqrt(x.size)
    return Interval(mean, mean - half, mean + half, int(x.size), confidence)
