"""Paged engines: swap preemption over the link, SGLang's retract order, the host KV tier.

Every number is derived by hand from a 4-token-block pool and a link of 1e9 B/s per
direction with 1 ms per copy (duplex factor 1, so directions do not interact).
"""

import pytest
from core_helpers import req

from kvsim.config.specs import LinkSpec
from kvsim.core.kv.host_pool import HostBlockPool, HostTier
from kvsim.core.link import Link
from kvsim.core.scheduler import PagedScheduler

BW, LAT = 1e9, 1e-3


def _link() -> Link:
    return Link(LinkSpec(name="t", display_name="t", h2d_bytes_per_s=BW, d2h_bytes_per_s=BW,
                         latency_s=LAT, duplex_factor=1.0, source="test"))


def _sched(**kw) -> PagedScheduler:
    args = {"num_blocks": 10, "block_tokens": 4, "block_bytes": 100, "max_num_seqs": 8,
            "max_num_batched_tokens": 64, "max_model_len": 400}
    args.update(kw)
    return PagedScheduler(**args)


def _drive(s: PagedScheduler, now: float = 0.0, dt: float = 0.01) -> list:
    """Run to idle; return each step's plan."""
    plans = []
    while (plan := s.schedule(now)) is not None:
        plans.append(plan)
        now += dt + plan.extra_s
        s.complete(plan, now)
    return plans


def test_swap_preemption_copies_the_victims_blocks_out_and_back() -> None:
    # a and b: 16-token prompts (4 blocks each) + decode.  Step k ≥ 1 needs
    # ceil((16 + k) / 4) blocks per request: at k = 5 a needs its 6th block and the
    # pool (10) is full, so b — the newest, with 20 computed tokens = 5 blocks — is
    # swapped out (500 bytes), and swapped back in once a finishes.
    s = _sched(preemption_mode="swap", swap_space_bytes=10_000, link=_link())
    a, b = req("a#0", [("a", 16)], out=12), req("b#0", [("b", 16)], out=12)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    plans = _drive(s)
    out = [e for e in s.events if e.kind == "swap_out"]
    back = [e for e in s.events if e.kind == "swap_in"]
    assert [(e.request_id, e.bytes) for e in out] == [("b#0", 500)]
    assert [(e.request_id, e.bytes) for e in back] == [("b#0", 500)]
    copy_s = LAT + 500 / BW  # N·block_bytes / bandwidth + latency, each way
    stalls = [p.extra_s for p in plans if p.extra_s]
    assert stalls == [pytest.approx(copy_s, rel=1e-12)] * 2
    assert plans[5].extra_s == pytest.approx(copy_s)  # the swap-out step (k = 5)
    assert b.recomputed_tokens == 0 and b.preemptions == 1 and b.num_output == 12
    assert s.stats["swap_out_bytes"] == s.stats["swap_in_bytes"] == 500
    assert s.link.d2h.bytes == s.link.h2d.bytes == 500
    assert s.swapped == {} and s.memory().host_kv_bytes == 0


def test_swap_space_too_small_falls_back_to_recompute() -> None:
    # As in the swap test, at step 5 a needs its 6th block with all 10 in use and b
    # (20 computed tokens = 5 blocks = 500 B) is the victim; 500 > 400 of swap space, so
    # it is recomputed: its blocks are freed last-first, free queue = [b4 b3 b2 b1 b0].
    # a takes b4 at step 5 (21 tokens) and b3 at step 9 (25 tokens), evicting their
    # hashes.  Steps 6-11: b (21 tokens) hits b0..b3 (then b0..b2) and needs 6 blocks,
    # more than the 4 (then 3) free → waits.  a finishes at step 11 (12th output); at
    # step 12 b re-hits b0..b2 = 12 tokens and computes 21 − 12 = 9: the ones below its
    # old high-water mark (20) are recomputed → 20 − 12 = 8.
    s = _sched(preemption_mode="swap", swap_space_bytes=400, link=_link())
    a, b = req("a#0", [("a", 16)], out=12), req("b#0", [("b", 16)], out=12)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    plans = _drive(s)
    assert not [e for e in s.events if e.kind == "swap_out"]
    pre = [e for e in s.events if e.kind == "preempt"]
    assert [(e.request_id, e.detail) for e in pre] == [("b#0", "recompute 20 tokens")]
    assert pre[0].time_s == pytest.approx(0.05)  # issued in step 5 (steps start at 0.01·k)
    assert [len(p.items) for p in plans[4:13]] == [2, 1, 1, 1, 1, 1, 1, 1, 1]
    assert [(i.req.request_id, i.num_new_tokens, i.context_tokens) for i in plans[12].items] \
        == [("b#0", 9, 12)]
    assert b.recomputed_tokens == 8 and b.preemptions == 1 and a.preemptions == 0
    assert a.num_output == b.num_output == 12
    assert s.link.h2d.bytes == s.link.d2h.bytes == 0 and s.stats["swap_out_bytes"] == 0


@pytest.mark.parametrize("order, victim", [("sglang", "a#0"), ("newest", "b#0")])
def test_sglang_retracts_fewest_outputs_then_longest_prompt(order, victim) -> None:
    # 8 blocks of 4.  a: 12-token prompt, b: 4-token prompt, admitted together; at
    # decode step k a holds ceil((12+k)/4) blocks, b ceil((4+k)/4): 8 in use at k = 5..8,
    # and at k = 9 a needs a 6th.  Both have 9 outputs (a tie), so SGLang retracts the
    # longer prompt — a, the request being scheduled (docs/reference/engines.md §2.3) — where vLLM
    # preempts the newest, b.
    s = _sched(num_blocks=8, retract_order=order)
    a, b = req("a#0", [("a", 12)], out=20), req("b#0", [("b", 4)], out=20)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    plans = _drive(s)
    first = next(e for e in s.events if e.kind == "preempt")
    assert first.request_id == victim
    k = next(i for i, p in enumerate(plans) if len(p.items) == 1)
    assert k == 9 and plans[k].items[0].req.request_id != victim
    assert a.num_output == b.num_output == 20


def test_host_tier_hit_loads_instead_of_recomputing() -> None:
    # a (16-token prompt, 1 output) finishes: its 4 hashed blocks go to the host (400 B).
    # c (20 tokens) takes all 5 GPU blocks, evicting a's cached ones; c's 5 go to host.
    # a2 = a's 16 tokens + 4 new: GPU miss, host hit of 4 blocks → loaded (400 B over
    # h2d: latency + 400/bw), only the 4 new tokens computed.
    # recomputing is slower than the copy
    s = _sched(num_blocks=5, link=_link(), host_tier=HostTier(100, recompute_s=lambda n, c: 1.0))
    assert s.host is not None and (s.host.capacity_blocks, s.host.block_bytes) == (100, 100)
    s.add_request(req("a#0", [("a", 16)], out=1), 0.0)
    _drive(s)
    s.add_request(req("c#0", [("c", 20)], out=1), 1.0)
    _drive(s, 1.0)
    assert s.pool.evictions == 4 and s.stats["host_store_bytes"] == 400 + 500
    a2 = req("a#1", [("a", 16), ("a2", 4)], out=1)
    s.add_request(a2, 2.0)
    plan = s.schedule(2.0)
    [item] = plan.items
    assert (item.num_new_tokens, item.context_tokens) == (4, 16)
    assert plan.extra_s == pytest.approx(LAT + 400 / BW, rel=1e-12)
    assert a2.cached_tokens == 16 and s.stats["host_load_bytes"] == 400
    assert s.loaded_tokens["a#1"] == 16


def test_host_tier_recomputes_when_that_is_cheaper() -> None:
    s = _sched(num_blocks=5, link=_link(), host_tier=HostTier(100, recompute_s=lambda n, c: 0.0))
    s.add_request(req("a#0", [("a", 16)], out=1), 0.0)
    _drive(s)
    s.add_request(req("c#0", [("c", 20)], out=1), 1.0)
    _drive(s, 1.0)
    a2 = req("a#1", [("a", 16), ("a2", 4)], out=1)
    s.add_request(a2, 2.0)
    plan = s.schedule(2.0)
    assert plan.items[0].num_new_tokens == 20 and plan.extra_s == 0.0
    assert s.stats["host_load_bytes"] == 0


def test_host_pool_is_lru_and_keeps_prefixes_longest() -> None:
    h = HostBlockPool(3, 10)
    assert h.store([1, 2, 3]) == 3 and h.bytes == 30
    assert h.match([1, 2, 3]) == 3 and h.match([2, 3]) == 2 and h.match([9, 1]) == 0
    assert h.store([4, 5]) == 2  # evicts the LRU blocks: 3 then 2 (stored last-first)
    assert h.match([1]) == 1 and h.match([2]) == 0 and h.match([3]) == 0
    assert h.evicted_blocks == 2 and h.num_blocks == 3


def test_sglang_retract_frees_decoded_kv_and_keeps_the_prompt_cached() -> None:
    # The pool of the test above.  SGLang retracts a at decode step 9, holding 12 + 8 =
    # 20 computed tokens: 5 full blocks hashed, 3 of them prompt.  The tree keeps the
    # prompt (inserted when prefilled) and frees the decoded KV uninserted
    # (docs/reference/engines.md §2.2-§2.3), so when b then takes a block from the queue head (a's
    # last, freed first) nothing indexed is evicted.  vLLM preempts b (12 tokens, 3 full blocks) and
    # keeps its hashes, so a's new block evicts b's last (§1.3: freed last-first).
    for order, victim, indexed, evictions in (("sglang", "a#0", [True] * 3 + [False] * 2, 0),
                                              ("newest", "b#0", [True, True, False], 1)):
        s = _sched(num_blocks=8, retract_order=order)
        reqs = {r.request_id: r for r in (req("a#0", [("a", 12)], out=20),
                                          req("b#0", [("b", 4)], out=20))}
        for r in reqs.values():
            s.add_request(r, 0.0)
        now = 0.0
        while not any(e.kind == "preempt" for e in s.events):
            plan = s.schedule(now)
            now += 0.01
            s.complete(plan, now)
        [event] = [e for e in s.events if e.kind == "preempt"]
        assert (event.request_id, s.pool.evictions) == (victim, evictions)
        hashes = reqs[victim].block_hashes
        assert [h in s.pool.cached for h in hashes] == indexed, order


def test_sglang_retracts_from_the_decode_batch_not_a_prefilling_request() -> None:
    s = _sched(retract_order="sglang")
    decoding, prefilling = req("d#0", [("d", 8)], out=20), req("p#0", [("p", 40)], out=20)
    decoding.num_output, s.running = 3, [decoding, prefilling]
    assert s._victim() is decoding  # p (no output yet) would win on fewest outputs
    prefilling.num_output = 3
    assert s._victim() is prefilling  # a tie: the longer prompt goes first
