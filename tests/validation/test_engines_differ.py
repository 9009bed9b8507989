"""The allocator families fail differently (docs/reference/engines.md §3.1, §3.4, §3.5, §1.4).

``-c 16384 --parallel 4``: llama.cpp per-slot gives each slot 16384 / 4 = 4,096 tokens;
unified lets any slot grow to 16,384 but all slots share them; vLLM pages a pool sized
from memory.  Sessions grow by 1,000 tokens per turn (800 in + 200 out).
"""

from kvsim.api import simulate
from kvsim.scenario import resolve_scenario
from kvsim.workload.schema import Session, Turn


def _session(sid: str, turns: int, start: float = 0.0) -> Session:
    ts = [Turn(start_s=start, input_tokens=800, output_tokens=200)]
    ts += [Turn(think_s=1.0, input_tokens=800, output_tokens=200) for _ in range(turns - 1)]
    return Session(session_id=sid, turns=tuple(ts))


def _run(engine: dict, sessions: list[Session], gpu: str = "rtx-4090"):
    # NOTE: the trace verbatim (after_failure continue): every turn's prompt is the whole
    # history, so the counts below follow from the turn lengths alone
    sc = resolve_scenario({"gpu": gpu, "model": "llama-3.1-8b", "weights": "q4_k_m",
                           "engine": engine, "workload": {"after_failure": "continue"}})
    return simulate(sc, sessions=sessions)


LLAMA = {"preset": "llama.cpp", "ctx_size": 16384, "parallel": 4}


def _failed_by_session(res) -> dict[str, int]:
    return res.requests.groupby("session_id").failed.sum().astype(int).to_dict()


def test_two_long_two_short() -> None:
    sessions = [_session("long1", 6), _session("long2", 6), _session("short1", 1),
                _session("short2", 1)]
    per_slot = _run({**LLAMA, "allocator": "slots"}, sessions)
    failed = _failed_by_session(per_slot)
    # turns 4 and 5 have prompts of 4,800 and 5,800 tokens >= 4,096: HTTP 400
    assert failed == {"long1": 2, "long2": 2, "short1": 0, "short2": 0}
    reasons = set(per_slot.requests.failure_reason) - {""}
    assert reasons == {"exceed_context_size_error"}
    # context shift only shifts generation: the long prompts still get HTTP 400 (§3.4)
    shifted = _run({**LLAMA, "allocator": "slots", "context_shift": True}, sessions)
    assert _failed_by_session(shifted) == failed
    assert (shifted.events.kind == "truncate_prompt").sum() == 0
    for engine in ({**LLAMA, "allocator": "unified"},
                   {"preset": "vllm", "context_tokens": 16384}):
        res = _run(engine, sessions)
        assert res.summary["failed_requests"] == 0, engine
        assert res.summary["requests"] == 14


def test_four_long_sessions_exhaust_the_unified_pool() -> None:
    sessions = [_session(f"long{i}", 6) for i in range(4)]
    unified = _run({**LLAMA, "allocator": "unified"}, sessions)
    kinds = set(unified.events.kind)
    assert "batch_halving" in kinds
    reasons = set(unified.requests.failure_reason) - {""}
    assert reasons == {"Context size has been exceeded."}
    # Sessions in lockstep (same start, same turn lengths).  After turn t every session
    # holds 1000 (t + 1) tokens: turns 0-3 need at most 4 × 4000 = 16,000 ≤ 16,384 cells
    # → none fails.  Turn 4 (4 × 5000 = 20,000) and turn 5 (4 × 6000 = 24,000) overflow
    # the pool while all four requests are active (a request needs its 200 outputs, one
    # per step, before it leaves; the others' prompts fill the pool within a few 2048-token
    # batches), and docs/reference/engines.md §3.4: at batch size 1 *every active slot* fails,
    # caches cleared → all 4 of turn 4 and all 4 of turn 5 fail: 8 = 2 per session.
    assert unified.summary["failed_requests"] == 8
    assert _failed_by_session(unified) == {f"long{i}": 2 for i in range(4)}
    failed_turns = unified.requests[unified.requests.failed.astype(bool)].turn
    assert sorted(failed_turns) == [4] * 4 + [5] * 4
    vllm = _run({"preset": "vllm", "context_tokens": 16384}, sessions, gpu="rtx-5090")
    assert vllm.summary["failed_requests"] == 0
    assert vllm.summary["requests"] == 24


def test_vllm_preset_second_session_reuses_125_system_prompt_blocks() -> None:
    """Two sessions share a 2,000-token system prompt: under the vllm preset (16-token
    blocks) the second one's prompt hits floor(2000 / 16) = 125 cached blocks."""
    sessions = [Session(session_id=f"s{i}", system_prompt_id="shared",
                        system_prompt_tokens=2000,
                        turns=(Turn(start_s=10.0 * i, input_tokens=100, output_tokens=20),))
                for i in range(2)]
    res = _run({"preset": "vllm", "context_tokens": 8192}, sessions)
    cached = res.requests.set_index("request_id").cached_tokens.to_dict()
    assert cached == {"s0#0": 0, "s1#0": 125 * 16}
