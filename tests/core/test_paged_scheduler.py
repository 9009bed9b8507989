"""Token-budget scheduler: chunked prefill, max_num_seqs, recompute preemption."""

from core_helpers import req, run_until_idle

from kvsim.core.scheduler import PagedScheduler


def _sched(**kw) -> PagedScheduler:
    args = {"num_blocks": 10, "block_tokens": 4, "block_bytes": 100, "max_num_seqs": 8,
                "max_num_batched_tokens": 64, "max_model_len": 40}
    args.update(kw)
    return PagedScheduler(**args)


def test_chunked_prefill_and_budget() -> None:
    s = _sched(num_blocks=100, max_num_batched_tokens=16, max_model_len=400)
    a = req("a#0", [("a", 40)], out=2)
    s.add_request(a, 0.0)
    chunks = []
    now = 0.0
    while (plan := s.schedule(now)) is not None:
        chunks.append([i.num_new_tokens for i in plan.items])
        now += 1.0
        s.complete(plan, now)
    assert chunks == [[16], [16], [8], [1]]  # 40-token prompt in 16-token chunks, then decode
    assert a.first_token_s == 3.0 and a.finish_s == 4.0


def test_newest_request_is_preempted_and_rehits_its_prefix() -> None:
    # 10 blocks of 4 tokens = 40 tokens.  a (admitted first) and b each start with 16
    # prompt tokens (4 blocks) and generate; when a needs a 9th... block, b (the newest)
    # is preempted, its blocks freed but still hashed.
    s = _sched()
    a = req("a#0", [("a", 16)], out=12)
    b = req("b#0", [("b", 16)], out=12)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    run_until_idle(s)
    pre = [e for e in s.events if e.kind == "preempt"]
    assert pre and all(e.request_id == "b#0" for e in pre)
    assert a.preemptions == 0 and b.preemptions == len(pre) == s.preemptions
    assert a.num_output == b.num_output == 12
    # b lost its KV but re-hit its own cached prefix: it recomputed fewer tokens than it lost.
    # Trace: step 0 prefills both (4 + 4 blocks); decode step k needs ceil((16 + k) / 4)
    # blocks each: 5 + 5 = 10 for k = 1..4, so at k = 5 a's 6th block preempts b with
    # 20 computed tokens (16 prompt + 4 decoded).  b's blocks are freed last-first
    # (free queue [b4 b3 b2 b1 b0]); a pops b4 at k = 5 and b3 at k = 9 (25 tokens →
    # 7 blocks), evicting their hashes.  Until a finishes (k = 11, its 12th output) b
    # cannot fit: 21 tokens = 6 blocks, 4 (then 3) of them hits, with only 4 (then 3)
    # free.  At k = 12 b re-hits b0..b2 = 12 tokens and computes 21 − 12 = 9 tokens, of
    # which those below its old high-water mark 20 are recomputed: 20 − 12 = 8.
    lost = sum(int(e.detail.split()[1]) for e in pre)
    assert len(pre) == 1 and lost == 20 and pre[0].time_s == 0.05
    assert b.recomputed_tokens == 8
    # hashes evicted: b4, b3 by a; then b's 3 new blocks and its 7th take a's freed
    # blocks (freed last-first, so by table position a6, a5, a4, a3): a6 unhashed (27
    # tokens fill only 6 blocks), a5, a4, a3 hashed → 2 + 3 = 5
    assert s.pool.evictions == 5


def test_max_num_seqs_and_max_model_len() -> None:
    s = _sched(num_blocks=100, max_num_seqs=1, max_model_len=30)
    too_long = req("x#0", [("x", 30)], out=1)
    assert not s.add_request(too_long, 0.0)
    assert too_long.failure_reason == "maximum context length exceeded"
    a, b = req("a#0", [("a", 8)], out=3), req("b#0", [("b", 8)], out=3)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    plan = s.schedule(0.0)
    assert [i.req.request_id for i in plan.items] == ["a#0"]
    run_until_idle(s)
    assert b.first_scheduled_s >= a.finish_s
    long = req("g#0", [("g", 20)], out=100)
    s.add_request(long, 10.0)
    run_until_idle(s, 10.0)
    assert long.truncated and long.num_tokens == 30  # finish_reason "length"
