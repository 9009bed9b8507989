"""The scheduler → policy seam: what a KV policy may do inside a scheduler's step.

Both schedulers (:mod:`kvsim.core.scheduler`, :mod:`kvsim.core.slot_scheduler`) own a
``policy`` attribute and call it at fixed points, so the layering is explicit and a
policy can be unit-tested against either scheduler without SimPy:

- ``on_admit(req, now_s)`` — a request arrives, before the scheduler checks or
  queues it; the policy may rewrite its prompt (spans a window dropped are gone);
- ``before_schedule(now_s)`` — at the start of every ``schedule`` (time-driven
  transitions: an idle slot offloaded at its deadline);
- ``after_schedule(plan, now_s)`` — the plan the scheduler built; the policy may
  return it with more ``extra_s`` (a recall over PCIe, dequantization);
- ``on_host_save(nbytes, now_s) -> float`` — the engine writes ``nbytes`` of KV to
  host RAM (llama.cpp's prompt cache); returns the stall: llama-server serializes the
  taken-over slot on its loop thread before the new prompt runs, so the copy is on
  the critical path (the restore that may follow starts after it);
- ``restore_time_s(nbytes, now_s)`` — stall for a blocking host→device restore of
  ``nbytes`` (the policy may recompute instead when that is cheaper);
- ``memory(state)`` — the scheduler's :class:`MemoryState` adjusted for what the
  policy changed (quantized bytes, host copies);
- ``steady_extra_s(plan)`` — the extra seconds ``after_schedule`` gives every decode
  step of ``plan``'s batch until the next hook action, or None when they are not the
  same from step to step (fast-forward jumps a stalled plan only when they are).

- ``ram_cache(ram)`` — once, when a slot scheduler is built: the RAM prompt cache as
  this policy prices its entries (a demoting policy stores quantized bytes).

A scheduler builds its policy last in its constructor, from a :data:`PolicyFactory`
given to it (``factory(scheduler)``), so it is complete before it runs.

The default :class:`NullPolicy` changes nothing.  Policies that act *between*
steps (windows, budgets) are step hooks (:class:`kvsim.core.step.StepHook`) with an
exact ``next_trigger_s``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from kvsim.core.requests import Request
from kvsim.core.step import MemoryState, StepPlan

if TYPE_CHECKING:
    from kvsim.core.kv.slots import PromptCache
    from kvsim.core.step import Scheduler


class SchedulerPolicy(Protocol):
    """What a scheduler calls on its policy (the module doc lists when)."""

    def on_admit(self, req: Request, now_s: float) -> None: ...

    def before_schedule(self, now_s: float) -> None: ...

    def after_schedule(self, plan: StepPlan | None, now_s: float) -> StepPlan | None: ...

    def on_host_save(self, nbytes: int, now_s: float) -> float: ...

    def restore_time_s(self, nbytes: int, now_s: float) -> float: ...

    def memory(self, state: MemoryState) -> MemoryState: ...

    def steady_extra_s(self, plan: StepPlan) -> float | None: ...

    def ram_cache(self, ram: PromptCache) -> PromptCache: ...


PolicyFactory = Callable[["Scheduler"], SchedulerPolicy]
"""Builds a scheduler's policy from the scheduler (called at the end of its constructor)."""


class NullPolicy:
    """No policy: restores cost ``restore_s(nbytes)``, saves ``save_s(nbytes)``,
    everything else is unchanged."""

    def __init__(self, restore_s: Callable[[int], float] = lambda n: 0.0,
                 save_s: Callable[[int], float] = lambda n: 0.0) -> None:
        self.restore_s = restore_s
        self.save_s = save_s

    def on_admit(self, req: Request, now_s: float) -> None:
        return None

    def before_schedule(self, now_s: float) -> None:
        return None

    def after_schedule(self, plan: StepPlan | None, now_s: float) -> StepPlan | None:
        return plan

    def on_host_save(self, nbytes: int, now_s: float) -> float:
        return self.save_s(nbytes) if nbytes > 0 else 0.0

    def restore_time_s(self, nbytes: int, now_s: float) -> float:
        return self.restore_s(nbytes)

    def memory(self, state: MemoryState) -> MemoryState:
        return state

    def steady_extra_s(self, plan: StepPlan) -> float | None:
        return None  # NOTE: adds no extra of its own beyond restores (not steady)

    def ram_cache(self, ram: PromptCache) -> PromptCache:
        return ram
