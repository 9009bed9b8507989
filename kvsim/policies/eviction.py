"""Eviction policies on a session's KV (docs/reference/kv-policies.md §1, §3, §6.3).

- ``sliding_window`` — StreamingLLM (§1.1): keep the pinned head (``sink_tokens``
  attention sinks, and the system prompt when ``pin_system_prompt``) plus the most
  recent ``window_tokens``; older tokens are DROPPED — or, with ``write_back``,
  copied to host RAM first (OFFLOADED) so a later reference can recall them.
- ``score_eviction`` — budgeted H2O/SnapKV-like eviction (§1.2, §1.5): above
  ``budget_tokens`` (beyond the pinned head), drop the lowest-importance blocks
  outside the protected ``recent_tokens``.  Importance model (documented
  assumption): the trace's reference structure stands in for accumulated
  attention — a segment that earlier turns referred back to is a *heavy hitter*
  (score = number of references to it so far), everything else is *dormant*;
  ties go by recency (older first).  Dormant exact spans — a name said once — are
  therefore evicted first, which is the failure Transactional Attention and
  ArkVale measure (§4.2, §6.4 "dormant exact spans").  ``scope: global`` applies
  the budget to all sessions' KV together, evicting from the largest session.
- ``recoverable_eviction`` — the project's recoverable eviction / SpeCache (§3.7):
  tokens older than the window are demoted on the GPU to ``cache_type`` with the
  full-precision copy written to host (QUANT_BACKED); a reference to them recalls
  the full copy over PCIe (RECOVERED, paying the transfer).

Pinned (kv-policies §6.2): ``sink_tokens`` sinks, the system prompt
(``pin_system_prompt``) and the first ``boundary_tokens`` of every message
(``pin_turn_boundaries``, §1.8: evicting boundaries collapses recall).

Windows act in ``chunk_tokens`` steps (a window holds between W and W + chunk
tokens), as engines evict whole pages rather than one token per step.
"""

from __future__ import annotations

from fractions import Fraction
from typing import ClassVar, Literal

from pydantic import Field

from kvsim.core.kv.slots import Slot
from kvsim.model.dtypes import bytes_per_element
from kvsim.policies.base import Evictor
from kvsim.policies.registry import PolicyBase, register_policy


class _Pinned(PolicyBase):
    evicts: ClassVar[bool] = True
    host_backed: ClassVar[bool] = False  # True: demoted tokens keep a full copy on host
    demotes: ClassVar[bool] = False  # True: old tokens are re-stored at fewer bits on the GPU
    size_field: ClassVar[str] = "window_tokens"  # the key an over-size error names
    sink_tokens: int = Field(4, ge=0, description="attention sinks kept (StreamingLLM: 4)")
    pin_system_prompt: bool = Field(True, description="never evict the system prompt")
    chunk_tokens: int = Field(256, gt=0, description="evict/demote in steps of this many tokens")
    pin_turn_boundaries: bool = Field(True, description="never evict a message's first tokens")
    boundary_tokens: int = Field(4, ge=0, description="pinned tokens per message (role header)")

    @property
    def page_tokens(self) -> int:
        return 1

    def global_budget_tokens(self) -> int | None:
        return None


@register_policy
class SlidingWindowConfig(_Pinned):
    kind: Literal["sliding_window"] = "sliding_window"
    window_tokens: int = Field(gt=0, description="recent tokens kept (W)")
    write_back: bool = Field(False, description="copy evicted tokens to host (recallable)")

    def keep_recent(self) -> int:
        return self.window_tokens

    def size_tokens(self) -> int:
        return self.window_tokens

    def needs_host(self) -> bool:
        return self.write_back

    def quiet_steps(self, n: int, pin: int, wm: int) -> int:
        """Decode steps before the window may act on a slot of ``n`` tokens."""
        return pin + self.window_tokens + self.chunk_tokens - n

    def act(self, evictor: Evictor, slot: Slot, now_s: float) -> None:
        evictor.drop_window(slot, now_s, self.write_back)


@register_policy
class ScoreEvictionConfig(_Pinned):
    kind: Literal["score_eviction"] = "score_eviction"
    budget_tokens: int = Field(gt=0, description="tokens kept beyond the pinned head")
    recent_tokens: int = Field(256, ge=0, description="newest tokens never evicted")
    block_tokens: int = Field(16, gt=0, description="eviction granularity (a page)")
    scope: Literal["session", "global"] = "session"
    size_field: ClassVar[str] = "budget_tokens"

    @property
    def page_tokens(self) -> int:
        return self.block_tokens

    def global_budget_tokens(self) -> int | None:
        return self.budget_tokens if self.scope == "global" else None

    def keep_recent(self) -> int:
        return self.recent_tokens

    def size_tokens(self) -> int:
        return self.budget_tokens

    def quiet_steps(self, n: int, pin: int, wm: int) -> int:
        """Decode steps before the budget may act on a slot of ``n`` tokens."""
        return pin + self.budget_tokens + self.chunk_tokens - n

    def act(self, evictor: Evictor, slot: Slot, now_s: float) -> None:
        evictor.drop_over_budget(slot, now_s, self.budget_tokens, self.block_tokens)


@register_policy
class RecoverableEvictionConfig(_Pinned):
    kind: Literal["recoverable_eviction"] = "recoverable_eviction"
    window_tokens: int = Field(gt=0, description="recent tokens kept at full precision")
    cache_type: str = Field("q4_0", description="GPU storage type of demoted tokens")
    block_tokens: int = Field(16, gt=0, description="recall granularity (a page)")
    host_backed: ClassVar[bool] = True  # demoted tokens keep a full copy on host
    demotes: ClassVar[bool] = True

    @property
    def page_tokens(self) -> int:
        return self.block_tokens

    def keep_recent(self) -> int:
        return self.window_tokens

    def size_tokens(self) -> int:
        return self.window_tokens

    def needs_host(self) -> bool:
        return True

    def bytes_per_element(self) -> Fraction:
        """Exact bytes per stored value of the demoted tokens (kvsim.model.dtypes)."""
        return bytes_per_element(self.cache_type)

    def quiet_steps(self, n: int, pin: int, wm: int) -> int:
        """Decode steps before a demotion may act (``wm``: the slot's watermark)."""
        return wm + self.window_tokens + self.chunk_tokens - n - 1

    def act(self, evictor: Evictor, slot: Slot, now_s: float) -> None:
        evictor.demote_old(slot, now_s)


def score_victims(cands: list[tuple[str, int, int]], hits: dict[str, int], need: int,
                  block_tokens: int) -> list[tuple[str, int, int]]:
    """Blocks to evict from candidate pieces (oldest first) until ``need`` tokens.

    Blocks are ranked by (references to their segment so far, age): dormant first,
    older first.  Returns content ranges ``(sid, lo, hi)``.
    """
    blocks: list[tuple[int, int, str, int, int]] = []
    order = 0
    for sid, s, e in cands:
        a = s
        while a < e:
            b = min(e, (a // block_tokens + 1) * block_tokens)
            blocks.append((hits.get(sid, 0), order, sid, a, b))
            order += 1
            a = b
    blocks.sort()
    out: list[tuple[str, int, int]] = []
    got = 0
    for _, _, sid, a, b in blocks:
        if got >= need:
            break
        out.append((sid, a, b))
        got += b - a
    return out
