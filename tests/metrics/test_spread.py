"""Inter-token percentiles with a calibrated step-time spread (kvsim.metrics.spread).

Expected values are worked by hand from the product distribution gap × J.
"""

import numpy as np
import pytest

from kvsim.metrics.spread import spread_mean, spread_quantiles

QS = (0.10, 0.25, 0.50, 0.95)


def test_without_a_spread_the_gaps_quantiles_are_exact() -> None:
    # runs: 300 gaps 1.000, 1.001, …, 1.299 ms, then 7 gaps of 2 ms — 307 gaps in all.
    # inverted_cdf rank ceil(q·307): p10 → 31, p25 → 77, p50 → 154, p95 → 292, all
    # inside the ramp, so the r-th smallest is 1 ms + (r − 1)·1 µs
    g, d, n = [0.001, 0.002], [1e-6, 0.0], [300, 7]
    got = spread_quantiles(g, d, n, (), QS)
    assert got == pytest.approx([0.001030, 0.001076, 0.001153, 0.001291], rel=1e-12)
    # the same from plain numpy over the gaps written out one by one
    full = np.array([0.001 + k * 1e-6 for k in range(300)] + [0.002] * 7)
    assert len(full) == 307
    assert got == [float(np.percentile(full, q * 100, method="inverted_cdf")) for q in QS]


def test_constant_gaps_take_the_spreads_quantiles() -> None:
    # every gap 2 ms; J is 0.8, 1.0 or 1.6 with equal weight: gap·J is 1.6, 2.0 or 3.2 ms
    got = spread_quantiles([0.002], [0.0], [1000], (0.8, 1.0, 1.6), QS)
    assert got == pytest.approx([0.0016, 0.0016, 0.0020, 0.0032])


def test_two_gap_levels_times_two_spread_levels() -> None:
    # half the gaps 1 ms, half 3 ms; J ∈ {1, 2}: products 1, 2, 3, 6 ms, a quarter each
    got = spread_quantiles([0.001, 0.003], [0.0, 0.0], [500, 500], (1.0, 2.0),
                           (0.25, 0.26, 0.5, 0.51, 0.75, 0.95))
    assert got == pytest.approx([0.001, 0.002, 0.002, 0.003, 0.003, 0.006])
    # mean: (1 + 3)/2 ms times (1 + 2)/2
    assert spread_mean([0.001, 0.003], [0.0, 0.0], [500, 500], (1.0, 2.0)) == \
        pytest.approx(0.003)


def test_a_unit_spread_keeps_a_ramps_quantiles_to_the_resolution() -> None:
    # one run 0, 0.1 ms, …, 1 s: quantile q of the ramp is ≈ q seconds
    got = spread_quantiles([0.0], [1e-4], [10001], (1.0,), QS)
    assert got == pytest.approx(list(QS), abs=1e-3)


def test_no_gaps_give_nan() -> None:
    assert all(np.isnan(v) for v in spread_quantiles([], [], [], (1.0,), QS))


def test_values_with_a_spread_are_every_value_times_every_quantile() -> None:
    from kvsim.metrics.spread import with_spread

    # NaN (no first token) is dropped; 1 and 3 s times J ∈ {0.5, 2}
    got = with_spread([1.0, np.nan, 3.0], (0.5, 2.0))
    assert sorted(got.tolist()) == [0.5, 1.5, 2.0, 6.0]
    assert with_spread([1.0, np.nan], ()).tolist() == [1.0]
