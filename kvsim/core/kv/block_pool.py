"""The paged KV block pool (vLLM v1 ``BlockPool``), docs/reference/engines.md §1.2–§1.3.

Every block exists from start-up; a block is its id (an ``int``), its state two flat
lists indexed by id: ``ref_cnt`` and ``block_hash``.  A block with ``ref_cnt == 0`` sits
in the *free queue*, in eviction order (head = evicted first).  A free block may still
carry a prefix hash: it is "free but cached" and can be revived by a prefix hit
(``touch``) until an allocation pops it from the head, which evicts its hash.  Freed
blocks are appended to the tail in *reverse* order (the caller passes them
last-block-first) so a request's prefix blocks are evicted last.

vLLM reserves block 0 as its *null block* (a placeholder for table entries that hold
nothing: the blocks a sliding window has dropped) and never allocates it, so of
``num_gpu_blocks`` one fewer hold KV (``null_block=True``); its usage metric counts
the rest.  SGLang pads with an extra page instead and loses none.

The pool works on runs of blocks: an allocation takes a slice of the free queue and a
release appends a request's blocks at once (:class:`FreeBlockQueue`); what is left a
block is its reference count and, for a cached block, its hash.

NOTE: invariants (checked by the hypothesis state machine in tests/core):
``num_free + num_active == num_usable``; every block in the free queue has
``ref_cnt == 0``; every hash in ``cached`` points at a block carrying that hash; a free
block carrying a hash is the one ``cached`` indexes under it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator

_COMPACT_AT = 1 << 16  # NOTE: the queue list drops its consumed head past this many


class FreeBlockQueue:
    """The free blocks in eviction order: a list read from a head index.

    NOTE: a prefix hit takes a block out of the middle (``BlockPool.touch``) by leaving its
    entry in place, *stale*: ``stale[b]`` counts the stale entries of block ``b`` still
    in the queue, and since a block's entries are met in queue order, the first entry
    of ``b`` a pop meets is stale exactly when ``stale[b] > 0``.  Without stale entries
    (``num_stale == 0``, the common case) a pop of ``n`` blocks is one list slice.
    """

    def __init__(self, num_blocks: int, blocks: Iterable[int]) -> None:
        self._q: list[int] = list(blocks)
        self._head = 0
        self.stale = [0] * num_blocks
        self.num_stale = 0
        self.num_free = len(self._q)
        # NOTE: BlockPool marks stale entries (a prefix hit: ``stale[b] += 1``,
        # ``num_stale``, ``num_free``) itself, on its per-block hot path

    def extend(self, blocks: list[int]) -> None:
        """Append released blocks at the tail, in the order given."""
        self._q += blocks
        self.num_free += len(blocks)

    def pop_many(self, n: int) -> list[int]:
        """The ``n`` blocks at the head, removed (``n ≤ num_free``)."""
        q, h = self._q, self._head
        if not self.num_stale:
            out = q[h:h + n]
            h += n
        else:
            out, stale = [], self.stale
            while len(out) < n:
                chunk = q[h:h + n - len(out)]
                h += len(chunk)
                if not any(map(stale.__getitem__, chunk)):
                    out += chunk
                    continue
                for b in chunk:
                    if stale[b]:
                        stale[b] -= 1
                        self.num_stale -= 1
                    else:
                        out.append(b)
        self.num_free -= n
        if h > _COMPACT_AT and h * 2 > len(q):
            del q[:h]
            h = 0
        self._head = h
        return out

    def __iter__(self) -> Iterator[int]:  # head → tail, eviction order
        seen: dict[int, int] = {}
        stale = self.stale
        for i in range(self._head, len(self._q)):
            b = self._q[i]
            k = seen.get(b, 0)
            if k < stale[b]:  # NOTE: one of b's stale entries (they come first)
                seen[b] = k + 1
                continue
            yield b

    def head(self, n: int) -> list[int]:
        """The next ``n`` blocks a pop would take (not removed)."""
        out: list[int] = []
        if n <= 0:
            return out
        if not self.num_stale:
            return self._q[self._head:self._head + n]
        for b in self:
            out.append(b)
            if len(out) == n:
                break
        return out


class BlockPool:
    """All GPU KV blocks of one paged engine, with the prefix-hash index."""

    def __init__(self, num_blocks: int, enable_caching: bool = True,
                 null_block: bool = False) -> None:
        if num_blocks <= int(null_block):
            raise ValueError("num_blocks must be positive (and above the null block)")
        self.num_blocks = num_blocks
        self.num_usable = num_blocks - int(null_block)  # blocks that can hold KV
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[Hashable | None] = [None] * num_blocks
        # NOTE: vLLM's null block is block 0, taken before any allocation and never freed
        self.null_block = 0 if null_block else None
        self.free_queue = FreeBlockQueue(num_blocks, range(int(null_block), num_blocks))
        self.cached: dict[Hashable, int] = {}
        self.evictions = 0
        self._cached_free = 0  # free blocks that still carry an indexed hash

    @property
    def num_free(self) -> int:
        """Blocks that an allocation may take (free, cached or not)."""
        return self.free_queue.num_free

    @property
    def num_active(self) -> int:
        """Blocks held by requests (the null block is not one)."""
        return self.num_usable - self.free_queue.num_free

    @property
    def num_cached_free(self) -> int:
        """Free blocks that still hold a reusable prefix (evictable cache)."""
        return self._cached_free

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on prefix-hit blocks (removing free ones from the queue)."""
        rc, bh, q = self.ref_cnt, self.block_hash, self.free_queue
        stale = q.stale
        removed = cached = 0
        for b in blocks:
            if not rc[b]:  # NOTE: FreeBlockQueue.remove, inlined: its entry turns stale
                stale[b] += 1
                removed += 1
                if bh[b] is not None:
                    cached += 1
            rc[b] += 1
        q.num_stale += removed
        q.num_free -= removed
        self._cached_free -= cached

    def get_new_blocks(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the head of the free queue, evicting their hashes."""
        q = self.free_queue
        if n > q.num_free:
            raise ValueError(f"cannot get {n} blocks, only {self.num_free} free")
        out = q.pop_many(n)
        rc = self.ref_cnt
        if self._cached_free:
            bh, cached = self.block_hash, self.cached
            evicted = 0
            for b in out:
                rc[b] = 1
                h = bh[b]
                if h is not None:  # NOTE: a free block's hash is the indexed one (module doc)
                    del cached[h]
                    bh[b] = None
                    evicted += 1
            if evicted:
                self.evictions += evicted
                self._cached_free -= evicted
        else:
            for b in out:
                rc[b] = 1
        return out

    def head_is_cached(self, n: int) -> list[bool]:
        """For the next ``n`` blocks an allocation would pop: is each free but cached?

        NOTE: a free block carrying a hash is the one indexed under it (free_blocks
        clears an unindexed duplicate's hash), so its hash is what says so.
        """
        bh = self.block_hash
        return [bh[b] is not None for b in self.free_queue.head(n)]

    def cache_full_blocks(self, blocks: list[int], hashes: list[Hashable]) -> None:
        """Register blocks that just became full under their chained hashes, in order;
        a block that already carries a hash keeps it.

        NOTE: duplicates may exist (append-only block tables); the index keeps the first.
        """
        if not self.enable_caching:
            return
        bh, setdefault = self.block_hash, self.cached.setdefault
        for b, h in zip(blocks, hashes):
            if bh[b] is None:
                bh[b] = h
                setdefault(h, b)

    def uncache(self, blocks: Iterable[int]) -> None:
        """Drop the hashes of referenced blocks from the index (their KV will be freed,
        not kept for reuse)."""
        cached, bh = self.cached, self.block_hash
        for b in blocks:
            h = bh[b]
            if h is not None:
                assert self.ref_cnt[b] > 0, "uncache of a free block (only held blocks)"
                if cached.get(h) == b:
                    del cached[h]
                bh[b] = None

    def free_blocks(self, ordered: Iterable[int]) -> None:
        """Drop one reference per block; blocks reaching zero go to the queue tail.

        ``ordered`` must already be in eviction order (vLLM passes a request's blocks
        reversed, so its last block is evicted first and its prefix last).
        """
        rc, bh, cached = self.ref_cnt, self.block_hash, self.cached
        freed = []
        append = freed.append
        cached_free = 0
        for b in ordered:
            n = rc[b] - 1
            rc[b] = n
            if not n:
                h = bh[b]
                if h is not None:
                    if cached.get(h) == b:
                        cached_free += 1
                    else:
                        bh[b] = None  # an uncached duplicate: plain free block
                append(b)
            else:
                assert n > 0, "ref_cnt below zero"
        self._cached_free += cached_free
        self.free_queue.extend(freed)
