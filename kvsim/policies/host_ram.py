"""The slot engine's host RAM cache, priced at a slot's real bytes under a demotion policy.

llama.cpp's ``--cache-ram`` (and ``idle_offload``, which writes to it) serializes a
slot's KV as it sits on the GPU: under ``kivi`` / ``recoverable_eviction`` the demoted
tokens are stored at their quantized size (b bits + scales), the rest — the
full-precision residual or window — at f16.  :class:`QuantAwarePromptCache` is
kvsim.core.kv.slots' :class:`PromptCache` whose entries carry those bytes
(``bytes_of``, :meth:`kvsim.policies.runtime.PolicyRuntime.state_bytes`), so the
``cache_save`` / ``idle_save`` / ``offload`` events, the d2h/h2d transfers, the host
budget and ``offload_bytes`` / ``restore_bytes`` all agree.

NOTE: the parent's ``save`` sizes an entry at ``n × bytes_per_token`` before it is
added: its "state larger than the whole cache" skip and its make-room eviction still
use that f16 size (so they may evict an older entry more than needed); the entry
itself, the running total and what :meth:`save` returns are the real bytes.  An exact
fix is a ``size_of(seq)`` hook in kvsim.core.kv.slots.PromptCache.save.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kvsim.core.kv.slots import CacheEntry, PromptCache
from kvsim.core.requests import TokenSeq


class QuantAwarePromptCache(PromptCache):
    """A :class:`PromptCache` whose entries are sized by ``bytes_of(seq)``."""

    def __init__(self, base: PromptCache, bytes_of: Callable[[TokenSeq], int]) -> None:
        super().__init__(base.limit_bytes, base.bytes_per_token, base.limit_tokens)
        assert not base.entries, "installed before any save"
        self.bytes_of = bytes_of
        self.last_taken: CacheEntry | None = None

    def save(self, seq: TokenSeq, now_s: float) -> int:
        size = super().save(seq, now_s)
        if not size:
            return 0
        real = self.bytes_of(seq)
        if real == size:
            return size
        # NOTE: the parent's save added this entry last (its trim may have dropped it)
        if self.entries and self.entries[-1].seq is seq:
            self.entries[-1] = dataclasses.replace(self.entries[-1], bytes=real)
            self._bytes += real - size
        return real

    def take_best(self, prompt: TokenSeq, slot_lcp: int, slot_tokens: int,
                  max_tokens: int | None = None) -> CacheEntry | None:
        """The parent's choice, remembered: a restore of quantized bytes recomputes
        its *tokens* (``restore: auto``), which its bytes no longer tell."""
        self.last_taken = super().take_best(prompt, slot_lcp, slot_tokens, max_tokens)
        return self.last_taken

