"""The interfaces between an eviction-family policy config and the slot evictor.

A config (kvsim.policies.eviction, kvsim.policies.quantization) is an
:class:`EvictionPolicy`: it declares its pinned head, its step size and its host
copy, says how many decode steps it stays quiet, and on each busy slot calls back the
one :class:`Evictor` transition it stands for (kvsim.policies.slot_evict).

NOTE: a config holds no run state; everything that changes lives in the evictor.
"""

from __future__ import annotations

from typing import Protocol

from kvsim.core.kv.slots import Slot


class Evictor(Protocol):
    """The per-token transitions a policy may ask for on one slot (after a step)."""

    def drop_window(self, slot: Slot, now_s: float, write_back: bool) -> None: ...

    def drop_over_budget(self, slot: Slot, now_s: float, budget_tokens: int,
                         block_tokens: int) -> None: ...

    def demote_old(self, slot: Slot, now_s: float) -> None: ...


class EvictionPolicy(Protocol):
    """What the evictor, the recall proxy and the builder read of an eviction config."""

    @property
    def kind(self) -> str: ...
    @property
    def sink_tokens(self) -> int: ...
    @property
    def pin_system_prompt(self) -> bool: ...
    @property
    def pin_turn_boundaries(self) -> bool: ...
    @property
    def boundary_tokens(self) -> int: ...
    @property
    def chunk_tokens(self) -> int: ...
    @property
    def host_backed(self) -> bool: ...  # demoted tokens keep a full copy on host
    @property
    def page_tokens(self) -> int: ...  # recall granularity (1: token-exact)
    @property
    def size_field(self) -> str: ...  # the key an over-size error names

    def size_tokens(self) -> int:
        """The value of :attr:`size_field`: the window or budget that must fit a slot."""

    def global_budget_tokens(self) -> int | None:
        """A token budget over all slots together (largest first); None: per slot."""

    def keep_recent(self) -> int:
        """The newest tokens a slot keeps untouched."""

    def quiet_steps(self, n: int, pin: int, wm: int) -> int:
        """Decode steps before it may act on a slot of ``n`` tokens (``pin``: the pinned
        head, ``wm``: the demotion watermark)."""

    def act(self, evictor: Evictor, slot: Slot, now_s: float) -> None:
        """Ask ``evictor`` for this policy's transition on ``slot``."""
