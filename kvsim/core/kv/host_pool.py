"""A host-RAM tier of paged KV blocks keyed by prefix hash.

See docs/reference/engines.md §1.6, §2.4, §5.

vLLM's native offloading (``--kv-offloading-size``, CPU block pool with LRU
eviction), LMCache's local CPU backend (LRU) and SGLang's HiCache (host pool of
``--hicache-ratio`` × the device pool) share one mechanism: KV blocks the GPU
computed are copied to host memory, keyed by the same chained prefix hash the GPU
prefix cache uses; on a GPU prefix miss that hits the host, the blocks are copied
back over PCIe instead of being recomputed.

Blocks are stored when a request releases them (finish or recompute preemption):
they are still on the GPU then, so the copy always precedes their eviction there
(write-back).  A request's blocks are stored last-block-first, so its prefix —
which every later block of the chain depends on — is the most recently used and is
evicted from the host last.

NOTE: the tier stores keys only; a key present here means the whole block is on
the host.  ``match`` counts a *leading* run (chained hashes: block i is useless
without blocks 0..i−1).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HostTier:
    """A paged scheduler's host KV tier, as its policy sizes it (kvsim.policies.build).

    NOTE: LMCache keeps whole chunks of prompt KV only (docs/reference/engines.md §5):
    ``chunk_blocks`` blocks per chunk and ``store_decode`` False; vLLM's native offload
    and SGLang's HiCache store single blocks, decoded KV too."""

    num_blocks: int
    load: str = "auto"
    """``auto``: a host hit is loaded only when the copy ends before recomputing would."""
    chunk_blocks: int = 1
    store_decode: bool = True
    recompute_s: Callable[[int, int], float] | None = None
    """Seconds to recompute ``n`` tokens at context ``ctx`` (None: always load)."""


class HostBlockPool:
    """An LRU set of block hashes held in host RAM, at most ``capacity_blocks``."""

    def __init__(self, capacity_blocks: int, block_bytes: int) -> None:
        self.capacity_blocks = max(0, int(capacity_blocks))
        self.block_bytes = block_bytes
        self.lru: OrderedDict[int, None] = OrderedDict()  # head = evicted first
        self.stored_blocks = 0
        self.evicted_blocks = 0

    @property
    def num_blocks(self) -> int:
        return len(self.lru)

    @property
    def bytes(self) -> int:
        return len(self.lru) * self.block_bytes

    def store(self, hashes: Sequence[int]) -> int:
        """Copy the blocks of ``hashes`` (a request's chain, prefix first) to host RAM;
        return how many were new (the ones that cross the link)."""
        new = 0
        for h in hashes:  # NOTE: touch the chain's held blocks first, so storing its tail
            if h in self.lru:  # never evicts its own prefix (which would cross the link twice)
                self.lru.move_to_end(h)
        for h in reversed(hashes):  # NOTE: prefix stored last → most recently used
            if h in self.lru:
                self.lru.move_to_end(h)
                continue
            if self.capacity_blocks == 0:
                break
            while len(self.lru) >= self.capacity_blocks:
                self.lru.popitem(last=False)
                self.evicted_blocks += 1
            self.lru[h] = None
            new += 1
        self.stored_blocks += new
        return new

    def match(self, hashes: Sequence[int]) -> int:
        """Length of the leading run of ``hashes`` held here."""
        n = 0
        for h in hashes:
            if h not in self.lru:
                break
            n += 1
        return n

    def touch(self, hashes: Sequence[int]) -> None:
        for h in reversed(hashes):
            if h in self.lru:
                self.lru.move_to_end(h)
