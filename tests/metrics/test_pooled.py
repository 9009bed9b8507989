"""Percentiles users mean: over every request of every run, with a bootstrap interval
over sessions (kvsim.metrics.pooled)."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.metrics.pooled import LatencySample, pooled_count, pooled_interval, pooled_quantile


def _run(ttft: list[float], names: list[str] | None = None) -> LatencySample:
    """One run, one request per session, one gap run of 10 gaps of 20 ms per request."""
    n = len(ttft)
    names = names or [f"s{i}" for i in range(n)]
    codes = np.arange(n)
    return LatencySample(n, codes, tuple(names), np.asarray(ttft), np.asarray(ttft) + 1.0,
                         codes, np.full(n, 0.02), np.zeros(n), np.full(n, 10))


def test_the_p95_is_over_all_requests_not_the_mean_of_each_runs() -> None:
    # run A: 19 × 0.1 s and one 3 s; its own p95 (the 19th of 20) is 0.1 s. Run B: 17 ×
    # 0.1 s and three 3 s; its own p95 is 3 s. The mean of the two is 1.55 s — "meets a
    # 2 s SLO"; over all 40 requests the p95 is the 38th smallest, 3 s: it misses.
    a, b = _run([0.1] * 19 + [3.0]), _run([0.1] * 17 + [3.0] * 3)
    own = [pooled_quantile([r], "ttft", 0.95) for r in (a, b)]
    assert own == [0.1, 3.0] and np.mean(own) == pytest.approx(1.55)
    assert pooled_quantile([a, b], "ttft", 0.95) == 3.0
    assert pooled_count([a, b], "ttft") == 40
    assert pooled_count([a, b], "itl") == 400  # 40 requests × 10 gaps
    assert pooled_quantile([a, b], "itl", 0.95) == pytest.approx(0.02)
    assert pooled_quantile([a, b], "e2e", 0.5) == pytest.approx(1.1)


def test_the_interval_is_a_repeatable_bootstrap_over_sessions() -> None:
    a, b = _run([0.1] * 19 + [3.0]), _run([0.1] * 17 + [3.0] * 3)
    lo, hi = pooled_interval([a, b], "ttft", 0.95, seed=7)
    assert (lo, hi) == pooled_interval([a, b], "ttft", 0.95, seed=7)
    # 4 of 40 sessions are slow: resampled, the p95 is 0.1 s when fewer than 3 of them
    # come back, 3 s otherwise — both ends are values that occur
    assert (lo, hi) == (0.1, 3.0)
    # one session: no spread to resample, no interval
    assert all(np.isnan(pooled_interval([_run([1.0])], "ttft", 0.95)))


def test_a_traces_sessions_are_one_cluster_across_runs() -> None:
    # the same 20 sessions replayed twice (a trace without timing noise): as shared
    # sessions the copies add nothing — the interval is one copy's
    one = _run([0.05 * i for i in range(1, 21)])
    twice = pooled_interval([one, one], "ttft", 0.95, seed=3, shared_sessions=True)
    assert twice == pooled_interval([one], "ttft", 0.95, seed=3)
    assert pooled_quantile([one, one], "ttft", 0.95) == pooled_quantile([one], "ttft", 0.95)
