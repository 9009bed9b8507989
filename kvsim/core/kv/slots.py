"""llama.cpp / Ollama slots and the host-RAM prompt cache.

A server has ``parallel`` slots; each keeps the KV of its last sequence (prompt + output − 1)
so a follow-up turn computes only what differs. Non-unified (``--no-kv-unified``, Ollama):
``slot_tokens`` cells a slot; unified (``-kvu``): one pool of ``pool_cells``. Slot choice
follows ``--slot-prompt-similarity`` (Ollama: longest common prefix, no threshold); the
host-RAM prompt cache (``--cache-ram``) saves and restores whole slot states as the vendored
llama-server's ``server_prompt_cache`` does.

NOTE: ``used_cells == sum(slot.n_tokens)`` and never exceeds ``pool_cells``.
NOTE: an entry's bytes are tokens × KV bytes per token (the real per-cell header is left out).
Design: docs/design/kv-cache.md (after docs/reference/engines.md §3.1, §3.4, §4.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsim.core.kv.prefix import pieces_in_range
from kvsim.core.requests import Piece, Request, TokenSeq, common_prefix, seq_append, seq_len

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


def append_computed(slot: Slot, req: Request, n: int) -> None:
    """Append ``req``'s next ``n`` tokens to compute (from ``num_computed_tokens``) to
    ``slot``'s cache.

    NOTE: a decode's range lies in the output piece (``all_tokens``' last), so it takes
    no walk over the prompt's pieces.
    """
    a, p = req.num_computed_tokens, req.prompt_tokens
    if a >= p and req.num_output:
        seq_append(slot.cache, req.output_id, a - p, a - p + n)
        return
    for sid, s, e in pieces_in_range(req.all_tokens(), a, a + n):
        seq_append(slot.cache, sid, s, e)


@dataclass(frozen=True)
class CacheEntry:
    seq: TokenSeq
    n_tokens: int
    bytes: int
    saved_s: float


class PromptCache:
    """Host-RAM cache of slot states (llama.cpp ``--cache-ram``)."""

    def __init__(self, limit_bytes: int | None, bytes_per_token: int,
                 limit_tokens: int = 0) -> None:
        self.limit_bytes = limit_bytes  # None = unlimited, 0 = off
        self.bytes_per_token = bytes_per_token
        self.limit_tokens = limit_tokens  # llama-server: n_ctx; 0 = no token limit
        self.entries: list[CacheEntry] = []  # oldest first
        # NOTE: kept by every change (_add, _drop, _reindex): _bytes and _tokens are the
        # entries' sums; _first counts the entries by their first piece's (id, start).
        # A sequence shares no token with an entry whose first piece differs
        # (common_prefix is 0), so a prompt without a count there skips the scan.
        self._bytes = 0
        self._tokens = 0
        self._first: dict[tuple[str, int], int] = {}

    @property
    def enabled(self) -> bool:
        return self.limit_bytes is None or self.limit_bytes > 0

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def save(self, seq: TokenSeq, now_s: float) -> int:
        """Store a slot state; return the bytes written (0: off, empty or skipped)."""
        n = seq_len(seq)
        if not self.enabled or n == 0:
            return 0
        lcps = [common_prefix(e.seq, seq) for e in self.entries] \
            if self._first.get(seq[0][:2]) else None
        if lcps is not None and n in lcps:
            return 0  # already held whole by one entry
        size = n * self.bytes_per_token
        limit = self.limit_bytes
        if limit is not None and size > limit:
            return 0  # over-limit states are skipped, not cached
        if lcps is not None:  # drop the entries the new state contains
            self.entries = [e for e, lcp in zip(self.entries, lcps) if lcp < e.n_tokens]
            self._reindex()
        while self.entries and limit is not None and self._bytes + size > limit:
            self._pop_oldest()
        self._add(CacheEntry(seq, n, size, now_s))
        self.trim()
        return size

    def trim(self) -> None:
        """Evict oldest entries above the byte limit, then above the token limit
        (``n_ctx``, raised to the tokens the byte limit holds).

        NOTE: llama-server raises it by the cache's bytes per token, which here is
        exactly ``bytes_per_token`` (entries are tokens × that).
        """
        limit = self.limit_bytes
        while self.entries and limit is not None and self._bytes > limit:
            self._pop_oldest()
        if not self.limit_tokens:
            return
        cap = max(self.limit_tokens, limit // self.bytes_per_token) if limit \
            else self.limit_tokens
        while self.entries and self._tokens > cap:
            self._pop_oldest()

    def _add(self, e: CacheEntry) -> None:
        self.entries.append(e)
        self._bytes += e.bytes
        self._tokens += e.n_tokens
        key = e.seq[0][:2]
        self._first[key] = self._first.get(key, 0) + 1

    def _drop(self, e: CacheEntry) -> None:
        """Account for ``e`` having left :attr:`entries`."""
        self._bytes -= e.bytes
        self._tokens -= e.n_tokens
        key = e.seq[0][:2]
        left = self._first[key] - 1
        if left:
            self._first[key] = left
        else:
            del self._first[key]

    def _reindex(self) -> None:
        entries, self.entries = self.entries, []
        self._bytes = self._tokens = 0
        self._first = {}
        for e in entries:
            self._add(e)

    def _pop_oldest(self) -> CacheEntry:
        e = self.entries.pop(0)
        self._drop(e)
        return e

    def take_best(self, prompt: TokenSeq, slot_lcp: int, slot_tokens: int,
                  max_tokens: int | None = None) -> CacheEntry | None:
        """Remove and return the entry to restore for ``prompt``, if one beats the slot."""
        if not prompt or not self._first.get(prompt[0][:2]):
            return None  # no entry shares a token with it: all keep 0 < RESTORE_MIN_KEEP
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
            self._drop(best)
        return best


class SlotPool:
    """The slots of one llama.cpp/Ollama server and their KV cells."""

    def __init__(self, *, parallel: int, slot_tokens: int, pool_cells: int, unified: bool,
                 similarity: float | None, fresh_from_last: bool = False) -> None:
        self.slots = [Slot(i) for i in range(parallel)]
        self.slot_tokens = slot_tokens
        self.pool_cells = pool_cells
        self.unified = unified
        self.similarity = similarity
        # NOTE: the LRU choice among slots never used: the last (llama-server scans with
        # ``<=``), else the first (Ollama); slots released in one step go in slot order
        self.fresh_from_last = fresh_from_last

    @property
    def used_cells(self) -> int:
        return sum(s.n_tokens for s in self.slots)

    @property
    def free_cells(self) -> int:
        return self.pool_cells - self.used_cells

    @property
    def idle_cached_cells(self) -> int:
        return sum(s.n_tokens for s in self.slots if s.idle)

    def select(self, prompt: TokenSeq) -> tuple[Slot, int, bool] | None:
        """The slot a new task gets, its LCP with the prompt and whether it was the
        LRU choice (no slot similar enough); None = deferred."""
        idle = [s for s in self.slots if s.idle]
        if not idle:
            return None
        n = max(seq_len(prompt), 1)
        if self.similarity is None or self.similarity > 0:
            best, best_lcp = idle[0], -1
            for s in idle:
                lcp = common_prefix(tuple(s.cache), prompt)
                if lcp > best_lcp:
                    best, best_lcp = s, lcp
            if self.similarity is None or best_lcp / n > self.similarity:
                return best, best_lcp, False
        lru = min(idle, key=self._lru_key)
        return lru, common_prefix(tuple(lru.cache), prompt), True

    def _lru_key(self, s: Slot) -> tuple[float, int]:
        """Least recently used first; among slots released at the same step the lowest
        id (the server releases them in slot order), among slots never used the highest
        id where the server takes the last one (``fresh_from_last``)."""
        fresh = self.fresh_from_last and s.last_used_s < 0
        return s.last_used_s, -s.slot_id if fresh else s.slot_id

    def lru_idle_with_cache(self) -> Slot | None:
        cands = [s for s in self.slots if s.idle and s.n_tokens]
        return min(cands, key=lambda s: (s.last_used_s, s.slot_id)) if cands else None
