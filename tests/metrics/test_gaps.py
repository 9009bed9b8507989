"""Affine inter-token runs: exact percentiles, bounded storage, both builders agree.

Percentiles over ``(gap_s, gap_delta_s, count)`` runs must equal numpy's
``inverted_cdf`` percentile over the expanded gaps (the definition used for every
other latency), on both the expansion path and the bisection path for large inputs.
"""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.core.itl import SMALL_STRETCH, TOL_REL, GapRuns, continued_runs, emit_tokens, token_gap
from kvsim.metrics import gaps
from kvsim.metrics.summary import itl_quantile
from kvsim.report.data_run import itl_cdf

QS = (0.0, 0.01, 0.5, 0.95, 0.99, 1.0)

runs_st = st.lists(st.tuples(st.floats(0.0, 0.5), st.sampled_from([0.0, 1e-6, -1e-6, 3.3e-7]),
                             st.integers(1, 400)), min_size=1, max_size=12)


def _np_q(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q * 100, method="inverted_cdf"))


@settings(max_examples=60, deadline=None)
@given(runs=runs_st)
def test_quantiles_equal_numpy_over_the_expansion(runs) -> None:
    g, d, n = (np.array(c) for c in zip(*runs))
    # delta keeps every gap positive, as clock differences are
    d = np.where(g + (n - 1) * d < 0, 0.0, d)
    # the expansion written out by hand: run i is g_i + k·d_i, k = 0 .. n_i − 1
    full = np.array([float(gg) + k * float(dd) for gg, dd, c in zip(g, d, n)
                     for k in range(int(c))])
    assert len(full) == n.sum()
    want = [_np_q(full, q) for q in QS]
    assert gaps.quantiles(g, d, n, QS) == want
    old = gaps.EXPAND_MAX
    try:  # force the bisection path
        gaps.EXPAND_MAX = 0
        assert gaps.quantiles(g, d, n, QS) == want
    finally:
        gaps.EXPAND_MAX = old
    assert gaps.mean(g, d, n) == pytest.approx(full.mean(), rel=1e-12)
    assert gaps.maximum(g, d, n) == full.max()
    for x in (full.min(), full.max(), float(np.median(full)), full[0], -1.0, 1.0):
        assert gaps.count_le(x, g, d, n) == int((full <= x).sum())


def test_single_run_quantiles_by_hand() -> None:
    # 10 gaps 0.020, 0.021, ..., 0.029: the p50 is the 5th smallest, the p95 the 10th
    assert gaps.quantiles([0.02], [0.001], [10], (0.5, 0.95)) == [0.02 + 4 * 0.001,
                                                                 0.02 + 9 * 0.001]
    # falling run: 5 gaps 0.05 .. 0.01, the smallest is the last one
    assert gaps.quantile([0.05], [-0.01], [5], 0.2) == 0.05 + 4 * -0.01
    assert math.isnan(gaps.quantile([], [], [], 0.5))


def test_summary_and_report_read_affine_and_run_length_tables() -> None:
    itl = pd.DataFrame({"request_id": ["a", "b"], "gap_s": [0.02, 0.1], "count": [99, 1],
                        "gap_delta_s": [1e-4, 0.0]})
    full = np.sort(np.concatenate([0.02 + np.arange(99) * 1e-4, [0.1]]))
    assert itl_quantile(itl, 0.95) == _np_q(full, 0.95)
    cdf = itl_cdf(itl)
    assert cdf["n"] == 100 and cdf["p95_s"] == _np_q(full, 0.95)
    assert cdf["p"][-1] == 1.0 and cdf["x_s"][-1] == 0.1
    old = itl.drop(columns="gap_delta_s")  # a measured / older table: run-length rows
    assert itl_quantile(old, 0.5) == 0.02 and itl_cdf(old)["n"] == 100


def _feed(gs, r: GapRuns | None = None) -> GapRuns:
    r = r if r is not None else GapRuns()
    for gap in list(gs):
        r.add(float(gap))
    return r


def _continued(r: GapRuns, gs: list[float]) -> list[tuple[float, float, int]]:
    """``r``'s runs after the gaps ``gs`` through :func:`continued_runs` (r unchanged)."""
    closed, state = continued_runs((r.g0, r.lo, r.hi, r.n), gs[0], gs[1:])
    out = GapRuns()
    out.closed = list(r.closed) + closed
    out.g0, out.lo, out.hi, out.n = state
    return out.runs()


@settings(max_examples=40, deadline=None)
@given(dt0=st.floats(0.005, 0.05), slope=st.sampled_from([0.0, 2.5e-7, 1e-5]),
       steps=st.integers(2, 3000), kink=st.integers(0, 3000))
def test_decode_stretch_is_a_few_runs_within_tolerance(dt0, slope, steps, kink) -> None:
    """Affine step durations (computed in float64, one regime change): a couple of
    runs, every stored gap within TOL_REL of its own size, and the online and
    vectorised builders give the same runs."""
    j = np.arange(steps)
    gs = dt0 + slope * j + np.where(j > kink, 3 * slope, 0.0) * (j - kink)
    online = _feed(gs)
    assert _continued(GapRuns(), gs.tolist()) == online.runs()
    assert len(online) <= 4
    back = gaps.expand(*zip(*online.runs()))
    assert np.all(np.abs(back - gs) <= TOL_REL * gs * (1 + 1e-9))


@settings(max_examples=60, deadline=None)
@given(before=st.lists(st.sampled_from([0.02, 0.021, 0.0205, 0.03]), max_size=6),
       dt0=st.sampled_from([0.02, 0.021]), slope=st.sampled_from([0.0, 0.001, 2.5e-7]),
       steps=st.sampled_from([1, 2, 5, SMALL_STRETCH, SMALL_STRETCH + 1, 200]),
       jitter=st.integers(0, 3))
def test_continuing_an_open_run_equals_feeding_gap_by_gap(before, dt0, slope, steps,
                                                          jitter) -> None:
    """From any open run (fed ``before``), a stretch's gaps through
    ``continued_runs`` (Python below SMALL_STRETCH, numpy above) give exactly the runs
    of the per-step builder."""
    j = np.arange(steps)
    gs = (dt0 + slope * j + np.where(j % 11 < jitter, 1e-4, 0.0)).tolist()
    r = _feed(before)
    assert _continued(r, gs) == _feed(gs, _feed(before)).runs()


@pytest.mark.parametrize("t0", [0.0, 1.0, 86_400.0, 604_800.0, 2_592_000.0])
def test_a_token_after_the_previous_step_has_that_steps_duration_as_gap(t0) -> None:
    """At any clock — 1.2e-10 s resolution after a simulated week, 5e-9 of a 25 ms
    gap — a gap that follows the previous step's token is the step's own duration;
    a gap across a wait is the clock difference."""
    dt = 0.025 + 1e-7 / 3
    now = t0 + dt
    assert token_gap(now, t0, dt) == dt
    if t0 >= 604_800.0:  # the clock difference is off by > 1e-10 of the gap here
        assert abs((now - t0) - dt) > 1e-10 * dt
    later = now + 0.3
    assert token_gap(later + dt, now, dt) == (later + dt) - now
    assert token_gap(now, t0, math.nan) == now - t0  # no step duration known


@settings(max_examples=30, deadline=None)
@given(dt0=st.floats(0.005, 0.05), slope=st.sampled_from([0.0, 2.5e-7, 1e-5]),
       steps=st.integers(1, 80), t0=st.floats(0.0, 6e5), jitter=st.integers(0, 5))
def test_emit_tokens_equals_sampling_token_by_token(dt0, slope, steps, t0, jitter) -> None:
    """A stretch's tokens emitted at once (short stretches in Python, long ones with
    numpy) store exactly the runs of the per-step path: each request's first gap
    (token_gap) and then the step durations, continuing its own open run."""
    j = np.arange(steps)
    dts = (dt0 + slope * j + np.where(j % 7 < jitter, 1e-4, 0.0)).tolist()  # off-run steps
    times = list(itertools.accumulate(dts, initial=t0))

    class Req:
        def __init__(self, last: float, before: list[float]) -> None:
            self.itl, self.last_token_s, self.num_output = _feed(before), last, 1

    cases = [(t0, [dts[0]] * 3), (t0, [dts[0]] * 3), (t0, [0.5]),  # two with equal runs
             (t0 - 0.5, []), (t0, [])]  # one across a wait, one fresh
    reqs = [Req(last, before) for last, before in cases]
    emit_tokens(reqs, times, dts)
    for r, (last, before) in zip(reqs, cases):
        want = _feed([token_gap(times[1], last, dts[0]), *dts[1:]], _feed(before))
        assert r.itl.runs() == want.runs()
        assert r.last_token_s == times[-1] and r.num_output == 1 + steps
    assert reqs[4].itl.runs()[0][0] == dts[0]


def test_a_stretch_continues_each_requests_open_run_by_hand() -> None:
    """Open runs 0.1 × 2 and 0.2 × 2, then five steps of 0.1 s: the first request's
    run goes on (one row of 7), the second's closes before the stretch's run."""
    same, other = _feed([0.1, 0.1]), _feed([0.2, 0.2])

    class Req:
        def __init__(self, itl: GapRuns) -> None:
            self.itl, self.last_token_s, self.num_output = itl, 1.0, 3

    a, b = Req(same), Req(other)
    emit_tokens([a, b], list(itertools.accumulate([0.1] * 5, initial=1.0)), [0.1] * 5)
    assert a.itl.runs() == [(0.1, 0.0, 7)]
    assert b.itl.runs() == [(0.2, 0.0, 2), (0.1, 0.0, 5)]
    sloped = _feed([0.1, 0.2])  # then 0.3 on the same line: one run with slope 0.1
    c = Req(sloped)
    emit_tokens([c], [1.0, 1.3], [0.3])
    (g0, d, n), = c.itl.runs()
    assert (g0, n) == (0.1, 3) and d == pytest.approx(0.1, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(groups=st.lists(st.one_of(st.just([]), runs_st), min_size=1, max_size=8),
       chunk=st.sampled_from([1 << 20, 700, 50]))
def test_group_stats_equal_numpy_per_group(groups, chunk) -> None:
    """Per-request (mean, p50, p95, max) of many requests' runs at once equal numpy
    over each request's expanded gaps, whatever the chunking (NaN without gaps)."""
    idx = [k for k, runs in enumerate(groups) for _ in runs]
    g, d, n = ([r[i] for runs in groups for r in runs] for i in range(3))
    out = gaps.group_stats(idx, g, d, n, len(groups), chunk_gaps=chunk)
    for k, runs in enumerate(groups):
        if not runs:
            assert np.isnan(out[k]).all()
            continue
        v = np.concatenate([gg + np.arange(c) * dd for gg, dd, c in runs])
        assert out[k][1] == _np_q(v, 0.5) and out[k][2] == _np_q(v, 0.95)
        assert out[k][3] == v.max()
        assert out[k][0] == pytest.approx(v.mean(), rel=1e-12)
