"""vLLM's hybrid KV cache manager (kvsim.core.kv.hybrid): exact block ids and order.

Groups (sliding window 8 tokens, full), block 4 tokens: a sliding group needs
ceil((8 − 1) / 4) = 2 consecutive cached blocks for a prefix hit; step ``computed``
skips the first ``computed − 8 + 1`` tokens.  Expected ids are worked out by hand in
the comments from the free queue (head popped first, freed blocks at the tail).
"""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.core.kv.block_pool import BlockPool
from kvsim.core.kv.hybrid import HybridKVCacheManager
from kvsim.core.requests import Request
from kvsim.core.step import ScheduledItem
from kvsim.core.stretch import _first_free_step, _hybrid_points

KINDS = (("sliding", 8), ("full", 0))


def _req(rid: str, segs: list[tuple[str, int]], out: int = 8) -> Request:
    return Request(request_id=rid, session_id=rid, turn=0, arrival_s=0.0,
                   prompt=tuple((s, 0, n) for s, n in segs), output_id=f"{rid}/out",
                   max_output_tokens=out)


def _ids(mgr: HybridKVCacheManager, rid: str) -> list[list[int | None]]:
    return [list(t) for t in mgr.tables[rid]]  # block ids, None: null entries


def _decode(mgr: HybridKVCacheManager, req: Request) -> bool:
    """One scheduler step of a running request: one token, then it is sampled."""
    if not mgr.allocate_slots(req, 1):
        return False
    req.num_computed_tokens += 1
    req.num_output += 1
    return True


def test_decode_frees_the_block_that_left_the_window_and_allocates_per_group() -> None:
    pool = BlockPool(20)
    mgr = HybridKVCacheManager(pool, 4, KINDS)
    a = _req("a", [("A", 10)])
    assert mgr.allocate_slots(a, 10)  # 3 blocks per group, sliding first
    assert _ids(mgr, "a") == [[0, 1, 2], [3, 4, 5]]
    a.num_computed_tokens, a.num_output = 10, 1
    assert _decode(mgr, a)  # computed 10: skips 3 tokens, no whole block yet
    assert _ids(mgr, "a") == [[0, 1, 2], [3, 4, 5]]
    assert _decode(mgr, a)  # computed 11: skips 4 tokens = block 0, freed to the tail
    assert _ids(mgr, "a") == [[None, 1, 2], [3, 4, 5]]
    assert list(pool.free_queue)[-1] == 0
    assert pool.num_cached_free == 1  # block 0 keeps its hash (full since the prompt)
    assert _decode(mgr, a)  # computed 12: 13 tokens need a 4th block in each group
    assert _ids(mgr, "a") == [[None, 1, 2, 6], [3, 4, 5, 7]]
    assert pool.num_active == 7
    mgr.free(a)  # each group last block first, sliding group then full group
    assert list(pool.free_queue) == \
        [*range(8, 20), 0, 6, 2, 1, 7, 5, 4, 3]


def test_prefix_hit_needs_the_window_blocks_in_the_sliding_group() -> None:
    pool = BlockPool(16)
    mgr = HybridKVCacheManager(pool, 4, KINDS)
    a = _req("a", [("P", 24)])
    assert mgr.allocate_slots(a, 24)
    assert _ids(mgr, "a") == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    mgr.free(a)  # queue: 12 13 14 15 | 5 4 3 2 1 0 | 11 10 9 8 7 6
    x = _req("x", [("X", 12)])
    assert mgr.allocate_slots(x, 12)  # pops 12 13 14 | 15 5 4: evicts P's sliding 5, 4
    assert _ids(mgr, "x") == [[12, 13, 14], [15, 5, 4]]
    mgr.free(x)
    b = _req("b", [("P", 24), ("Q", 1)])
    hit = mgr.get_computed_blocks(b)
    # full: P's 6 blocks all cached; sliding, right to left inside 6: positions 5 and 4
    # were evicted, 3 and 2 are two consecutive hits -> the hit ends after position 3
    assert hit.num_tokens == 16
    assert [list(g) for g in hit.groups] == \
        [[None, None, 2, 3], [6, 7, 8, 9]]
    assert mgr.allocate_slots(b, 25 - 16, hit)
    # queue after touching 2 3 6 7 8 9: 1 0 11 10 14 13 12 4 5 15 -> 3 pops each group
    assert _ids(mgr, "b") == [[None, None, 2, 3, 1, 0, 11], [6, 7, 8, 9, 10, 14, 13]]
    assert pool.evictions == 2 + 6


def test_hit_shorter_than_the_window_run_starts_at_block_zero() -> None:
    pool = BlockPool(12)
    mgr = HybridKVCacheManager(pool, 4, KINDS)
    a = _req("a", [("P", 24)])
    assert mgr.allocate_slots(a, 24)
    mgr.free(a)  # queue: 5 4 3 2 1 0 | 11 ... 6
    x = _req("x", [("X", 8)])
    assert mgr.allocate_slots(x, 8)  # pops 5 4 | 3 2: P's sliding positions 5..2 evicted
    b = _req("b", [("P", 24), ("Q", 5)])
    hit = mgr.get_computed_blocks(b)
    assert hit.num_tokens == 8  # positions 1, 0: the run that starts at block 0
    assert [list(g) for g in hit.groups] == [[0, 1], [6, 7]]
    assert (mgr.query_tokens, mgr.hit_tokens) == (29, 8)


def test_new_request_gets_null_entries_for_blocks_its_hit_skips() -> None:
    pool = BlockPool(40)
    mgr = HybridKVCacheManager(pool, 4, KINDS)
    a = _req("a", [("P", 40)])
    assert mgr.allocate_slots(a, 40)
    mgr.free(a)
    b = _req("b", [("P", 40), ("Q", 3)])
    hit = mgr.get_computed_blocks(b)
    assert hit.num_tokens == 40  # every block cached: the sliding run is positions 8, 9
    before = pool.num_free
    assert mgr.blocks_needed(b, 3, hit) == 2 + 10 + 1 + 1  # revived + one new per group
    assert mgr.allocate_slots(b, 3, hit)
    # computed 40 skips 33 tokens = 8 blocks: the sliding table holds only 8, 9 + new
    assert _ids(mgr, "b")[0][:10] == [None] * 8 + [8, 9]
    assert len(_ids(mgr, "b")[1]) == 11 and None not in _ids(mgr, "b")[1]
    assert before - pool.num_free == 14


def test_allocation_is_all_or_nothing_but_skipped_blocks_are_freed_first() -> None:
    pool = BlockPool(6)
    mgr = HybridKVCacheManager(pool, 4, KINDS)
    a = _req("a", [("A", 12)])
    assert mgr.allocate_slots(a, 12)  # 3 + 3 blocks: the pool is full
    a.num_computed_tokens, a.num_output = 12, 1
    assert not mgr.allocate_slots(a, 1)  # 13 tokens need 2 blocks, only block 0 freed
    assert _ids(mgr, "a") == [[None, 1, 2], [3, 4, 5]]
    assert pool.num_free == 1


@pytest.mark.parametrize("c,block,window,first", [
    (10, 4, 8, 1),    # step 1 computes token 11: skips 4 tokens = block 0
    (0, 4, 8, 11),    # j - 7 skipped tokens: the first whole block at j = 11
    (5, 4, 1, 3),     # window 1: every computed token is skipped, block 0 at 8 tokens
    (6, 16, 3, 12),   # window under a block: 6 + 12 - 3 + 1 = 16
    (100, 16, 64, 11),  # 100 - 64 + 1 = 37 skipped at j = 0; 48 at j = 11
])
def test_first_free_step_is_where_skipped_tokens_reach_a_new_block(c, block, window, first):
    skipped = [max(0, c + j - window + 1) // block for j in range(4 * block)]
    assert first == next(j for j in range(1, 4 * block) if skipped[j] > skipped[j - 1])
    assert _first_free_step((c,), block, window) == first


def test_stretch_points_are_every_free_pop_and_fill() -> None:
    # item 0 at 10 tokens (block 4, window 8): pops at j = 2, 6 (tokens 12, 16), fills
    # at j = 1, 5 (tokens 11 -> 12 full), frees at j = 1, 5
    items = (ScheduledItem(None, 1, 10, True),)
    assert _hybrid_points(items, 6, 4, 8, True) == [(1, 0), (2, 0), (5, 0), (6, 0)]


class HybridPoolMachine(RuleBasedStateMachine):
    """Random admissions, decodes, frees: blocks are conserved, a table covers the
    request's tokens, and every sliding entry wholly before the window of its last
    allocation is null."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(30)
        self.mgr = HybridKVCacheManager(self.pool, 4, (("sliding", 6),) * 2 + (("full", 0),))
        self.live: dict[str, Request] = {}
        self.at: dict[str, int] = {}  # computed tokens at the last allocate_slots
        self.n = 0

    @rule(prefix=st.sampled_from(["p", "q"]), plen=st.integers(0, 30), tail=st.integers(1, 12))
    def admit(self, prefix: str, plen: int, tail: int) -> None:
        self.n += 1
        rid = f"r{self.n}"
        req = _req(rid, ([(prefix, plen)] if plen else []) + [(rid, tail)], out=100)
        hit = self.mgr.get_computed_blocks(req)
        n = req.num_tokens - hit.num_tokens
        need = self.mgr.blocks_needed(req, n, hit)
        free = self.pool.num_free
        ok = self.mgr.allocate_slots(req, n, hit)
        assert ok == (need <= free)
        if ok:
            assert free - self.pool.num_free == need
            self.at[rid] = hit.num_tokens
            req.num_computed_tokens = hit.num_tokens + n
            req.num_output = 1
            self.live[rid] = req

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        req = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        # NOTE: skipped blocks are freed even when the allocation then fails
        self.at[req.request_id] = req.num_computed_tokens
        _decode(self.mgr, req)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.mgr.free(self.live.pop(data.draw(st.sampled_from(sorted(self.live)))))

    @invariant()
    def conserved(self) -> None:
        refs: dict[int, int] = {}
        for t in (t for ts in self.mgr.tables.values() for t in ts):
            for b in t:
                if b is not None:
                    refs[b] = refs.get(b, 0) + 1
        assert all(self.pool.ref_cnt[i] == n for i, n in refs.items())
        assert self.pool.num_active == len(refs)
        assert self.pool.num_free + self.pool.num_active == self.pool.num_blocks
        for h, b in self.pool.cached.items():
            assert self.pool.block_hash[b] == h
        for rid, req in self.live.items():
            tables = self.mgr.tables[rid]
            skipped = max(0, self.at[rid] - 6 + 1) // 4
            for g, t in enumerate(tables):
                assert len(t) * 4 >= req.num_computed_tokens
                assert all(b is None for b in t[:skipped]) or g == 2
                assert None not in t[skipped:]


TestHybridPool = HybridPoolMachine.TestCase
TestHybridPool.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
