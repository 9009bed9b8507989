"""KV cache manager for paged engines (vLLM v1 ``KVCacheManager``).

See docs/reference/engines.md §1.2–§1.4.

The scheduler asks two questions per request and step: which leading blocks are
already cached (``get_computed_blocks``, only for a request with nothing computed)
and whether the step's new tokens fit (``allocate_slots``, which either allocates
everything or nothing).  Blocks are allocated lazily: a decode step needs a new
block only when it crosses a block boundary.

NOTE: the prefix hit is capped at ``num_tokens − 1`` tokens rounded down to whole
blocks (``floor((prompt_len − 1) / block) · block`` for a fresh prompt): at least one
token must be computed to get logits, and computed tokens stay block-aligned.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from kvsim.core.kv.block_pool import BlockPool
from kvsim.core.kv.prefix import extend_block_hashes, extend_tail_hashes
from kvsim.core.requests import Request


@dataclass(frozen=True)
class PrefixHit:
    """Cached leading blocks (ids) found for a request (not yet referenced)."""

    blocks: tuple[int, ...] = ()
    num_tokens: int = 0


class KVCacheManager:
    """Per-request block tables over one :class:`BlockPool`."""

    def __init__(self, pool: BlockPool, block_tokens: int) -> None:
        self.pool = pool
        self.block_tokens = block_tokens
        self.req_blocks: dict[str, list[int]] = {}  # block ids, in table order
        self.req_num_hashed: dict[str, int] = {}  # leading blocks already registered
        self.query_tokens = 0
        self.hit_tokens = 0

    def _hashes(self, req: Request, num_blocks: int) -> list[int]:
        hashes, bt = req.block_hashes, self.block_tokens
        k = len(hashes)
        if num_blocks <= k:
            return hashes
        start = k * bt - req.prompt_tokens
        if start >= 0 and req.num_output:  # every new block is output: no piece walk
            n = min(num_blocks, (req.prompt_tokens + req.num_output) // bt)
            return extend_tail_hashes(hashes, req.output_id, 0, start, bt, n)
        return extend_block_hashes(hashes, req.all_tokens(), bt, num_blocks)

    def chain(self, req: Request, num_blocks: int) -> list[int]:
        """The chained hashes of ``req``'s first ``num_blocks`` full blocks."""
        return self._hashes(req, num_blocks)[:num_blocks]

    def get_computed_blocks(self, req: Request) -> PrefixHit:
        """Longest run of cached leading blocks, capped so one token stays to compute."""
        if not self.pool.enable_caching or req.num_computed_tokens:
            return PrefixHit()
        max_blocks = (req.num_tokens - 1) // self.block_tokens
        hits: list[int] = []
        lookup = self.pool.cached.get  # NOTE: get_cached_block inlined (caching is on)
        for h in islice(self._hashes(req, max_blocks), max_blocks):
            b = lookup(h)
            if b is None:
                break
            hits.append(b)
        self.query_tokens += req.num_tokens
        self.hit_tokens += len(hits) * self.block_tokens
        return PrefixHit(tuple(hits), len(hits) * self.block_tokens)

    def blocks_needed(self, req: Request, num_new_tokens: int, hit: PrefixHit = PrefixHit()) -> int:
        """New pool blocks this step would take (prefix-hit blocks that are free count)."""
        have = len(self.req_blocks.get(req.request_id, ())) + len(hit.blocks)
        total = req.num_computed_tokens + hit.num_tokens + num_new_tokens
        need = max(0, -(-total // self.block_tokens) - have)
        if not hit.blocks:
            return need
        rc = self.pool.ref_cnt
        return need + [rc[b] for b in hit.blocks].count(0)  # NOTE: the free hit blocks

    def can_allocate(self, req: Request, num_new_tokens: int, hit: PrefixHit = PrefixHit()) -> bool:
        return self.blocks_needed(req, num_new_tokens, hit) <= self.pool.num_free

    def allocate_slots(self, req: Request, num_new_tokens: int,
                       hit: PrefixHit = PrefixHit()) -> bool:
        """Reference the hit blocks and allocate blocks for ``num_new_tokens``; all or nothing."""
        if not hit.blocks:  # NOTE: hot path (a running request, e.g. a decode token)
            have = self.req_blocks.get(req.request_id)
            if have is not None:
                total = req.num_computed_tokens + num_new_tokens
                n_new = -(-total // self.block_tokens) - len(have)
                if n_new > 0:
                    if n_new > self.pool.free_queue.num_free:
                        return False
                    have.extend(self.pool.get_new_blocks(n_new))
                self._register(req, have, total, 0)
                return True
        if not self.can_allocate(req, num_new_tokens, hit):
            return False
        blocks = self.req_blocks.setdefault(req.request_id, [])
        if hit.blocks:
            self.pool.touch(hit.blocks)
            blocks.extend(hit.blocks)
        total = req.num_computed_tokens + hit.num_tokens + num_new_tokens
        n_new = -(-total // self.block_tokens) - len(blocks)
        if n_new > 0:
            blocks.extend(self.pool.get_new_blocks(n_new))
        # NOTE: hit blocks lead the table and already carry their hashes
        # (cache_full_blocks would skip them)
        self._register(req, blocks, total, len(hit.blocks))
        return True

    def _register(self, req: Request, blocks: list[int], total: int, first: int) -> None:
        """Register ``req``'s blocks that are full at ``total`` tokens (from block
        ``first`` or the first not yet registered).

        NOTE: blocks that become full during a step are registered at once, so
        requests in the same batch (and the request's own output) can reuse them.
        """
        if not self.pool.enable_caching:
            return
        n_full = total // self.block_tokens
        done = self.req_num_hashed.get(req.request_id, 0)
        if first > done:  # noqa: PLR1730 (builtins max costs more on this hot path)
            done = first
        if n_full > done:
            hashes = self._hashes(req, n_full)
            self.pool.cache_full_blocks(blocks[done:n_full], hashes[done:n_full])
            self.req_num_hashed[req.request_id] = n_full

    def free(self, req: Request, keep_cached: int | None = None) -> None:
        """Release a request's blocks, last block first (prefix evicted last).

        With ``keep_cached`` only the first ``keep_cached`` blocks stay indexed for
        reuse; the rest lose their hashes (SGLang's retract frees the decoded KV without
        inserting it into the tree).
        """
        blocks = self.req_blocks.pop(req.request_id, None)
        self.req_num_hashed.pop(req.request_id, None)
        if blocks:
            if keep_cached is not None:
                self.pool.uncache(blocks[keep_cached:])
            self.pool.free_blocks(reversed(blocks))

    def least_peak_blocks(self, tokens: int, req: Request | None = None,
                          chunk_tokens: int = 1) -> int:
        """Blocks a request holds, at the least, once ``tokens`` tokens are computed
        (however ``req``'s prompt is chunked: nothing is freed before it ends)."""
        return -(-tokens // self.block_tokens)

    def num_blocks_of(self, req: Request) -> int:
        return len(self.req_blocks.get(req.request_id, ()))
