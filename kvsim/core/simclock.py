"""The SimPy clock helpers the engine needs beyond SimPy's public API.

Fast-forward (:mod:`kvsim.core.fastforward`) computes instants ahead of the clock and
must put an event on SimPy's heap at exactly such an instant, and it must know when
the next pending event fires; SimPy's public API offers neither.  These three
functions (beside :func:`check_clock`, the clock's range) are the only code that reads
or writes SimPy's private state
(``Environment._queue``, ``Environment._eid``, ``Event._ok`` / ``Event._value``),
written against SimPy 4's heap entries ``(time, priority, event id, event)``.

NOTE: only this module touches SimPy internals; :mod:`kvsim.core.engine` (the one
SimPy user that runs processes) and :mod:`kvsim.core.link` use SimPy's public API
only (tests/test_architecture.py checks both).
"""

from __future__ import annotations

import math
from heapq import heappush

import simpy

from kvsim.errors import InputError

MAX_CLOCK_S = 1e9
"""The latest instant a request may arrive at (~31.7 years): float64 resolves 1.2e-7 s
there, far inside any step.  NOTE: at 1e99 s a step's end equals its start and the clock
stops: a trace time or think time that large ran forever (issue 26, "no hangs")."""


def check_clock(now_s: float, request_id: str) -> None:
    """Refuse a request arriving past :data:`MAX_CLOCK_S` (one line, exit 2)."""
    if now_s > MAX_CLOCK_S:
        raise InputError("workload", f"request {request_id} at {now_s:g} s",
                         f"arrivals before {MAX_CLOCK_S:g} s (~31.7 years), where the "
                         "clock still resolves a step: keep the trace's start_s and "
                         "think_s near 0")


def next_event_s(env: simpy.Environment, skip: simpy.Event | None) -> float:
    """Earliest pending event time of ``env``, ignoring the event ``skip`` (the sampler tick).

    NOTE: SimPy's queue is a binary heap: the root is the earliest event, and when
    the root is ``skip`` the next earliest is one of the root's two children (O(1)).
    """
    queue = env._queue
    if not queue:
        return math.inf
    if queue[0][3] is not skip:
        return queue[0][0]
    return min((queue[i][0] for i in (1, 2) if i < len(queue)), default=math.inf)


def schedule_at(env: simpy.Environment, event: simpy.Event, priority: int,
                at_s: float) -> simpy.Event:
    """Trigger ``event`` (successfully, no value) at exactly ``at_s``; return it.

    NOTE: SimPy's own ``schedule`` adds a delay to ``now``, and ``now + d`` cannot
    reach every float (0.35 + d skips 1.5000000000000007): the per-step reference's
    times are sums of step times from each step's start, so an instant a stretch
    computed ahead is put on SimPy's heap as it is, in SimPy's own entry format.
    """
    assert at_s >= env.now, f"schedule_at {at_s} before now {env.now}"
    event._ok, event._value = True, None
    heappush(env._queue, (at_s, priority, next(env._eid), event))
    return event


def schedule_in(env: simpy.Environment, event: simpy.Event, priority: int,
                delay_s: float) -> simpy.Event:
    """Trigger ``event`` (successfully, no value) ``delay_s`` from now, at ``priority``.

    NOTE: ``Event.succeed`` schedules at once at NORMAL priority; the sampler's ticks
    are URGENT (kvsim.core.engine), which only ``Environment.schedule`` of an event
    already marked successful gives.
    """
    event._ok, event._value = True, None
    env.schedule(event, priority, delay_s)
    return event
