"""Does the plan's "95 %" interval of a mean over n runs hold the true mean 95 % of the
time?  Measured here, with fixed seeds, at the run counts a plan uses (audit 3,
defect 3: the bootstrap percentile interval held it in 48 % of 2-run plans on skewed
data).  Normal runs: the Student-t interval is exact, so the measured share must be
within binomial noise of 0.95 (2000 plans: sd 0.005; we allow 3 sd).  Skewed runs
(lognormal σ = 1, whose mean is e^0.5): what the interval really gives is stated here
and in kvsim.plan.stats — below nominal, so the upper end is a planning bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvsim.plan.stats import mean_interval

PLANS = 2000


def _coverage(draw, truth: float, n: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(PLANS):
        iv = mean_interval(draw(rng, n))
        hits += iv.low <= truth <= iv.high
    return hits / PLANS


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_normal_runs_cover_the_mean_at_the_nominal_rate(n):
    cov = _coverage(lambda rng, k: rng.normal(1.0, 0.3, k), 1.0, n, seed=n)
    assert abs(cov - 0.95) <= 0.015, cov


@pytest.mark.parametrize("n,measured", [(2, 0.8745), (3, 0.823), (5, 0.81), (8, 0.835)])
def test_skewed_runs_coverage_as_documented(n, measured):
    cov = _coverage(lambda rng, k: rng.lognormal(0.0, 1.0, k), math.exp(0.5), n, seed=100 + n)
    assert cov == measured
    assert 0.81 <= cov <= 0.88  # the range kvsim.plan.stats states
