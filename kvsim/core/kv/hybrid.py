"""Block tables per KV cache group: vLLM's hybrid KV cache manager.

A request holds one block table per group (:mod:`kvsim.model.hybrid`), all drawing from one
:class:`~kvsim.core.kv.block_pool.BlockPool`. Unlike :class:`~kvsim.core.kv.manager.KVCacheManager`:
sliding groups free skipped blocks (null entries) before allocating; allocation is all or
nothing over every group; prefix hits follow ``HybridKVCacheCoordinator``; a freed sliding
block keeps its hash until evicted; free goes table by table, last block first.

NOTE: ``req_blocks`` / ``req_num_hashed`` stay empty, so the scheduler's inlined
single-group paths find no table and always call ``allocate_slots``; a fast-forward stretch
calls ``advance`` at the (step, request) points where a block is freed, taken or filled.
Design: docs/design/kv-cache.md (after docs/reference/engines.md §1.7).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvsim.core.kv.block_pool import BlockPool
from kvsim.core.kv.manager import KVCacheManager
from kvsim.core.requests import Request

Table = list[int | None]  # block ids; None: a null entry


@dataclass(frozen=True)
class HybridHit:
    """Cached blocks found for a new request, one tuple per group (None = null)."""

    groups: tuple[tuple[int | None, ...], ...] = ()
    num_tokens: int = 0

    @property
    def blocks(self) -> tuple[int, ...]:
        return tuple(b for g in self.groups for b in g if b is not None)


class HybridKVCacheManager(KVCacheManager):
    """Per-request block tables, one per KV cache group, over one :class:`BlockPool`."""

    def __init__(self, pool: BlockPool, block_tokens: int,
                 kinds: tuple[tuple[str, int], ...]) -> None:
        super().__init__(pool, block_tokens)
        self.kinds = kinds
        self.full = [g for g, (k, _) in enumerate(kinds) if k == "full"]
        self.swa = [g for g, (k, _) in enumerate(kinds) if k != "full"]
        windows = {w for k, w in kinds if k != "full"}
        if len(windows) != 1:
            raise ValueError(f"one sliding window expected, got {sorted(windows)}")
        self.window = windows.pop()
        # NOTE: per group, its place among the full or the sliding groups
        self.place = [self.full.index(g) if k == "full" else self.swa.index(g)
                      for g, (k, _) in enumerate(kinds)]
        self.run_blocks = max(1, -(-(self.window - 1) // block_tokens))
        self.tables: dict[str, list[Table]] = {}
        self.hashed: dict[str, int] = {}  # leading block positions already registered

    # -- prefix hits ------------------------------------------------------------
    def get_computed_blocks(self, req: Request) -> HybridHit:
        if not self.pool.enable_caching or req.num_computed_tokens:
            return HybridHit()
        bt = self.block_tokens
        max_blocks = (req.num_tokens - 1) // bt
        hashes = self._hashes(req, max_blocks)
        lookup = self.pool.cached.get
        n = max_blocks
        full: list[list[int]] = [[] for _ in self.full]
        for i in range(max_blocks if self.full else 0):
            found = [lookup((hashes[i], g)) for g in self.full]
            if None in found:
                n = i
                break
            for lst, b in zip(full, found):
                lst.append(b)
        start, end, run = self._window_run(hashes, n, lookup)
        groups = [tuple(full[k][:end]) if kind == "full" else
                  (None,) * start + tuple(r[k] for r in run)
                  for (kind, _), k in zip(self.kinds, self.place)]
        self.query_tokens += req.num_tokens
        self.hit_tokens += end * bt
        return HybridHit(tuple(groups), end * bt)

    def _window_run(self, hashes: list[int], n: int, lookup: Any
                    ) -> tuple[int, int, list[list[int]]]:
        """(start, end, blocks per position) of the sliding groups' hit inside ``n``
        blocks: the last run of ``ceil((window − 1) / block)`` blocks cached in every
        sliding group, else the run that starts at block 0."""
        need = self.run_blocks
        run: list[list[int]] = []
        for i in range(n - 1, -1, -1):
            found = [lookup((hashes[i], g)) for g in self.swa]
            if None in found:
                run = []
                continue
            run.append(found)
            if len(run) >= need:
                return i, i + len(run), run[::-1]
        return 0, len(run), run[::-1]

    # -- allocation ---------------------------------------------------------------
    def _skipped_blocks(self, computed: int) -> int:
        return max(0, computed - self.window + 1) // self.block_tokens

    def _need(self, tables: list[Table] | None, computed: int, total: int,
              hit: Any) -> int:
        """Free blocks this step takes: new blocks per group and revived hit blocks."""
        required = -(-total // self.block_tokens)
        if tables is not None:
            return sum(max(required - len(t), 0) for t in tables)
        need = 0
        for hb, sk in self._hit_parts(computed, hit):
            need += max(required - max(sk, len(hb)), 0)
            need += sum(1 for b in hb[sk:] if b is not None and not self.pool.ref_cnt[b])
        return need

    def _hit_parts(self, computed: int, hit: Any) -> list[tuple[tuple, int]]:
        """Per group of a new request: its hit blocks and how many leading ones skip."""
        skipped = self._skipped_blocks(computed)
        return [(hit.groups[g] if hit.groups else (), 0 if kind == "full" else skipped)
                for g, (kind, _) in enumerate(self.kinds)]

    def blocks_needed(self, req: Request, num_new_tokens: int, hit: Any = HybridHit()) -> int:
        tables = self.tables.get(req.request_id)
        computed = req.num_computed_tokens + hit.num_tokens
        return self._need(tables, computed, computed + num_new_tokens, hit)

    def allocate_slots(self, req: Request, num_new_tokens: int, hit: Any = HybridHit()) -> bool:
        rid = req.request_id
        tables = self.tables.get(rid)
        computed = req.num_computed_tokens + hit.num_tokens
        if tables is not None:
            self._remove_skipped(tables, computed)
        total = computed + num_new_tokens
        if self._need(tables, computed, total, hit) > self.pool.num_free:
            return False
        if tables is None:
            tables = self.tables[rid] = self._new_tables(computed, hit)
        self._grow(req, tables, total)
        return True

    def advance(self, req: Request, computed: int) -> None:
        """A running request's schedule of one decode token at ``computed`` tokens, known
        to fit (the fast-forward stretch, kvsim.core.stretch): what ``allocate_slots``
        does then."""
        tables = self.tables[req.request_id]
        self._remove_skipped(tables, computed)
        self._grow(req, tables, computed + 1)

    def _grow(self, req: Request, tables: list[Table], total: int) -> None:
        required = -(-total // self.block_tokens)
        for t in tables:  # NOTE: group by group, as vLLM's coordinator allocates
            if required > len(t):
                t.extend(self.pool.get_new_blocks(required - len(t)))
        self._register_all(req, tables, total)

    def _new_tables(self, computed: int, hit: Any) -> list[Table]:
        """A new request's tables: null entries for skipped blocks, then its hit."""
        tables: list[Table] = []
        for hb, sk in self._hit_parts(computed, hit):
            t: Table = list(hb) + [None] * (sk - len(hb))
            t[:sk] = [None] * sk
            self.pool.touch([b for b in t if b is not None])
            tables.append(t)
        return tables

    def _remove_skipped(self, tables: list[Table], computed: int) -> None:
        k = self._skipped_blocks(computed)
        if not k:
            return
        removed: list[int] = []
        for g in self.swa:
            t = tables[g]
            i = min(k, len(t)) - 1
            while i >= 0 and t[i] is not None:
                removed.append(t[i])  # type: ignore[arg-type]
                t[i] = None
                i -= 1
        if removed:
            self.pool.free_blocks(removed)

    def _register_all(self, req: Request, tables: list[Table], total: int) -> None:
        if not self.pool.enable_caching:
            return
        n_full = total // self.block_tokens
        rid = req.request_id
        done = self.hashed.get(rid, 0)
        if n_full <= done:
            return
        hashes = self._hashes(req, n_full)
        for g, t in enumerate(tables):
            pairs = [(b, (hashes[i], g)) for i in range(done, n_full)
                     if (b := t[i]) is not None]
            self.pool.cache_full_blocks([b for b, _ in pairs], [k for _, k in pairs])
        self.hashed[rid] = n_full

    # -- release ---------------------------------------------------------------------
    def free(self, req: Request, keep_cached: int | None = None) -> None:
        tables = self.tables.pop(req.request_id, None)
        self.hashed.pop(req.request_id, None)
        if not tables:
            return
        if keep_cached is not None:
            self.pool.uncache([b for t in tables for b in t[keep_cached:] if b is not None])
        self.pool.free_blocks([b for t in tables for b in reversed(t) if b is not None])

    def least_peak_blocks(self, tokens: int, req: Request | None = None,
                          chunk_tokens: int = 1) -> int:
        """The most blocks a request holds at once when it runs alone, from nothing, until
        ``tokens`` tokens are computed: ``req``'s prompt in ``chunk_tokens``-token steps
        (the token budget, all of it a lone request's), then one token a step.  Without
        ``req``, one token a step throughout: the least any fresh run can hold.

        A step computing tokens ``[c, c + n)`` first drops the sliding blocks wholly
        before the window, then holds ``e = ceil((c + n) / block)`` blocks per full
        group and ``e − floor(max(0, c − window + 1) / block)`` per sliding group
        (:meth:`_held`).  Alone, every other block is free (cached or not), so the
        request fits ``u`` usable blocks iff no step holds more than ``u``; else it
        fails a step, preempts itself and retries that step for ever.

        NOTE: a step of ``n`` tokens holds at least what a one-token step at any of its
        tokens would, so chunking only raises the peak.  Other runs take other steps: a
        prefix hit starts the chunks at a block boundary, a recompute after preemption
        chunks the prompt and outputs; their peak may differ (at most vLLM's
        ``ceil((window − 1 + budget) / block) + 1`` per sliding group, the start-up
        check of kvsim.core.build).
        """
        p = min(req.prompt_tokens, tokens) if req is not None else 0
        b = max(1, chunk_tokens)
        whole = p // b * b  # the prompt's full chunks end here
        return max(self._max_held(0, whole, b, b),
                   self._held(whole, p - whole) if p > whole else 0,
                   self._max_held(p, tokens, 1, 1))

    def _held(self, c: int, n: int) -> int:
        """Blocks a request holds after the step that computes tokens ``[c, c + n)``."""
        end = -(-(c + n) // self.block_tokens)
        return end * len(self.kinds) - self._skipped_blocks(c) * len(self.swa)

    def _max_held(self, first: int, stop: int, step: int, n: int) -> int:
        """The most :meth:`_held` ``(c, n)`` over ``c = first, first + step, … < stop``
        (0 for none), from a few of those steps.

        NOTE: from ``c ≥ window − 1`` on, the sliding count repeats every
        ``block / gcd(step, block)`` steps and the full count never falls; before it,
        nothing is skipped and the count never falls either.  So the last period, plus
        the last step before the window fills, hold the maximum.
        """
        count = -(-(stop - first) // step)
        if count <= 0:
            return 0
        period = self.block_tokens // math.gcd(step, self.block_tokens)
        ks = set(range(max(0, count - period), count))
        pre = -(-(self.window - 1 - first) // step) - 1  # the last c < window − 1
        if 0 <= pre < count:
            ks.add(pre)
        return max(self._held(first + k * step, n) for k in ks)

    def num_blocks_of(self, req: Request) -> int:
        return sum(b is not None for t in self.tables.get(req.request_id, ()) for b in t)
