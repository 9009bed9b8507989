"""Fast-forward of decode-only stretches: apply many deterministic decode steps in one jump.

:class:`FastForward` takes the step the driver is about to run (step 0 of a stretch, already
scheduled), applies ``J`` steps through the scheduler's ``advance_decode`` with step times from
``decode_steps_s``, and runs the step at the scheduler's own boundary inline; the driver
resumes at the returned instant. A stretch stops before any pending SimPy event (except the
sampler's tick), a hook's ``next_trigger_s`` or ``quiet_steps``; a stall is jumped only when
``steady_extra_s``; a step straddling a SimPy event is folded in (``fold=True``).

NOTE: the contracts are :class:`~kvsim.core.step.Scheduler`,
:class:`~kvsim.core.step.StepHook`, :class:`~kvsim.latency.base.LatencyModel`;
``next_trigger_s(now)`` promises that ``after_step`` does nothing and returns no stall before
that time; ``quiet_steps`` promises the same for that many steps.
NOTE: step times accumulate as SimPy does (``t + dt`` in sequence): both fidelities agree to
≤ 1e-12 relative; instants computed ahead go on the heap as they are. Memory samples inside a
stretch come from :meth:`Stretch.memory_at`.
Design: docs/design/fast-forward.md (after docs/design/DESIGN.md §4).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate

import numpy as np

from kvsim.core.requests import Request
from kvsim.core.step import ScheduledItem, Scheduler, StepHook, StepPlan
from kvsim.core.stretch_memory import Stretch, join_stretches
from kvsim.latency.base import BatchShape, LatencyModel
from kvsim.metrics.records import Recorder

MAX_STRETCH_CELLS = 1 << 18  # NOTE: caps sequences × steps of one stretch's numpy arrays
SMALL_STEPS = 32  # NOTE: shorter stretches take their step times in scalar Python


def advanced_plan(plan: StepPlan, steps: int) -> StepPlan:
    """The decode-only plan ``steps`` steps after ``plan`` (every context + steps).

    NOTE: equal to ``make_plan`` of the advanced items, built without its partition;
    it keeps ``plan``'s steady per-step extra (FastForward.steady_extra_s) and its
    demoted tokens' saved KV read bytes.
    """
    new = tuple.__new__  # NOTE: ScheduledItem's own constructor, minus its Python frame
    items = tuple([new(ScheduledItem, (r, 1, c + steps, True)) for r, _, c, _ in plan.items])
    batch = BatchShape(decode_context=tuple([i[2] for i in items]),
                       kv_read_saved_bytes=plan.batch.kv_read_saved_bytes)
    return StepPlan(items, batch, plan.extra_s)


class FastForward:
    """Plans and applies decode stretches for one engine."""

    def __init__(self, scheduler: Scheduler, latency: LatencyModel, hooks: Sequence[StepHook],
                 recorder: Recorder) -> None:
        self.scheduler = scheduler
        self.latency = latency
        self.hooks = list(hooks)
        self.recorder = recorder
        self.stretch: Stretch | None = None
        self.stretches = 0
        self.steps_skipped = 0
        self.fold = True  # run the step an arrival falls into inside the stretch (module doc)
        self.folded = 0  # stretches that did
        self.through = True  # run through completions (module doc)
        self.finished: list[tuple[float, Request]] = []  # (time, request) finished in the jump
        self.idle_after = False
        # seconds after a request finishes that its session may submit the next turn
        # (the engine knows; 0 = at once, the safe default)
        self.follow_s: Callable[[Request], float] = lambda req: 0.0

    def _step_times(self, contexts: tuple[int, ...], steps: int, extra_s: float = 0.0,
                    saved: float = 0.0) -> list[float]:
        """Durations of ``steps`` decode steps, each ``extra_s`` longer (the plan's steady
        stall, added as the driver adds ``plan.extra_s`` to a step time), reading
        ``saved`` bytes less KV (the batch's ``kv_read_saved_bytes``)."""
        lat = self.latency
        # the same floats, no numpy (None: the model has no scalar path)
        dts = lat.decode_steps_list(contexts, steps, saved) if steps <= SMALL_STEPS else None
        if dts is None:
            # NOTE: a calibrated model counts clamped steps; count only the steps we use.
            before = lat.clamped_steps
            arr = lat.decode_steps_s(np.array(contexts, dtype=np.int64), steps, saved)
            if before is not None:
                lat.clamped_steps = before
            dts = np.asarray(arr, dtype=np.float64).tolist()
        return [d + extra_s for d in dts] if extra_s else dts

    def _first_step_s(self, plan: StepPlan) -> float:
        lat = self.latency
        before = lat.clamped_steps
        dt = lat.step_time_s(plan.batch)
        if before is not None:
            lat.clamped_steps = before
        return dt

    def _segment(self, plan: StepPlan, now_s: float, quiet_s: float, hard_s: float,
                 stop_s: float, quiet_steps: float = math.inf
                 ) -> tuple[int, bool, bool, Stretch | None, list | None]:
        """One numpy stretch from ``plan`` at ``now_s``:
        ``(steps, folded, at_limit, part, done)``.

        ``quiet_s`` is the next SimPy event (foldable), ``hard_s`` every other bound;
        ``at_limit``: the stretch ended at the scheduler's own boundary (step ``J`` may
        finish a request); ``part`` is None when no step was applied.  ``done`` is not
        None when step ``J`` was completed too (through completions, ending before
        every bound: what the inline step would do, in the same pass): the requests
        it finished; the next plan is then the scheduler's to make.  At most
        ``quiet_steps`` steps are applied before step ``J`` (the hooks' bound); every
        step takes the plan's steady extra seconds on top of its step time.
        """
        bound_s = min(quiet_s, hard_s)
        if bound_s <= now_s:
            return 0, False, False, None, None
        dt0 = math.inf
        if math.isfinite(bound_s):
            # NOTE: cheap exit before the stretch limit: step 1 must start before the
            # bound (the scalar step time may differ from the numpy one by a rounding;
            # a borderline stretch then just runs as single steps, which is exact).
            dt0 = self._first_step_s(plan) + plan.extra_s
            if not now_s + dt0 < bound_s:
                return 0, False, False, None, None
        sched_limit = self.scheduler.decode_stretch_limit(plan)
        n = len(plan.items)
        limit = min(sched_limit, MAX_STRETCH_CELLS // max(n, 1), quiet_steps)
        if limit < 1:
            return 0, False, sched_limit < 1, None, None
        ctx = plan.batch.decode_context
        # NOTE: one step more than the limit: step J itself, when it can be completed here
        n_dts = limit + 1
        if 0 < dt0 < math.inf:
            n_dts = min(n_dts, int((bound_s - now_s) / dt0) + 2)
        dts = self._step_times(ctx, n_dts, plan.extra_s, plan.batch.kv_read_saved_bytes)
        times = list(accumulate(dts, initial=now_s))  # NOTE: sequential, as SimPy adds
        steps = min(bisect_left(times, bound_s, 1) - 1, limit)
        if steps < 1:
            return 0, False, False, None, None
        # fold step J when a SimPy event (an arrival) cut the stretch inside it
        fold = self.fold and steps < limit and quiet_s <= times[steps + 1] < min(hard_s, stop_s)
        at_limit = steps == sched_limit
        # complete step J here when _inline_step would run it (it ends before every bound)
        finish = at_limit and self.through and steps < n_dts and times[steps + 1] < bound_s
        applied = steps + fold + finish
        times = times[:applied + 1]
        if self.latency.clamped_steps is not None:
            # count the clamped steps used
            self.latency.decode_steps_s(np.array(ctx, dtype=np.int64), applied)
        # NOTE: only allocated / cached (/ quantized) bytes change inside a stretch; the
        # state after it gives every other column (Stretch.memory_at)
        alloc, cached, after, done = self.scheduler.advance_decode(plan, times, dts, finish)
        self.recorder.step(times[0], times[-1], 0, n * applied, n, steps=applied)
        self.steps_skipped += steps
        self.folded += fold
        return steps, fold, at_limit, Stretch(times, after, alloc, cached), \
            done if finish else None

    def jump(self, plan: StepPlan, now_s: float, bound_s: float, stop_s: float = math.inf
             ) -> tuple[StepPlan, float, bool] | None:
        """Apply the stretch starting with ``plan`` at ``now_s``.

        ``bound_s`` is the next SimPy boundary event, ``stop_s`` the end of the run.
        Returns ``(plan, end time, folded)``: unfolded, ``plan`` is still to run from
        the end time; folded, it ran too (the driver runs the hooks and schedules).
        ``None`` when nothing can be skipped.  Requests that finished inside the
        stretch are in :attr:`finished` as ``(time, request)``; :attr:`idle_after`
        says the stretch ended with a ``schedule`` that returned nothing.

        Through completions (module doc): a step at the scheduler's boundary, and any
        step that is not a plain decode, runs inline if it ends before every bound;
        then, unless a hook may act (its trigger time, or its quiet steps are used up:
        the driver runs it), the scheduler's ``schedule`` gives the next plan.  A
        finished request's next turn, ``follow_s(req)`` later, bounds the rest.
        """
        self.finished = []
        self.idle_after = False
        quiet_s, hard_s = bound_s, self._hook_s(now_s)
        parts: list[Stretch] = []
        t = now_s
        while True:
            part, done, steps = None, None, 0
            quiet = self._quiet_steps(plan)
            if plan.is_decode_only and self._steady(plan):
                steps, fold, at_limit, part, done = self._segment(plan, t, quiet_s, hard_s,
                                                                  stop_s, quiet)
                if part is not None:
                    parts.append(part)
                    t = part.times[-1]
                    if done is None:
                        plan = advanced_plan(plan, steps)
                    if fold:
                        return self._ended(parts, plan, t, True)
                if not at_limit:
                    break
            bulk = done is not None  # step J was completed by the segment (else inline)
            if not bulk:
                ran = self._inline_step(plan, t, min(quiet_s, hard_s), part, parts) \
                    if self.through else None
                if ran is None:
                    break
                t, done = ran
            hard_s = min(hard_s, self._finished_at(t, done))
            # NOTE: step `steps` of the plan just ran: a hook may act after it
            if self._hook_s(t) <= t or steps >= quiet:
                return self._ended(parts, advanced_plan(plan, steps) if bulk else plan, t, True)
            nxt = self.scheduler.schedule(t)
            self.recorder.drain(self.scheduler.events)
            if nxt is None:
                self.idle_after = True
                return self._ended(parts, plan, t, True)
            hard_s = min(hard_s, self._hook_s(t))
            plan = nxt
        if not parts:
            return None
        return self._ended(parts, plan, t, False)

    def _quiet_steps(self, plan: StepPlan) -> float:
        """Steps from ``plan`` on after each of which no hook acts (their ``quiet_steps``)."""
        return min((h.quiet_steps(plan) for h in self.hooks), default=math.inf)

    def _steady(self, plan: StepPlan) -> bool:
        """Is ``plan``'s extra the same for every decode step of its batch (none, or the
        scheduler policy's ``steady_extra_s``), so a stretch may add it to each step, and
        is it past the decode steps the latency model prices above steady state after a
        prompt step (``settle_steps``)?"""
        if 0 <= plan.batch.after_prompt < self.latency.settle_steps:
            return False
        if not plan.extra_s:
            return True
        return self.scheduler.policy.steady_extra_s(plan) == plan.extra_s

    def _hook_s(self, t: float) -> float:
        """The earliest time a hook wants to act, seen from ``t``."""
        return min((h.next_trigger_s(t) for h in self.hooks), default=math.inf)

    def _finished_at(self, t: float, done: list[Request]) -> float:
        """Record requests finished at ``t``; return the first follow-up turn's time."""
        first = math.inf
        for req in done:
            self.finished.append((t, req))
            first = min(first, t + self.follow_s(req))
        return first

    def _inline_step(self, plan: StepPlan, t: float, bound_s: float, part: Stretch | None,
                     parts: list[Stretch]) -> tuple[float, list[Request]] | None:
        """Run ``plan`` as the driver would (scalar step time, the scheduler's own
        ``complete``) if it ends before ``bound_s``: ``(end, finished)``, else None.

        ``part`` is the stretch just applied (its final state is this step's memory).
        """
        dt = self._first_step_s(plan) + plan.extra_s
        end = t + dt if dt > 0 else t
        if not end < bound_s:
            return None
        if self.latency.clamped_steps is not None:
            self.latency.step_time_s(plan.batch)  # count it, as the driver would
        mem = part.base if part is not None else self.scheduler.memory()
        done = self.scheduler.complete(plan, end, dt)
        b = plan.batch
        self.recorder.step(t, end, sum(b.prefill_tokens), len(b.decode_context),
                           len(plan.items))
        parts.append(Stretch([t, end], mem, [mem.kv_allocated_bytes], [mem.kv_cached_bytes]))
        return end, done

    def _ended(self, parts: list[Stretch], plan: StepPlan, end_s: float, folded: bool
               ) -> tuple[StepPlan, float, bool]:
        self.stretch = join_stretches(parts)
        self.stretches += 1
        return plan, end_s, folded
