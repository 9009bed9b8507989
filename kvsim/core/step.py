"""Value types exchanged between schedulers, the engine loop and policy hooks.

One engine iteration is *schedule → run → postprocess* (nano-vllm / vLLM v1): a
scheduler turns its queues into a frozen :class:`StepPlan`, the engine asks the
latency model how long the plan's :class:`BatchShape` takes and advances the clock,
then hands the plan back to the scheduler to apply.  Nothing here knows SimPy.

A :class:`StepHook` is the seam for KV policies (kvsim.policies: quantize / offload /
evict transitions, PCIe transfers): the engine calls every hook after each step
with the scheduler and the time, and a hook may return extra seconds of stall
(e.g. a blocking restore) that the engine adds before the next step.  Hooks also
declare the next time they want to act so a fast-forward (docs/design/fast-forward.md) never jumps
across a policy trigger.

:class:`Scheduler` is what the engine and its fast-forward call on a scheduler
(:class:`~kvsim.core.scheduler.PagedScheduler`, :class:`~kvsim.core.slot_scheduler.SlotScheduler`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from kvsim.core.requests import Request
from kvsim.latency.base import BatchShape

if TYPE_CHECKING:
    from kvsim.core.policy import SchedulerPolicy


class ScheduledItem(NamedTuple):
    """``num_new_tokens`` of ``req`` computed in this step on top of ``context_tokens``.

    NOTE: a named tuple (immutable, built in C): one is made per request and step.
    """

    req: Request
    num_new_tokens: int
    context_tokens: int
    is_decode: bool


@dataclass(frozen=True, slots=True)
class StepPlan:
    items: tuple[ScheduledItem, ...]
    batch: BatchShape
    extra_s: float = 0.0  # stall inside the step (e.g. restoring a prompt cache)

    @property
    def is_decode_only(self) -> bool:
        return not self.batch.prefill_tokens


def make_plan(items: list[ScheduledItem], extra_s: float = 0.0) -> StepPlan:
    pre_n: list[int] = []
    pre_c: list[int] = []
    dec: list[int] = []
    for _, n, c, decode in items:
        if decode:
            dec.append(c)
        else:
            pre_n.append(n)
            pre_c.append(c)
    batch = BatchShape(prefill_tokens=tuple(pre_n), prefill_context=tuple(pre_c),
                       decode_context=tuple(dec))
    return StepPlan(tuple(items), batch, extra_s)


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """A discrete event for ``events.parquet`` (preempt, fail, evict, restore, ...)."""

    time_s: float
    kind: str
    request_id: str = ""
    detail: str = ""
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class MemoryState:
    """KV memory of the engine at one instant (bytes) and its queue lengths."""

    kv_reserved_bytes: int
    kv_allocated_bytes: int
    kv_cached_bytes: int
    running: int
    waiting: int
    host_kv_bytes: int = 0
    kv_quant_bytes: int = 0  # GPU KV stored below f16 (KV policies, static quantized cache)


class Scheduler(Protocol):
    """What the engine and its fast-forward call on a scheduler.

    NOTE: ``events`` is the scheduler's pending :class:`EngineEvent` list, which the
    engine drains into its records.  A scheduler that cannot fast-forward returns 0
    from ``decode_stretch_limit`` (its steps then all run one by one).
    """

    events: list[EngineEvent]
    preemptions: int
    policy: SchedulerPolicy

    @property
    def evictions(self) -> int:
        """Cached prefix blocks the KV pool evicted to make room (the summary's
        ``evictions``)."""
        ...

    @property
    def has_work(self) -> bool:
        """Anything running or waiting."""
        ...

    def add_request(self, req: Request, now_s: float) -> bool:
        """Queue ``req``; False when it failed at once (already finished)."""
        ...

    def schedule(self, now_s: float) -> StepPlan | None:
        """The next step's plan, or None when there is nothing to run."""
        ...

    def complete(self, plan: StepPlan, now_s: float, dt_s: float = math.nan) -> list[Request]:
        """Apply ``plan`` (it ran ``dt_s`` and ended at ``now_s``); return the finished."""
        ...

    def memory(self) -> MemoryState:
        ...

    def decode_stretch_limit(self, plan: StepPlan) -> int:
        """How many decode-only steps from ``plan`` on may be applied at once (module
        doc of kvsim.core.fastforward); 0 = none."""
        ...

    def advance_decode(self, plan: StepPlan, times: list[float], dts: list[float],
                       finish: bool = False
                       ) -> tuple[list[int], list[int], MemoryState, list[Request]]:
        """Apply ``len(times) − 1`` decode steps of ``plan`` at once: the KV bytes
        allocated and cached during each step, the state after them and (``finish``:
        the last step completed too) the requests it finished."""
        ...


class StepHook(Protocol):
    """A policy that acts between engine steps (kvsim.policies registers concrete ones)."""

    def after_step(self, scheduler: Scheduler, plan: StepPlan, now_s: float) -> float:
        """Act on the pools after ``plan`` ran; return extra stall seconds (≥ 0)."""
        ...

    def next_trigger_s(self, now_s: float) -> float:
        """Earliest time this hook wants to act again (``math.inf`` = never)."""
        ...

    def quiet_steps(self, plan: StepPlan) -> float:
        """Steps from ``plan`` on after each of which ``after_step`` does nothing and
        returns no stall (``math.inf``: it acts only at ``next_trigger_s``)."""
        ...


class NullHook:
    """A hook that never acts (the default: no policies)."""

    def after_step(self, scheduler: Scheduler, plan: StepPlan, now_s: float) -> float:
        return 0.0

    def next_trigger_s(self, now_s: float) -> float:
        return math.inf

    def quiet_steps(self, plan: StepPlan) -> float:
        return math.inf
