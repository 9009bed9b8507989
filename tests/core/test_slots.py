"""llama.cpp / Ollama slots: token-exact prompt reuse, slot choice, RAM cache, failures."""

from core_helpers import req, run_until_idle
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvsim.core.slot_scheduler import SlotScheduler
from kvsim.metrics.failures import FAIL_POOL_EXHAUSTED, FAIL_PROMPT_TOO_LONG


def _slots(**kw) -> SlotScheduler:
    args = {"parallel": 2, "slot_tokens": 4096, "pool_cells": 8192, "unified": False, "bytes_per_token": 10,
                "reserved_bytes": 81920, "n_batch": 2048, "cache_ram_bytes": 0}
    args.update(kw)
    return SlotScheduler(**args)


def test_follow_up_turn_reuses_prompt_plus_output_minus_one() -> None:
    s = _slots()
    t0 = req("a#0", [("sys/x", 100), ("a/t0/in", 50)], out=30)
    s.add_request(t0, 0.0)
    now = run_until_idle(s)
    assert t0.num_output == 30 and t0.cached_tokens == 0
    t1 = req("a#1", [("sys/x", 100), ("a/t0/in", 50), ("a/t0/out", 30), ("a/t1/in", 20)], out=5)
    s.add_request(t1, now)
    run_until_idle(s, now)
    # 150 prompt + 30 output - 1 (the last sampled token was never decoded)
    assert t1.cached_tokens == 150 + 30 - 1
    assert t1.computed_prompt_tokens == t1.prompt_tokens - 179 == 21


def test_slot_choice_lcp_above_threshold_else_lru() -> None:
    s = _slots(parallel=3, pool_cells=3 * 4096)
    for i, name in enumerate(["A", "B", "C"]):
        r = req(f"{name}#0", [(name, 1000)], out=2)
        s.add_request(r, 0.0)
    run_until_idle(s)
    holders = {s.pool.slots[i].cache[0][0]: i for i in range(3)}
    # a prompt continuing B's content goes to B's slot (LCP/len > 0.10)
    rb = req("B#1", [("B", 1000), ("x", 200)], out=2)
    s.add_request(rb, 1.0)
    s.schedule(1.0)
    assert rb.slot_id == holders["B"]
    # an unrelated prompt takes the least recently used idle slot
    s2 = _slots(parallel=2, pool_cells=8192)
    for name, t in (("A", 0.0), ("B", 5.0)):
        r = req(f"{name}#0", [(name, 100)], out=2)
        s2.add_request(r, t)
        run_until_idle(s2, t)
    new = req("N#0", [("N", 100)], out=2)
    s2.add_request(new, 10.0)
    s2.schedule(10.0)
    a_slot = next(sl.slot_id for sl in s2.pool.slots if sl.req is None)
    assert s2.pool.slots[a_slot].cache[0][0] == "B"  # A's slot (older) was taken


def test_ollama_takes_the_longest_common_prefix_slot_without_threshold() -> None:
    # A (t=0) then B (t=5) each leave 100 + 2 - 1 tokens in their slot; B's follow-up
    # shares only 100 of its 2,000 prompt tokens (5 % < llama.cpp's 0.10 threshold)
    def follow_up(similarity):
        s = _slots(parallel=2, pool_cells=8192, similarity=similarity)
        for name, t in (("A", 0.0), ("B", 5.0)):
            s.add_request(req(f"{name}#0", [(name, 100)], out=2), t)
            run_until_idle(s, t)
        b1 = req("B#1", [("B", 100), ("x", 1900)], out=2)
        s.add_request(b1, 10.0)
        s.schedule(10.0)
        return b1.cached_tokens
    # llama.cpp: below the threshold → the least recently used slot (A's): nothing reused
    # Ollama (§4.5): the free slot with the longest common prefix (B's): 100 tokens
    assert (follow_up(0.10), follow_up(None)) == (0, 100)


def test_prompt_longer_than_slot_fails_with_400_or_truncates() -> None:
    s = _slots(slot_tokens=1024, pool_cells=2048)
    long = req("L#0", [("L", 1500)], out=4)
    assert not s.add_request(long, 0.0)
    assert long.failure_reason == FAIL_PROMPT_TOO_LONG == "exceed_context_size_error"
    # context shift does not change that in current llama-server builds (§3.4)
    shifting = _slots(slot_tokens=1024, pool_cells=2048, context_shift=True, n_keep=4)
    assert not shifting.add_request(req("L#0", [("L", 1500)], out=4), 0.0)
    # Ollama truncates on its side (§4.5)
    t = _slots(slot_tokens=1024, pool_cells=2048, context_shift=True, n_keep=4,
               truncate_prompt=True)
    long2 = req("L#0", [("L", 1500)], out=4)
    assert t.add_request(long2, 0.0)
    # one message (the latest, kept): the runner keeps num_keep = 4 tokens and drops the
    # oldest after them down to 1023 (one cell left in the 1024-token slot): [4, 481)
    assert long2.prompt_tokens == 1023 and long2.prompt == (("L", 0, 4), ("L", 481, 1500))
    run_until_idle(t)
    assert long2.num_output == 4 and not long2.failure_reason


def test_ollama_drops_old_messages_then_truncates() -> None:
    # docs/reference/engines.md §4.5: messages go oldest first, system prompt and the latest kept.
    # 100 system + 4 x (300 in + 200 out) + 300 in = 2,400 tokens into a 1,024-token slot
    # (fitted to 1,023): t0/in, t0/out, t1/in, t1/out, t2/in, t2/out go (1,500 tokens),
    # leaving 100 + 300 (t3/in) + 200 (t3/out) + 300 (t4/in) = 900
    t = _slots(slot_tokens=1024, pool_cells=2048, n_keep=4, truncate_prompt=True)
    hist = [("sys/s", 100)] + [(f"c/t{i}/{k}", n) for i in range(4)
                                for k, n in (("in", 300), ("out", 200))]
    r = req("c#4", [*hist, ("c/t4/in", 300)], out=4)
    assert t.add_request(r, 0.0)
    assert r.prompt_tokens == 900
    assert [p[0] for p in r.prompt] == ["sys/s", "c/t3/in", "c/t3/out", "c/t4/in"]
    assert t.events[-1].detail == "dropped 1500 tokens of old messages, truncated 0 after 4"
    # the latest message alone over the slot: every older message goes, then the runner
    # truncates after num_keep: 100 + 1,200 = 1,300 -> 1,023, cutting tokens [4, 281):
    # the system prompt's last 96 and the message's first 181
    big = req("c#5", [("sys/s", 100), ("c/t0/in", 300), ("c/t5/in", 1200)], out=4)
    assert t.add_request(big, 0.0)
    assert big.prompt == (("sys/s", 0, 4), ("c/t5/in", 181, 1200))
    assert t.events[-1].detail == "dropped 300 tokens of old messages, truncated 277 after 4"


def test_generation_stops_or_shifts_at_slot_end() -> None:
    s = _slots(slot_tokens=256, pool_cells=512)
    r = req("G#0", [("G", 200)], out=500)
    s.add_request(r, 0.0)
    run_until_idle(s)
    # llama.cpp stops when n_past + 1 >= n_ctx: outputs = n_ctx - prompt
    assert r.truncated and r.num_output == 256 - 200 and not r.failure_reason
    t = _slots(slot_tokens=256, pool_cells=512, context_shift=True, n_keep=0)
    r2 = req("G#0", [("G", 200)], out=500)
    t.add_request(r2, 0.0)
    run_until_idle(t)
    assert r2.num_output == 500 and r2.truncated  # a shift cuts context (server sets truncated)
    assert any(e.kind == "context_shift" for e in t.events)


def test_context_shift_discards_n_discard_tokens_after_n_keep() -> None:
    """llama.cpp (docs/reference/engines.md §3.4): at the slot's end keep n_keep tokens, then drop
    n_discard of the rest (0 = half).  Slot 256, prompt 200, n_keep 10: the slot is full
    at 255 tokens (n_past + 1 >= n_ctx), so the first shift discards (255 - 10) // 2 = 122
    by default, or exactly 50 with n_discard=50."""
    for n_discard, expected in ((0, 122), (50, 50)):
        t = _slots(slot_tokens=256, pool_cells=512, context_shift=True, n_keep=10,
                   n_discard=n_discard)
        r = req("G#0", [("G", 200)], out=100)
        t.add_request(r, 0.0)
        run_until_idle(t)
        shifts = [e.detail for e in t.events if e.kind == "context_shift"]
        assert shifts[0] == f"kept 10, discarded {expected}"
        assert r.num_output == 100 and r.truncated


def test_context_shift_n_keep_minus_one_keeps_the_whole_prompt() -> None:
    """n_keep = -1 keeps the whole prompt (docs/reference/engines.md §3.4): slot 256, prompt 200,
    full at 255 tokens, so the shift keeps 200 and discards half of the other 55 = 27."""
    t = _slots(slot_tokens=256, pool_cells=512, context_shift=True, n_keep=-1)
    r = req("G#0", [("G", 200)], out=100)
    t.add_request(r, 0.0)
    run_until_idle(t)
    shifts = [e.detail for e in t.events if e.kind == "context_shift"]
    assert shifts[0] == "kept 200, discarded 27"
    assert r.num_output == 100 and r.truncated


def test_unified_pool_exhaustion_fails_every_active_slot() -> None:
    s = _slots(parallel=2, slot_tokens=1024, pool_cells=1024, unified=True)
    a = req("a#0", [("a", 400)], out=400)
    b = req("b#0", [("b", 400)], out=400)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    run_until_idle(s)
    assert a.failure_reason == b.failure_reason == FAIL_POOL_EXHAUSTED
    assert [e.kind for e in s.events].count("batch_halving") == 1
    assert s.pool.used_cells == 0


def test_ram_cache_saves_taken_over_slot_and_restores_it() -> None:
    s = _slots(parallel=1, slot_tokens=4096, pool_cells=4096, cache_ram_bytes=None)
    a0 = req("a#0", [("a", 1000)], out=10)
    s.add_request(a0, 0.0)
    now = run_until_idle(s)
    b0 = req("b#0", [("b", 1000)], out=10)  # takes the only slot over: a's state saved
    s.add_request(b0, now)
    now = run_until_idle(s, now)
    assert [e.kind for e in s.events].count("cache_save") == 1
    a1 = req("a#1", [("a", 1000), ("a/t0/out", 10), ("a/t1/in", 50)], out=5)
    s.add_request(a1, now)
    run_until_idle(s, now)
    assert any(e.kind == "restore" for e in s.events)
    assert a1.cached_tokens == 1000 + 10 - 1


def test_ram_cache_off_loses_the_taken_over_slot() -> None:
    """--cache-ram 0 (docs/reference/engines.md §3.4: 0 = off): the same three requests as above,
    but nothing is saved when b takes the only slot over, so a's follow-up finds b's tokens
    in the slot (common prefix 0) and computes its whole prompt."""
    s = _slots(parallel=1, slot_tokens=4096, pool_cells=4096, cache_ram_bytes=0)
    a0 = req("a#0", [("a", 1000)], out=10)
    s.add_request(a0, 0.0)
    now = run_until_idle(s)
    b0 = req("b#0", [("b", 1000)], out=10)
    s.add_request(b0, now)
    now = run_until_idle(s, now)
    a1 = req("a#1", [("a", 1000), ("a/t0/out", 10), ("a/t1/in", 50)], out=5)
    s.add_request(a1, now)
    run_until_idle(s, now)
    kinds = [e.kind for e in s.events]
    assert "cache_save" not in kinds and "restore" not in kinds
    assert a1.cached_tokens == 0
    assert a1.computed_prompt_tokens == 1000 + 10 + 50


class SlotPoolMachine(RuleBasedStateMachine):
    """Random arrivals and steps on a unified and a per-slot pool: cells conserved."""

    def __init__(self) -> None:
        super().__init__()
        self.scheds = [_slots(parallel=3, slot_tokens=512, pool_cells=1024, unified=True,
                              bytes_per_token=3, reserved_bytes=3072, n_batch=128,
                              cache_ram_bytes=2000),
                       _slots(parallel=3, slot_tokens=256, pool_cells=768, unified=False,
                              bytes_per_token=3, reserved_bytes=2304, n_batch=128,
                              cache_ram_bytes=None, context_shift=True)]
        self.now = 0.0
        self.n = 0

    @rule(shared=st.integers(0, 200), own=st.integers(1, 200), out=st.integers(1, 300))
    def arrive(self, shared: int, own: int, out: int) -> None:
        self.n += 1
        segs = ([("sys", shared)] if shared else []) + [(f"u{self.n}", own)]
        for s in self.scheds:
            s.add_request(req(f"r{self.n}#0", segs, out, self.now), self.now)

    @rule(k=st.integers(1, 20))
    def steps(self, k: int) -> None:
        for s in self.scheds:
            now = self.now
            for _ in range(k):
                plan = s.schedule(now)
                if plan is None:
                    break
                now += 0.01
                s.complete(plan, now)
        self.now += 0.01 * k

    @rule(prompts=st.lists(st.integers(300, 480), min_size=3, max_size=3))
    def oversubscribe(self, prompts: list[int]) -> None:
        """Drain both engines, then three unrelated prompts of 300-480 tokens at once,
        each generating up to the slot's end (511 tokens, then truncated).  On the
        unified pool (1024 cells) none of them can finish first: the first admitted
        needs ≥ 511 − 480 = 31 decode steps after its prompt, the other two prompts
        (≤ 960 tokens at ≥ 128 − 3 a step) are in after ≤ 8, and 511 + 300 + 300 =
        1111 > 1024.  So a batch finds no cells (no idle slot to purge), and every
        active slot fails with its cells cleared.  The per-slot engine (256-token
        slots, context shift) truncates the same prompts."""
        for s in self.scheds:
            self.now = max(self.now, self._drain(s, self.now))
        unified, per_slot = self.scheds
        reqs = []
        for n in prompts:
            self.n += 1
            segs = [(f"big{self.n}", n)]
            for s in self.scheds:
                r = req(f"r{self.n}#0", segs, 300, self.now)
                s.add_request(r, self.now)
                if s is unified:
                    reqs.append(r)
        now = self.now
        for _ in range(2000):
            seen = len(unified.events)
            plan = unified.schedule(now)
            assert plan is not None, "the three requests finished without exhausting the pool"
            now += 0.01
            if any(e.kind == "batch_halving" for e in unified.events[seen:]):
                needed = sum(i.num_new_tokens for i in plan.items)
                assert unified.pool.used_cells + needed > unified.pool.pool_cells
                active = {sl.req.request_id for sl in unified.pool.slots if sl.req is not None}
                assert active == {r.request_id for r in reqs}
                unified.complete(plan, now)
                break
            unified.complete(plan, now)
            self.conserved()
        else:
            raise AssertionError("no exhaustion")
        event("unified pool exhausted")
        assert [r.failure_reason for r in reqs] == [FAIL_POOL_EXHAUSTED] * 3
        assert all(r.finish_s == now for r in reqs)
        assert all(sl.req is None and sl.n_tokens == 0 and sl.cache == [] for sl in
                   unified.pool.slots)
        assert unified.pool.used_cells == 0
        self.conserved()
        self.now = max(now, self._drain(per_slot, self.now))

    def _drain(self, s: SlotScheduler, now: float) -> float:
        for _ in range(20_000):
            plan = s.schedule(now)
            if plan is None:
                return now
            now += 0.01
            s.complete(plan, now)
            self.conserved()
        raise AssertionError("scheduler did not drain")

    @invariant()
    def conserved(self) -> None:
        for s in self.scheds:
            pool = s.pool
            assert 0 <= pool.used_cells <= pool.pool_cells
            assert all(0 <= sl.n_tokens <= pool.slot_tokens for sl in pool.slots)
            assert all(sl.n_tokens == sum(e - b for _, b, e in sl.cache) for sl in pool.slots)
            mem = s.memory()
            assert mem.kv_allocated_bytes <= mem.kv_reserved_bytes
            assert mem.kv_cached_bytes <= mem.kv_allocated_bytes
            if s.ram.limit_bytes is not None and len(s.ram.entries) > 1:
                assert s.ram.total_bytes <= s.ram.limit_bytes
            assert s.ram.total_bytes == sum(e.bytes for e in s.ram.entries)


TestSlotPool = SlotPoolMachine.TestCase
TestSlotPool.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)


def test_ram_cache_entries_hold_every_layers_kv_under_partial_offload() -> None:
    # qwen2.5-32b q4_k_m on a 12 GB card: --fit puts the output head + 31 of 64 layers
    # on the GPU (tests/model/test_budget.py); f16 KV is 262,144 B/token over 64 layers
    # (docs/reference/models.csv), so the GPU pool holds 31 x 4,096 = 126,976 B/token and a
    # RAM-cache entry, the slot's whole serialized state (docs/reference/engines.md §3.4),
    # 262,144 B/token
    from kvsim.core.build import PoolSizing, make_scheduler
    from kvsim.engines.budget import memory_budget
    from kvsim.scenario import resolve_scenario

    sc = resolve_scenario({"gpu": "rtx-3060-12gb", "model": "qwen2.5-32b",
                           "weights": "q4_k_m", "workload": {},
                           "engine": {"preset": "llama.cpp", "ctx_size": 8192}})
    b = memory_budget(sc.gpu, sc.model, sc.weights, sc.engine)
    assert (b.gpu_layers, b.num_layers) == (31, 64)
    sched = make_scheduler(sc.engine, PoolSizing.from_budget(b))
    assert sched.bytes_per_token == 126_976 and sched.ram.bytes_per_token == 262_144


def test_ollama_rejects_requests_past_its_queue_limit() -> None:
    # docs/reference/engines.md §4.1: OLLAMA_MAX_QUEUE (default 512) pending requests, then HTTP 503
    # "server busy"; llama-server defers without a limit (§3.4)
    from kvsim.engines.resolve import resolve_engine
    from kvsim.metrics.failures import FAIL_QUEUE_FULL

    assert (resolve_engine("ollama").max_queue, resolve_engine("llama.cpp").max_queue) == (
        512, None)
    s = _slots(parallel=1, max_queue=2)
    reqs = [req(f"q{i}#0", [(f"q{i}", 10)], out=2) for i in range(4)]
    assert [s.add_request(r, 0.0) for r in reqs] == [True, True, False, False]
    assert reqs[2].failure_reason == FAIL_QUEUE_FULL == "server busy"
    run_until_idle(s)  # the queue drains: a later request is accepted again
    assert s.add_request(req("q4#0", [("q4", 10)], out=2), 1.0)
    unlimited = _slots(parallel=1)
    assert all(unlimited.add_request(req(f"u{i}#0", [(f"u{i}", 10)], out=2), 0.0)
               for i in range(600))


def test_fresh_slots_go_last_first_on_llama_server_first_first_on_ollama() -> None:
    """llama-server's LRU scan keeps the last of equal ``t_last_used`` (``<=``,
    tools/server/server-context.cpp), so a fresh server fills slots 3, 2, 1, 0; slots
    released in one step were released in slot order, so the lowest id is the least
    recently used of them.  Ollama's scan keeps the first (``Before``): 0, 1, 2."""
    for last, order in ((True, [3, 2, 1]), (False, [0, 1, 2])):
        s = _slots(parallel=4, pool_cells=4 * 4096, fresh_slots_from_last=last)
        reqs = [req(f"{n}#0", [(n, 100)], out=1) for n in "ABC"]
        for r in reqs:
            s.add_request(r, 0.0)
        now = run_until_idle(s)  # all three finish in the one step that samples them
        assert [r.slot_id for r in reqs] == order
        d = req("D#0", [("D", 100)], out=1)
        s.add_request(d, now)
        s.schedule(now)
        # never-used slot first (llama.cpp: slot 0 is the only one left; Ollama: 3)
        assert d.slot_id == (0 if last else 3)
        e = req("E#0", [("E", 100)], out=1)
        s.add_request(e, now)
        s.schedule(now)
        assert e.slot_id == min(order)  # of the three released together, the lowest id
