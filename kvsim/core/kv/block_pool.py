"""The paged KV block pool (vLLM v1 ``BlockPool``), docs/reference/engines.md §1.2–§1.3.

Every block exists from start-up.  A block with ``ref_cnt == 0`` sits in the *free
queue*, a doubly linked list in eviction order (head = evicted first).  A free
block may still carry a prefix hash: it is "free but cached" and can be revived by
a prefix hit (``touch``) until an allocation pops it from the head, which evicts
its hash.  Freed blocks are appended to the tail in *reverse* order (the caller
passes them last-block-first) so a request's prefix blocks are evicted last.

vLLM reserves block 0 as its *null block* (a placeholder for table entries that hold
nothing: the blocks a sliding window has dropped) and never allocates it, so of
``num_gpu_blocks`` one fewer hold KV (``null_block=True``); its usage metric counts
the rest.  SGLang pads with an extra page instead and loses none.

NOTE: invariants (checked by the hypothesis state machine in tests/core):
``num_free + num_active == num_usable``; every block in the free queue has
``ref_cnt == 0``; every hash in ``cached`` points at a block carrying that hash.
"""

from __future__ import annotations

from collections.abc import Iterable


class Block:
    """One KV block: an id, a reference count, an optional prefix hash."""

    __slots__ = ("block_hash", "block_id", "next", "prev", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.prev: Block | None = None
        self.next: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeBlockQueue:
    """Doubly linked list of free blocks, head = evicted first.

    NOTE: the blocks are the list's nodes; :class:`BlockPool` pops the head, unlinks
    prefix hits and appends freed chains in place (O(1) a block, one counter update a
    call), so this class holds the sentinels, the count and the order.
    """

    def __init__(self, blocks: Iterable[Block]) -> None:
        self._head = Block(-1)  # sentinels
        self._tail = Block(-2)
        self._head.next, self._tail.prev = self._tail, self._head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def append(self, block: Block) -> None:
        last = self._tail.prev
        assert last is not None
        last.next, block.prev = block, last
        block.next, self._tail.prev = self._tail, block
        self.num_free += 1

    def __iter__(self):  # head → tail, eviction order
        b = self._head.next
        while b is not None and b is not self._tail:
            yield b
            b = b.next


class BlockPool:
    """All GPU KV blocks of one paged engine, with the prefix-hash index."""

    def __init__(self, num_blocks: int, enable_caching: bool = True,
                 null_block: bool = False) -> None:
        if num_blocks <= int(null_block):
            raise ValueError("num_blocks must be positive (and above the null block)")
        self.num_blocks = num_blocks
        self.num_usable = num_blocks - int(null_block)  # blocks that can hold KV
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # NOTE: vLLM's null block is block 0, taken before any allocation and never freed
        self.null_block = self.blocks[0] if null_block else None
        self.free_queue = FreeBlockQueue(self.blocks[int(null_block):])
        self.cached: dict[int, Block] = {}
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

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on prefix-hit blocks (removing free ones from the queue)."""
        removed = cached = 0
        for b in blocks:
            if b.ref_cnt == 0:  # NOTE: unlinked from the free queue in place
                prev, nxt = b.prev, b.next
                prev.next, nxt.prev = nxt, prev
                b.prev = b.next = None
                removed += 1
                if b.block_hash is not None:
                    cached += 1
            b.ref_cnt += 1
        self.free_queue.num_free -= removed
        self._cached_free -= cached

    def get_new_blocks(self, n: int) -> list[Block]:
        """Pop ``n`` blocks from the head of the free queue, evicting their hashes."""
        if n > self.num_free:
            raise ValueError(f"cannot get {n} blocks, only {self.num_free} free")
        out = []
        q = self.free_queue
        head, cached = q._head, self.cached
        for _ in range(n):  # NOTE: the head unlinked in place
            b = head.next
            nxt = b.next
            head.next, nxt.prev = nxt, head
            b.prev = b.next = None
            h = b.block_hash
            if h is not None:
                if cached.get(h) is b:
                    del cached[h]
                    self.evictions += 1
                    self._cached_free -= 1
                b.block_hash = None
            b.ref_cnt = 1
            out.append(b)
        q.num_free -= n
        return out

    def head_is_cached(self, n: int) -> list[bool]:
        """For the next ``n`` blocks an allocation would pop: is each free but cached?

        NOTE: a free block carrying a hash is the one indexed under it (free_blocks
        clears an unindexed duplicate's hash), so its hash is what says so.
        """
        out = []
        b = self.free_queue._head.next
        for _ in range(n):
            out.append(b.block_hash is not None)
            b = b.next
        return out

    def cache_full_blocks(self, blocks: list[Block], hashes: list[int]) -> None:
        """Register blocks that just became full under their chained hashes, in order;
        a block that already carries a hash keeps it.

        NOTE: duplicates may exist (append-only block tables); the index keeps the first.
        """
        if not self.enable_caching:
            return
        cached = self.cached
        for block, h in zip(blocks, hashes):
            if block.block_hash is None:
                block.block_hash = h
                cached.setdefault(h, block)

    def uncache(self, blocks: Iterable[Block]) -> None:
        """Drop the hashes of referenced blocks from the index (their KV will be freed,
        not kept for reuse)."""
        cached = self.cached
        for b in blocks:
            h = b.block_hash
            if h is not None:
                assert b.ref_cnt > 0, "uncache of a free block (only held blocks)"
                if cached.get(h) is b:
                    del cached[h]
                b.block_hash = None

    def free_blocks(self, ordered: Iterable[Block]) -> None:
        """Drop one reference per block; blocks reaching zero go to the queue tail.

        ``ordered`` must already be in eviction order (vLLM passes a request's blocks
        reversed, so its last block is evicted first and its prefix last).
        """
        q, cached = self.free_queue, self.cached
        tail = q._tail
        last = tail.prev
        freed = cached_free = 0
        for b in ordered:
            b.ref_cnt -= 1
            assert b.ref_cnt >= 0, "ref_cnt below zero"
            if b.ref_cnt == 0:
                h = b.block_hash
                if h is not None:
                    if cached.get(h) is not b:
                        b.block_hash = None  # an uncached duplicate: plain free block
                    else:
                        cached_free += 1
                last.next, b.prev = b, last  # NOTE: appended in place,
                last = b  # the chain closed at the tail once, after the loop
                freed += 1
        last.next, tail.prev = tail, last
        q.num_free += freed
        self._cached_free += cached_free
