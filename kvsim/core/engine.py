"""The SimPy engine: sessions as processes, one driver running the step loop.

A feeder starts sessions lazily at their first ``start_s``; each session submits its turns
(closed-loop ``think_s`` after the previous answer, open-loop at ``start_s``; each turn
its ``arrival_delays`` draw later when given: ``latency.arrival_delay_s``) through
:class:`~kvsim.core.sessions.SessionChat`; the driver runs schedule → step time → apply →
record → hooks; a sampler records KV memory every ``sample_interval_s`` (a step function,
sleeping while idle). ``fidelity="fast"`` jumps decode stretches (:mod:`kvsim.core.fastforward`).

NOTE: only this module, ``simclock.py`` and ``link.py`` import SimPy.
NOTE: sampler ticks are URGENT: a tick at a step end records the state before that instant's
changes, in both fidelities.
NOTE: a run cut short records running/waiting requests as ``unfinished``; ``max_sim_time_s``
stops at once, the request cap and memory limit let the step in flight end first.
NOTE: :meth:`Engine.run` on the main thread raises the young-generation GC threshold for
the run and restores the process's settings after it (results do not depend on it); on
another thread it leaves them alone: runs overlapping in threads would restore each
other's settings.
Design: docs/design/sim-engine.md (after docs/design/DESIGN.md §3.4).
"""

from __future__ import annotations

import gc
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

import simpy
from simpy.events import NORMAL, URGENT

from kvsim.core.fastforward import FastForward
from kvsim.core.requests import Request
from kvsim.core.sessions import (
    AfterFailure,
    SessionChat,
    make_request,
    request_outcome,
    seed_block_hashes,
)
from kvsim.core.simclock import check_clock, next_event_s, schedule_at, schedule_in
from kvsim.core.step import EngineEvent, MemoryState, Scheduler, StepHook, StepPlan
from kvsim.core.stretch_memory import Stretch
from kvsim.errors import InputError, RunStopped
from kvsim.latency.base import LatencyModel
from kvsim.metrics.records import ABANDON_EVENT, NEW_CHAT_EVENT, Recorder
from kvsim.workload.schema import Session

GC_YOUNG_THRESHOLD = 100_000  # NOTE: allocations between young collections during a run


class RunEnd(NamedTuple):
    """How :meth:`Engine.run` ended: the simulated end time and the bound that stopped
    it early (``None``: every session ran, or the clock's ``max_sim_time_s`` ended it)."""

    end_s: float
    stopped: RunStopped | None


class Engine:
    """One inference server simulated over a stream of sessions."""

    def __init__(self, scheduler: Scheduler, latency: LatencyModel, *,
                 recorder: Recorder | None = None, sample_interval_s: float = 1.0, hooks: Sequence[StepHook] = (),
                 after_failure: AfterFailure = "new_chat", max_sim_time_s: float | None = None,
                 progress: Callable[[float, int], None] | None = None,
                 fidelity: str = "fast",
                 arrival_delays: Callable[[int], list[float]] | None = None) -> None:
        self.env = simpy.Environment()
        self.scheduler = scheduler
        self.latency = latency
        self.recorder = recorder or Recorder()
        self.sample_interval_s = sample_interval_s
        self.hooks = list(hooks)
        self.after_failure = after_failure
        self.max_sim_time_s = max_sim_time_s
        self.progress = progress
        self.arrival_delays = arrival_delays
        self._done_events: dict[str, simpy.Event] = {}
        self._wake: simpy.Event | None = None
        self._active_sessions = 0
        self._feeder_done = False
        self._finished = False
        self._idle = False
        self._activity: simpy.Event | None = None
        self._abort = self.env.event()
        self._error: InputError | None = None
        self._stopping: RunStopped | None = None  # a bound was hit; stop after the step
        self._in_step = False  # the driver waits for the end of a step (or stretch)
        self._live: dict[str, Request] = {}  # received, not yet recorded (submission order)
        self.requests_done = 0
        self.requests_submitted = 0
        self._tick: simpy.Event | None = None
        self._tick_s = -math.inf  # when the pending sampler tick fires
        self._sampled_until_s = -math.inf  # ticks up to here were recorded by a stretch
        self._next_tick_s = 0.0
        self._stop_s = math.inf if max_sim_time_s is None else max_sim_time_s
        self._follow: dict[str, float] = {}  # request id → its session's follow-up delay
        self.fastforward = FastForward(scheduler, latency, self.hooks, self.recorder) \
            if fidelity == "fast" else None
        if self.fastforward is not None:
            self.fastforward.follow_s = lambda req: self._follow.get(req.request_id, 0.0)

    # -- processes ----------------------------------------------------------------
    def _guarded(self, gen):
        """Run a process body; a user error stops the run and is re-raised by :meth:`run`.

        NOTE: SimPy re-creates a failing process's exception from its ``args``, which
        would lose InputError's fields, so user errors travel outside SimPy.
        """
        try:
            yield from gen
        except RunStopped as exc:  # NOTE: a bound, not a failure (module doc)
            if self._stopping is None:
                self._stopping = exc
                self.recorder.sample(self.env.now, self._memory())  # the run's last sample
            if not self._in_step:
                self._stop_now()
        except InputError as exc:
            self._error = exc
            self._stop_now()

    def _stop_now(self) -> None:
        if not self._abort.triggered:
            self._abort.succeed()

    def _feeder(self, sessions: Iterator[Session]):
        for s in sessions:
            start = s.turns[0].start_s or 0.0
            if start > self.env.now:
                yield self.env.timeout(start - self.env.now)
            self._active_sessions += 1
            self.env.process(self._guarded(self._session(s)))
        self._feeder_done = True
        self._poke()

    def _session(self, s: Session):
        chat = SessionChat(s, self.after_failure, request_outcome)
        prev: simpy.Event | None = None
        last: Request | None = None
        late = self.arrival_delays(len(s.turns)) if self.arrival_delays else None
        for i, turn in enumerate(s.turns):
            d = late[i] if late else 0.0
            if i > 0 and turn.start_s is None:
                if prev is not None:
                    yield prev
                if (turn.think_s or d) and not chat.poll(self.env.now):  # NOTE: ends at once
                    yield self.env.timeout((turn.think_s or 0.0) + d)
            elif turn.start_s is not None and turn.start_s + d > self.env.now:
                yield self.env.timeout(turn.start_s + d - self.env.now)
            if not chat.begin(i, self.env.now):
                self._note_chat(chat, ABANDON_EVENT)
                break
            if chat.opened is not None:
                self._note_chat(chat, NEW_CHAT_EVENT)
                last = None  # NOTE: a new chat shares only the system prompt's blocks
            nxt = s.turns[i + 1] if i + 1 < len(s.turns) else None
            # NOTE: only a closed-loop next turn waits for this answer (fast-forward bound)
            follow = (nxt.think_s or 0.0) + (late[i + 1] if late else 0.0) \
                if nxt is not None and nxt.start_s is None else math.inf
            req = make_request(s, i, self.env.now, chat.prompt(i))
            seed_block_hashes(req, last)
            last = req
            prev = self._submit(req, follow)
            chat.sent(i, req)
        if prev is not None:
            yield prev
        self._active_sessions -= 1
        self._poke()

    def _note_chat(self, chat: SessionChat, kind: str) -> None:
        """Record a new chat (its first turn) or an ended session (each dropped turn)."""
        self.scheduler.events.extend(EngineEvent(self.env.now, kind, rid, detail)
                                     for rid, detail in chat.notes(kind))
        self.recorder.drain(self.scheduler.events)

    def _submit(self, req: Request, follow_s: float = 0.0) -> simpy.Event:
        done = self.env.event()
        if self._stopping is not None:
            return done  # NOTE: stopping after the step in flight: nothing new enters
        check_clock(self.env.now, req.request_id)
        self.requests_submitted += 1
        self.recorder.check_capacity(self.requests_submitted)  # over the cap: no row
        self._done_events[req.request_id] = done
        self._follow[req.request_id] = follow_s
        self._live[req.request_id] = req
        if not self.scheduler.add_request(req, self.env.now):
            self._finish(req)
        self.recorder.drain(self.scheduler.events)
        self._poke()
        self.recorder.check_requests_rss(self.requests_submitted)  # it has its row
        return done

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _finish(self, req: Request) -> None:
        self._record_done(req).succeed()

    def _record_done(self, req: Request) -> simpy.Event:
        """Record a finished request; return its done event (not yet triggered)."""
        self.recorder.request_done(req)
        self.requests_done += 1
        self._follow.pop(req.request_id, None)
        del self._live[req.request_id]
        return self._done_events.pop(req.request_id)

    def _finish_in_stretch(self, finished: list[tuple[float, Request]], end_s: float
                           ) -> list[simpy.Event]:
        """Requests a stretch finished at their times: recorded now (before any later
        SimPy event), done events fired at their instants; the ones at ``end_s`` are
        returned for the driver to fire when it resumes there, as after a step.
        """
        at_end = []
        for t, req in finished:
            ev = self._record_done(req)
            if t < end_s:
                schedule_at(self.env, ev, NORMAL, t)
            else:
                at_end.append(ev)
        return at_end

    def _driver(self):
        sched = self.scheduler
        plan = sched.schedule(self.env.now)
        while True:
            self.recorder.drain(self.scheduler.events)
            if plan is None:
                if self._feeder_done and not self._active_sessions and not sched.has_work:
                    break
                self._wake = self.env.event()
                self._idle = True
                yield self._wake
                self._idle = False
                if self._activity is not None and not self._activity.triggered:
                    self._wake_sampler()
                plan = sched.schedule(self.env.now)
                continue
            ran = yield from self._execute(plan)
            if self._stopping is not None:
                break  # NOTE: a bound hit during that step (module doc)
            if ran is None:  # a stretch ended with a schedule that had nothing to run
                plan = None
                continue
            stall = sum(h.after_step(sched, ran, self.env.now) for h in self.hooks)
            self.recorder.drain(self.scheduler.events)
            if stall > 0:
                yield self.env.timeout(stall)
            plan = sched.schedule(self.env.now)
        self._finished = True

    def _execute(self, plan: StepPlan):
        """Run one step (after a fast-forwarded stretch, if any); return the plan run last."""
        ff = self.fastforward
        if ff is not None:
            quiet_s = next_event_s(self.env, self._tick)
            jumped = ff.jump(plan, self.env.now, quiet_s, self._stop_s)
            if jumped is not None:
                plan, end_s, folded = jumped
                self._sample_stretch(ff.stretch, min(end_s, math.nextafter(quiet_s, 0.0)))
                at_end = self._finish_in_stretch(ff.finished, end_s)
                self._in_step = True
                yield schedule_at(self.env, self.env.event(), NORMAL, end_s)
                self._in_step = False
                ff.stretch = None
                for ev in at_end:
                    ev.succeed()
                if ff.idle_after or self._stopping is not None:
                    return None
                if folded:
                    return plan
        start = self.env.now
        dt = self.latency.step_time_s(plan.batch) + plan.extra_s
        if dt > 0:
            self._in_step = True
            yield self.env.timeout(dt)
            self._in_step = False
        done = self.scheduler.complete(plan, self.env.now, dt)
        b = plan.batch
        self.recorder.step(start, self.env.now, sum(b.prefill_tokens), len(b.decode_context),
                           len(plan.items))
        for req in done:
            self._finish(req)
        return plan

    def _wake_sampler(self) -> None:
        """Resume the idle sampler: at once on a tick instant, else at the next tick.

        NOTE: the activity event the sampler waits on *is* that tick (URGENT, as
        ``_sleep``), so a jump from the wake instant sees no event at ``now``.
        Memory changes only from the driver's next step on, so the state at the wake
        instant equals the idle sample already taken.
        """
        ev, now, dt = self._activity, self.env.now, self.sample_interval_s
        delay = math.ceil(now / dt) * dt - now
        if not delay > 0:
            ev.succeed()
            return
        schedule_in(self.env, ev, URGENT, delay)
        self._tick, self._tick_s = ev, now + delay

    def _sleep(self, at_s: float) -> simpy.Event:
        """A sampler tick at ``at_s``: URGENT, so it precedes every other event there."""
        ev = schedule_at(self.env, self.env.event(), URGENT, at_s)
        self._tick, self._tick_s = ev, at_s
        return ev

    def _sample_stretch(self, st: Stretch, end_s: float) -> None:
        """Record the sampler ticks of a jumped stretch up to ``end_s`` at once.

        NOTE: only when the sampler's tick is pending inside the stretch; the sampler,
        woken at that tick, skips to the first tick after ``end_s``.  ``end_s`` stays
        before the next SimPy event (an arrival in a folded step changes the queue).
        """
        t = self._tick_s
        if self._tick is None or self._tick.processed or not self.env.now < t <= end_s:
            return
        dt, ticks = self.sample_interval_s, []
        while t <= end_s:
            ticks.append(t)
            t += dt  # NOTE: the sampler's own float sequence (now + dt per tick)
        self.recorder.memory.extend(st.memory_rows(ticks))
        self.recorder.check_samples()
        self._sampled_until_s, self._next_tick_s = end_s, t

    def _memory(self) -> MemoryState:
        st = self.fastforward.stretch if self.fastforward is not None else None
        if st is not None and st.covers(self.env.now):
            return st.memory_at(self.env.now, self.scheduler.memory())
        return self.scheduler.memory()

    def _sampler(self):
        dt = self.sample_interval_s
        while not self._finished:
            if self.env.now <= self._sampled_until_s:
                yield self._sleep(self._next_tick_s)
                continue
            self.recorder.sample(self.env.now, self._memory())
            self.recorder.check_samples()
            if self.progress is not None:
                self.progress(self.env.now, self.requests_done)
            if self._idle:
                self._activity = self.env.event()
                yield self._activity  # resumed on the tick grid (_wake_sampler)
                continue
            yield self._sleep(self.env.now + dt)  # NOTE: the tick grid: now + dt

    # -- entry ------------------------------------------------------------------------
    def run(self, sessions: Iterable[Session]) -> RunEnd:
        """Simulate every session to completion (or ``max_sim_time_s``); return its end.

        A run that reaches the request cap or the memory limit ends there (after the
        step in flight): :attr:`RunEnd.stopped` holds the reason.  The records hold every
        request received, those still running or waiting as ``unfinished`` rows.
        """
        if threading.current_thread() is not threading.main_thread():
            return self._run(sessions)
        threshold = gc.get_threshold()
        # NOTE: the run allocates millions of short-lived containers (plan items, block
        # keys, runs) and few cycles: the young-generation collections they trigger cost
        # ~7 % of a run at CPython's default threshold (700); the settings come back after.
        gc.set_threshold(max(threshold[0], GC_YOUNG_THRESHOLD), *threshold[1:])
        try:
            return self._run(sessions)
        finally:
            gc.set_threshold(*threshold)

    def _run(self, sessions: Iterable[Session]) -> RunEnd:
        self.env.process(self._guarded(self._feeder(iter(sessions))))
        driver = self.env.process(self._guarded(self._driver()))
        self.env.process(self._guarded(self._sampler()))
        stops = [driver, self._abort]
        if self.max_sim_time_s is not None:
            stops.append(self.env.timeout(self.max_sim_time_s))
        self.env.run(until=self.env.any_of(stops))
        if self._error is not None:
            raise self._error
        self._finished = True
        for req in self._live.values():
            self.recorder.request_done(req)  # NOTE: not done: an unfinished row
        self._live.clear()
        if self._stopping is None:  # NOTE: else sampled when the bound was hit (module doc)
            self.recorder.sample(self.env.now, self.scheduler.memory())
        if self.progress is not None:
            self.progress(self.env.now, self.requests_done)
        return RunEnd(self.env.now, self._stopping)  # NOTE: a bound, not a failure
