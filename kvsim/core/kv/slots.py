"""llama.cpp / Ollama slots and the host-RAM prompt cache, engines.md §3.1, §3.4, §4.5.

A server has ``parallel`` slots.  Each slot keeps the KV of its last sequence
(prompt + output − 1 tokens) so a follow-up turn computes only what differs.

- *Non-unified* (``--no-kv-unified``, Ollama): each slot owns ``slot_tokens`` cells.
- *Unified* (``-kvu``): all slots draw from one pool of ``pool_cells``; any slot may
  grow to the whole pool, idle slots' caches occupy cells until purged.

Slot choice (``--slot-prompt-similarity``): the idle slot with the longest common
prefix if ``LCP / len(prompt)`` exceeds the threshold, else the least recently used
idle slot; no idle slot → the request is deferred.

The host-RAM prompt cache (``--cache-ram``) stores whole slot states: saved when a
slot is taken over and would keep < 50 % of its tokens; on a new request the entry
that beats the slot on both kept fraction and similarity (kept fraction ≥ 0.25) is
restored; entries contained in a newer one are dropped; oldest-first eviction above
the byte limit, always keeping at least one entry.

NOTE: ``used_cells == sum(slot.n_tokens)`` and never exceeds ``pool_cells``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsim.core.requests import Piece, Request, TokenSeq, common_prefix, seq_len

SAVE_BELOW_KEEP = 0.5   # a takeover keeping less than this fraction saves the slot
RESTORE_MIN_KEEP = 0.25  # cache entries keeping less than this are ignored


@dataclass(eq=False)
class Slot:
    slot_id: int
    cache: list[Piece] = field(default_factory=list)  # tokens whose KV the slot holds
    n_tokens: int = 0
    req: Request | None = None
    last_used_s: float = -1.0

    @property
    def idle(self) -> bool:
        return self.req is None

    def clear(self) -> None:
        self.cache, self.n_tokens = [], 0

    def keep(self, n: int) -> None:
        """Truncate the slot's KV to its first ``n`` tokens."""
        out: list[Piece] = []
        left = n
        for sid, s, e in self.cache:
            if left <= 0:
                break
            take = min(e - s, left)
            out.append((sid, s, s + take))
            left -= take
        self.cache, self.n_tokens = out, min(n, self.n_tokens)


@dataclass(frozen=True)
class CacheEntry:
    seq: TokenSeq
    n_tokens: int
    bytes: int
    saved_s: float


class PromptCache:
    """Host-RAM cache of slot states (llama.cpp ``--cache-ram``)."""

    def __init__(self, limit_bytes: int | None, bytes_per_token: int) -> None:
        self.limit_bytes = limit_bytes  # None = unlimited, 0 = off
        self.bytes_per_token = bytes_per_token
        self.entries: list[CacheEntry] = []  # oldest first

    @property
    def enabled(self) -> bool:
        return self.limit_bytes is None or self.limit_bytes > 0

    @property
    def total_bytes(self) -> int:
        return sum(e.bytes for e in self.entries)

    def save(self, seq: TokenSeq, now_s: float) -> int:
        """Store a slot state; return the bytes written (0 when off or empty)."""
        n = seq_len(seq)
        if not self.enabled or n == 0:
            return 0
        self.entries = [e for e in self.entries if common_prefix(e.seq, seq) < e.n_tokens]
        entry = CacheEntry(seq, n, n * self.bytes_per_token, now_s)
        self.entries.append(entry)
        while self.limit_bytes is not None and len(self.entries) > 1 \
                and self.total_bytes > self.limit_bytes:
            self.entries.pop(0)
        return entry.bytes

    def take_best(self, prompt: TokenSeq, slot_lcp: int, slot_tokens: int,
                  max_tokens: int | None = None) -> CacheEntry | None:
        """Remove and return the entry to restore for ``prompt``, if one beats the slot."""
        n_prompt = max(seq_len(prompt), 1)
        best_keep = slot_lcp / slot_tokens if slot_tokens else 0.0
        best_sim = slot_lcp / n_prompt
        best: CacheEntry | None = None
        for e in self.entries:
            lcp = common_prefix(e.seq, prompt)
            keep, sim = lcp / e.n_tokens, lcp / n_prompt
            if keep < RESTORE_MIN_KEEP or (max_tokens is not None and e.n_tokens > max_tokens):
                continue
            if keep > best_keep and sim > best_sim:
                best, best_keep, best_sim = e, keep, sim
        if best is not None:
            self.entries.remove(best)
        return best


class SlotPool:
    """The slots of one llama.cpp/Ollama server and their KV cells."""

    def __init__(self, *, parallel: int, slot_tokens: int, pool_cells: int, unified: bool,
                 similarity: float) -> None:
        self.slots = [Slot(i) for i in range(parallel)]
        self.slot_tokens = slot_tokens
        self.pool_cells = pool_cells
        self.unified = unified
        self.similarity = similarity

    @property
    def used_cells(self) -> int:
        return sum(s.n_tokens for s in self.slots)

    @property
    def free_cells(self) -> int:
        return self.pool_cells - self.used_cells

    @property
    def idle_cached_cells(self) -> int:
        return sum(s.n_tokens for s in self.slots if s.idle)

    def select(self, prompt: TokenSeq) -> tuple[Slot, int] | None:
        """The slot a new task gets and its LCP with the prompt; None = deferred."""
        idle = [s for s in self.slots if s.idle]
        if not idle:
            return None
        n = max(seq_len(prompt), 1)
        if self.similarity > 0:
            best, best_lcp = None, -1
            for s in idle:
                lcp = common_prefix(tuple(s.cache), prompt)
                if lcp > best_lcp:
                    best, best_lcp = s, lcp
            if best is not None and best_lcp / n > self.similarity:
                return best, best_lcp
        lru = min(idle, key=lambda s: (s.last_used_s, s.slot_id))
        return lru, common_prefix(tuple(lru.cache), prompt)

    def lru_idle_with_cache(self) -> Slot | None:
        cands = [s for s in self.slots if s.idle and s.n_tokens]
        return min(cands, key=lambda s: (s.last_used_s, s.slot_id)) if cands else None
