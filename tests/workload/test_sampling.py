"""Down-sampling keeps whole sessions; time scaling hits a target rate."""

import pytest
from scipy.stats import chisquare

from kvsim.errors import InputError
from kvsim.workload.sampling import request_rate, reservoir, sample, scale_time, scale_to_rate
from kvsim.workload.schema import Session, Turn


def _sessions(n: int) -> list[Session]:
    # session k starts at 10k s and has k % 3 + 1 open-loop turns 1 s apart
    return [Session(session_id=f"s{k:03d}", history="none", turns=tuple(
        Turn(start_s=10.0 * k + j, input_tokens=5, output_tokens=1) for j in range(k % 3 + 1)))
        for k in range(n)]


def test_sample_n_whole_sessions():
    pool = _sessions(100)
    got = sample(pool, n_sessions=10, seed=1)
    assert len(got) == 10 and all(s in pool for s in got)  # whole, unchanged sessions
    assert [s.turns[0].start_s for s in got] == sorted(s.turns[0].start_s for s in got)
    assert sample(pool, n_sessions=10, seed=1) == got
    assert sample(pool, n_sessions=10, seed=2) != got
    assert sample(pool, n_sessions=500) == pool


def test_sample_to_rate():
    pool = _sessions(100)
    # 199 requests (34*1 + 33*2 + 33*3) over 990 s
    assert request_rate(pool) == pytest.approx(199 / 990)
    got = sample(pool, rate=request_rate(pool) / 4, seed=0)
    assert len(got) == 25
    with pytest.raises(InputError, match="--rate"):
        sample(pool, rate=1.0)
    with pytest.raises(InputError, match="exactly one"):
        sample(pool)


def test_reservoir_is_uniform_subset_of_stream():
    pool = _sessions(50)
    got = reservoir(iter(pool), 7, seed=3)
    assert len(got) == 7 and all(s in pool for s in got)
    assert reservoir(iter(pool), 7, seed=3) == got
    assert reservoir(iter(pool), 7, seed=4) != got


def test_reservoir_includes_every_position_equally_often():
    # Uniform sampling of k of N: each item is kept with probability k/N, so over S fixed
    # seeds each is kept ~S*k/N times. Chi-square goodness of fit against that flat
    # expectation. (Draws within a seed are without replacement, so the counts vary a bit
    # less than the multinomial the test assumes: the test is conservative, never flaky.)
    # A first-k / last-k / recency-biased reservoir piles the counts on some positions and
    # gets p ~ 0.
    n_items, k, seeds = 20, 5, 2000
    pool = _sessions(n_items)
    index = {s.session_id: i for i, s in enumerate(pool)}
    counts = [0] * n_items
    for seed in range(seeds):
        got = reservoir(iter(pool), k, seed=seed)
        assert len(got) == k and len({s.session_id for s in got}) == k
        for s in got:
            counts[index[s.session_id]] += 1
    assert sum(counts) == seeds * k
    p = chisquare(counts, [seeds * k / n_items] * n_items).pvalue
    assert p > 1e-3, (p, counts)


def test_scale_time_and_rate():
    pool = _sessions(10)
    half = list(scale_time(pool, 0.5))
    assert [t.start_s for t in half[4].turns] == [20.0, 20.5]
    target = scale_to_rate(pool, 2 * request_rate(pool))
    assert request_rate(target) == pytest.approx(2 * request_rate(pool))
    with pytest.raises(InputError, match="time_scale"):
        list(scale_time(pool, 0))
