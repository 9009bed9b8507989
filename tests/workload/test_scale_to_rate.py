"""Request rates count every turn where it really arrives — a closed-loop turn
``think_s`` after the one ahead of it, an open-loop turn at its own ``start_s`` — and
``scale_to_rate`` refuses a rate it cannot reach (non-finite, or out of reach of the
think times it does not scale) with the CLI's one line."""

from __future__ import annotations

import math

import pytest

from kvsim.errors import InputError
from kvsim.workload.sampling import arrival_rate, arrival_times_s, request_rate, scale_to_rate
from kvsim.workload.schema import Session, Turn


def _session(sid: str, *turns: tuple[float | None, float]) -> Session:
    """Turns given as (start_s, think_s)."""
    return Session(session_id=sid, turns=tuple(
        Turn(start_s=s, think_s=t, input_tokens=5, output_tokens=1) for s, t in turns))


# closed-loop: a arrives at 0, 10, 30; b at 100, 105 → 5 requests over 105 s
CLOSED = [_session("a", (0.0, 0.0), (None, 10.0), (None, 20.0)),
          _session("b", (100.0, 0.0), (None, 5.0))]
# open-loop: a arrives at 0, 50, 200; b at 100 → 4 requests over 200 s
OPEN = [_session("a", (0.0, 0.0), (50.0, 0.0), (200.0, 0.0)), _session("b", (100.0, 0.0))]


def test_closed_loop_arrivals_add_think_times():
    assert arrival_times_s(CLOSED[0]) == [0.0, 10.0, 30.0]
    assert arrival_rate(CLOSED) == 5 / 105


def test_open_loop_arrivals_are_their_own_start_times():
    assert arrival_times_s(OPEN[0]) == [0.0, 50.0, 200.0]
    assert arrival_rate(OPEN) == 4 / 200
    # every absolute start_s counts (not the first turns' only, which read 4/100)
    assert request_rate(OPEN) == 4 / 200


def test_mixed_turns_arrive_in_order():
    # think after an open-loop turn counts from it; an open-loop turn whose time has
    # passed (a 100 s think ahead of it) arrives right after the turn before it
    s = _session("m", (0.0, 0.0), (50.0, 0.0), (None, 30.0), (None, 100.0), (60.0, 0.0))
    assert arrival_times_s(s) == [0.0, 50.0, 80.0, 180.0, 180.0]
    assert arrival_rate([s]) == 5 / 180
    assert arrival_rate([_session("one", (7.0, 0.0))]) == math.inf


def test_an_open_loop_trace_is_scaled_by_all_its_start_times():
    got = scale_to_rate(OPEN, 0.04)  # every start_s halved
    assert [[t.start_s for t in s.turns] for s in got] == [[0.0, 25.0, 100.0], [50.0]]
    assert arrival_rate(got) == 0.04


def test_a_closed_loop_trace_scales_its_session_starts_only():
    got = scale_to_rate(CLOSED, 0.1)  # request_rate 5/100 → factor 0.5: b starts at 50
    assert [[(t.start_s, t.think_s) for t in s.turns] for s in got] == [
        [(0.0, 0.0), (None, 10.0), (None, 20.0)], [(50.0, 0.0), (None, 5.0)]]
    assert arrival_rate(got) == 5 / 55  # within 2x of 0.1: accepted


def test_a_rate_the_think_times_forbid_is_refused():
    # factor 0.05: b starts at 5, arrivals span a's 30 s of think → 5/30 ≈ 0.167/s
    with pytest.raises(InputError) as exc:
        scale_to_rate(CLOSED, 1.0)
    assert str(exc.value) == ("--scale-to-rate: 1.0 — not reachable: the requests arrive at "
                              "about 0.167/s (think times within a session are not scaled; "
                              "this sample reaches at most ~0.167/s)")


@pytest.mark.parametrize("rate", [math.inf, math.nan, 0.0, -1.0])
def test_non_finite_and_non_positive_rates_are_refused(rate):
    with pytest.raises(InputError) as exc:
        scale_to_rate(OPEN, rate)
    assert (exc.value.field, exc.value.allowed) == (
        "--scale-to-rate", "a finite number > 0 (requests per second)")


def test_a_trace_without_a_span_or_a_rate_that_overflows_is_refused():
    with pytest.raises(InputError) as exc:
        scale_to_rate([_session("a", (3.0, 0.0), (None, 1.0))], 1.0)
    assert str(exc.value) == ("--scale-to-rate: 1.0 — the trace's arrival times (start_s) "
                              "all fall at one instant: there is no span to scale")
    with pytest.raises(InputError) as exc:
        scale_to_rate(OPEN, 1e-320)
    assert str(exc.value) == ("--scale-to-rate: 1e-320 — too low for this trace's 0.02 "
                              "requests/s: the scaled arrival times overflow")
