"""Paged block pool and manager: exact eviction order, prefix hits, conservation."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsim.core.kv.block_pool import BlockPool
from kvsim.core.kv.host_pool import HostBlockPool
from kvsim.core.kv.manager import KVCacheManager
from kvsim.core.kv.prefix import block_hashes, extend_block_hashes
from kvsim.core.requests import Request


def _req(rid: str, segs: list[tuple[str, int]], out: int = 4) -> Request:
    return Request(request_id=rid, session_id=rid, turn=0, arrival_s=0.0,
                   prompt=tuple((s, 0, n) for s, n in segs), output_id=f"{rid}/out",
                   max_output_tokens=out)


def test_free_queue_order_and_lru_eviction_by_block_id() -> None:
    pool = BlockPool(6)
    mgr = KVCacheManager(pool, block_tokens=4)
    a = _req("a", [("A", 12)])  # 3 full blocks
    assert mgr.allocate_slots(a, 12)
    assert mgr.req_blocks["a"] == [0, 1, 2]  # block ids
    b = _req("b", [("B", 8)])
    assert mgr.allocate_slots(b, 8)
    assert mgr.req_blocks["b"] == [3, 4]
    mgr.free(a)  # appended reversed: 2, 1, 0 after the never-used block 5
    assert list(pool.free_queue) == [5, 2, 1, 0]
    mgr.free(b)
    assert list(pool.free_queue) == [5, 2, 1, 0, 4, 3]
    assert pool.num_cached_free == 5
    # a new 3-block request takes 5 (uncached), then evicts a's LAST block (2), then 1
    c = _req("c", [("C", 12)])
    assert mgr.allocate_slots(c, 12)
    assert mgr.req_blocks["c"] == [5, 2, 1]
    assert pool.evictions == 2
    # a's first block survived: a re-submitted `a` hits exactly one block
    a2 = _req("a2", [("A", 12)])
    hit = mgr.get_computed_blocks(a2)
    assert list(hit.blocks) == [0]


def test_vllm_null_block_is_never_allocated() -> None:
    """vLLM v1 takes block 0 as its null block at start-up: of 4 blocks, 3 hold KV, the
    first allocation gets block 1, and a 4-block request cannot be allocated."""
    pool = BlockPool(4, null_block=True)
    mgr = KVCacheManager(pool, block_tokens=4)
    assert (pool.num_free, pool.num_active, pool.num_usable) == (3, 0, 3)
    assert list(pool.free_queue) == [1, 2, 3]
    a = _req("a", [("A", 8)])
    assert mgr.allocate_slots(a, 8)
    assert mgr.req_blocks["a"] == [1, 2]
    assert (pool.num_free, pool.num_active) == (1, 2)
    assert not mgr.allocate_slots(_req("b", [("B", 16)]), 16)  # 4 blocks > the 1 free
    mgr.free(a)
    assert list(pool.free_queue) == [3, 2, 1] and pool.num_active == 0


def test_engines_that_reserve_a_null_block() -> None:
    """vLLM v1 does; SGLang (an extra padding page) and vLLM V0's swap mode do not."""
    from kvsim.config.catalog import load_link
    from kvsim.core.build import PoolSizing, make_scheduler
    from kvsim.engines.resolve import resolve_engine
    sizing = PoolSizing(kv_pool_tokens=4096, slot_tokens=4096, kv_reserved_bytes=256 * 100,
                        num_gpu_blocks=256, block_tokens=16)
    free = {}
    for name, spec in (("vllm", {"preset": "vllm"}), ("sglang", {"preset": "sglang"}),
                       ("vllm-swap", {"preset": "vllm", "preemption_mode": "swap",
                                      "swap_space_bytes": 10**9})):
        eng = resolve_engine({**spec, "context_tokens": 2048})
        free[name] = make_scheduler(eng, sizing, link=load_link("pcie4-x16")).pool.num_free
    assert free == {"vllm": 255, "sglang": 256, "vllm-swap": 256}


def test_prefix_hit_capped_one_token_before_the_end() -> None:
    pool = BlockPool(20)
    mgr = KVCacheManager(pool, block_tokens=16)
    first = _req("x", [("sys", 32)])
    assert mgr.allocate_slots(first, 32)
    mgr.free(first)
    # identical 32-token prompt: 2 cached blocks, but the hit is capped to
    # floor((32 - 1) / 16) * 16 = 16 tokens
    again = _req("y", [("sys", 32)])
    assert mgr.get_computed_blocks(again).num_tokens == 16


def test_shared_system_prompt_reuses_125_blocks() -> None:
    pool = BlockPool(400)
    mgr = KVCacheManager(pool, block_tokens=16)
    s1 = _req("s1", [("sys/a", 2000), ("s1/in", 100)])
    assert mgr.allocate_slots(s1, 2100)
    s2 = _req("s2", [("sys/a", 2000), ("s2/in", 70)])
    hit = mgr.get_computed_blocks(s2)
    assert len(hit.blocks) == 2000 // 16 == 125
    assert hit.num_tokens == 2000


class PagedPoolMachine(RuleBasedStateMachine):
    """Random allocate / grow / free / preempt-like sequences keep the pool consistent."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(24)
        self.mgr = KVCacheManager(self.pool, block_tokens=4)
        self.live: dict[str, Request] = {}
        self.n = 0

    @rule(prefix=st.sampled_from(["p", "q"]), plen=st.integers(0, 30), tail=st.integers(1, 20))
    def admit(self, prefix: str, plen: int, tail: int) -> None:
        self.n += 1
        rid = f"r{self.n}"
        segs = ([(prefix, plen)] if plen else []) + [(rid, tail)]
        req = _req(rid, segs)
        hit = self.mgr.get_computed_blocks(req)
        n = req.num_tokens - hit.num_tokens
        if self.mgr.allocate_slots(req, n, hit):
            req.num_computed_tokens = hit.num_tokens + n
            req.num_output = 1
            self.live[rid] = req

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        req = self.live[rid]
        if self.mgr.allocate_slots(req, 1):
            req.num_computed_tokens += 1
            req.num_output += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.mgr.free(self.live.pop(rid))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def preempt_and_readmit(self, data: st.DataObject) -> None:
        """vLLM recompute preemption: free the blocks, reset progress, ask again —
        the request re-hits whatever of its own prefix nobody evicted meanwhile."""
        rid = data.draw(st.sampled_from(sorted(self.live)))
        req = self.live.pop(rid)
        self.mgr.free(req)
        req.num_computed_tokens = 0  # its sampled tokens stay; all but the last recomputed
        hit = self.mgr.get_computed_blocks(req)
        n = req.num_tokens - 1 - hit.num_tokens
        if self.mgr.allocate_slots(req, n, hit):
            req.num_computed_tokens = hit.num_tokens + n
            self.live[rid] = req

    @invariant()
    def conserved(self) -> None:
        pool = self.pool
        in_flight = 0  # no transfers without policies
        # counted independently of the pool's own counters: walk the free queue
        queued = list(pool.free_queue)  # block ids
        rc, bh = pool.ref_cnt, pool.block_hash
        assert len(set(queued)) == len(queued) == pool.num_free
        assert all(rc[b] == 0 for b in queued)
        active = [b for b in range(pool.num_blocks) if rc[b] > 0]
        cached_free = [b for b in queued if bh[b] is not None]
        # two independent sources: the linked free queue vs the blocks' ref counts.  They
        # partition the pool: disjoint, and together every block exactly once (a block
        # leaked from the queue with ref_cnt 0, or queued while referenced, fails here).
        queued_ids = set(queued)
        active_ids = set(active)
        assert not queued_ids & active_ids
        assert queued_ids | active_ids == set(range(24))
        assert len(queued) + len(active) + in_flight == pool.num_blocks == 24
        assert pool.num_active == len(active)
        assert pool.num_cached_free == len(cached_free)
        assert all(n >= 0 for n in rc)
        # every reference comes from a live block table: each block's ref_cnt is the
        # number of tables holding it, so the referenced blocks are exactly the tables'
        held = Counter(b for v in self.mgr.req_blocks.values() for b in v)
        assert {b: rc[b] for b in active} == dict(held)
        for rid, req in self.live.items():
            assert len(self.mgr.req_blocks[rid]) * 4 >= req.num_computed_tokens
        for h, b in pool.cached.items():
            assert bh[b] == h


TestPagedPool = PagedPoolMachine.TestCase
TestPagedPool.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


class HostPoolMachine(RuleBasedStateMachine):
    """Host KV tier (LRU set of block hashes): never above capacity, every stored block
    is either held or counted as evicted, and a chain's match is its held leading run."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = HostBlockPool(capacity_blocks=8, block_bytes=1000)

    @rule(hashes=st.lists(st.integers(0, 20), min_size=1, max_size=12, unique=True))
    def store(self, hashes: list[int]) -> None:
        before = set(self.pool.lru)
        new = self.pool.store(hashes)
        cap = self.pool.capacity_blocks
        if len(hashes) <= cap:  # nothing of this chain is evicted while it is stored
            assert new == len(set(hashes) - before)
        # stored last-block-first, so the chain's prefix ends most recently used:
        # the LRU tail is the chain's first min(n, cap) blocks, reversed
        k = min(len(hashes), cap)
        assert list(self.pool.lru)[-k:] == hashes[:k][::-1]

    @rule(hashes=st.lists(st.integers(0, 20), max_size=12, unique=True))
    def match(self, hashes: list[int]) -> None:
        n = self.pool.match(hashes)
        assert all(h in self.pool.lru for h in hashes[:n])
        assert n == len(hashes) or hashes[n] not in self.pool.lru

    @invariant()
    def conserved(self) -> None:
        p = self.pool
        assert 0 <= p.num_blocks <= p.capacity_blocks
        assert p.bytes == p.num_blocks * 1000
        assert p.stored_blocks - p.evicted_blocks == p.num_blocks


TestHostPool = HostPoolMachine.TestCase
TestHostPool.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_host_store_never_evicts_its_own_held_prefix() -> None:
    """Capacity 8 holding 7 blocks (0 and 1 among them); storing the chain [1, 2, 3]
    copies only 2 and 3 (block 1 is already on the host), so one older block (8, the
    least recently used) is evicted — not block 1, which would then cross the link again."""
    pool = HostBlockPool(capacity_blocks=8, block_bytes=1000)
    assert pool.store([0, 4, 5, 6, 7, 8, 1]) == 7
    assert pool.store([1, 2, 3]) == 2
    assert 8 not in pool.lru and 1 in pool.lru and pool.evicted_blocks == 1
    assert list(pool.lru)[-3:] == [3, 2, 1]


def test_decode_chain_extension_equals_hashing_the_whole_sequence() -> None:
    # A decoding request's prompt ends mid-block; its output then fills block after block.
    # Extending its chain block by block (the decode path) must give exactly the keys of
    # hashing the whole prompt + output at once.
    bt = 16
    prompt = (("sys", 0, 40), ("u0", 0, 30), ("a0", 0, 25), ("u1", 3, 21))  # 113 tokens
    req = Request(request_id="r", session_id="s", turn=1, arrival_s=0.0, prompt=prompt,
                  output_id="a1", max_output_tokens=200)
    mgr = KVCacheManager(BlockPool(64), bt)
    expected = block_hashes(prompt + (("a1", 0, 90),), bt)
    for n_out in range(1, 91):
        req.num_output = n_out
        mgr._hashes(req, (req.prompt_tokens + n_out) // bt)
    assert req.block_hashes == expected
    assert len(expected) == (113 + 90) // bt


def _keys_token_by_token(seq: tuple, bt: int) -> list[int]:
    """Reference keys: list every token (segment, offset), cut the list into blocks and
    merge each block's consecutive tokens of one segment into a piece."""
    tokens = [(sid, i) for sid, s, e in seq for i in range(s, e)]
    keys: list[int] = []
    parent = None
    for b in range(len(tokens) // bt):
        pieces: list[tuple[str, int, int]] = []
        for sid, i in tokens[b * bt:(b + 1) * bt]:
            if pieces and pieces[-1][0] == sid and pieces[-1][2] == i:
                pieces[-1] = (sid, pieces[-1][1], i + 1)
            else:
                pieces.append((sid, i, i + 1))
        # NOTE: a block inside one piece is keyed by that piece's id and start alone
        # (kvsim.core.kv.prefix)
        one = len(pieces) == 1
        parent = hash((parent, *pieces[0][:2]) if one else (parent, tuple(pieces)))
        keys.append(parent)
    return keys


_pieces = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 40), st.integers(1, 70)),
                   min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(_pieces, st.sampled_from([1, 4, 16]), st.integers(0, 6))
def test_block_keys_equal_a_token_by_token_split(raw: list, bt: int, start_blocks: int) -> None:
    # pieces of arbitrary lengths and offsets; a chain extended from a partial start
    seq = tuple((f"{sid}{k}", s, s + n) for k, (sid, s, n) in enumerate(raw))
    expected = _keys_token_by_token(seq, bt)
    head = extend_block_hashes([], seq, bt, min(start_blocks, len(expected)))
    assert extend_block_hashes(head, seq, bt, len(expected)) == expected
    assert block_hashes(seq, bt) == expected


def test_cache_full_blocks_registers_in_order_and_keeps_the_first_duplicate() -> None:
    """Bulk registration: a block that already carries a hash keeps it, a duplicate
    hash stays indexed under its first block, a pool without caching records nothing."""
    pool = BlockPool(4)
    b0, b1, b2 = pool.get_new_blocks(3)
    pool.cache_full_blocks([b0], [99])
    pool.cache_full_blocks([b0, b1, b2], [10, 20, 20])
    assert [pool.block_hash[b] for b in (b0, b1, b2)] == [99, 20, 20]
    assert pool.cached == {99: b0, 20: b1}
    off = BlockPool(2, enable_caching=False)
    c0, c1 = off.get_new_blocks(2)
    off.cache_full_blocks([c0, c1], [1, 2])
    assert ([off.block_hash[c] for c in (c0, c1)], off.cached) == ([None, None], {})


def test_a_request_that_needs_the_null_block_fails_instead_of_waiting_forever() -> None:
    """vLLM starts with 128 blocks for max_model_len 2048 (all of them), but only 127
    hold KV: a 1,634-token prompt answered with 400 tokens computes 2,033 tokens =
    ceil(2033/16) = 128 blocks and would wait forever; 1,630 + 400 (2,029 tokens, 127
    blocks) runs.  SGLang keeps all 128 blocks and runs both."""
    from kvsim.core.build import PoolSizing, make_scheduler
    from kvsim.core.engine import Engine
    from kvsim.engines.resolve import resolve_engine
    from kvsim.latency.constant import ConstantLatency
    from kvsim.workload.schema import Session, Turn
    sizing = PoolSizing(kv_pool_tokens=2048, slot_tokens=2048, kv_reserved_bytes=128 * 100,
                        num_gpu_blocks=128, block_tokens=16)
    sess = [Session(session_id=f"s{p}", turns=(Turn(start_s=0.0, input_tokens=p,
                                                    output_tokens=400),))
            for p in (1634, 1630)]
    for preset, failed in (("vllm", ["s1634#0"]), ("sglang", [])):
        sched = make_scheduler(resolve_engine({"preset": preset, "context_tokens": 2048}),
                               sizing)
        eng = Engine(sched, ConstantLatency(0.01), sample_interval_s=1.0)
        eng.run(sess)
        rows = {r[0]: r for r in eng.recorder.requests}
        assert sorted(rows) == ["s1630#0", "s1634#0"]
        assert [rid for rid, r in rows.items() if r[18]] == failed
        assert [e[3] for e in eng.recorder.events if e[1] == "fail"] == \
            ["needs 128 KV blocks, 127 hold KV"] * len(failed)
