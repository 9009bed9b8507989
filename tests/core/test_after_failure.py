"""After a failed request a session starts a new chat, ends, or goes on (``after_failure``).

Hand-built sessions on a one-slot llama.cpp server (1,000-token slot) and on vLLM
(max_model_len 2,048, 16-token blocks): which requests fail, the prompt and cached
tokens of the turns after a new chat, which turns an ended session drops, and the
``new_chat`` / ``abandon`` events and summary counts.
"""

import pytest

from kvsim.api import simulate
from kvsim.config.workload import AFTER_FAILURE, WorkloadConfig
from kvsim.core.build import PoolSizing
from kvsim.core.sessions import SessionChat, chat_segments
from kvsim.errors import InputError
from kvsim.scenario import resolve_scenario
from kvsim.workload.schema import Session, Turn, prompt_segments

SLOTS = {"preset": "llama.cpp", "context_tokens": 1000, "parallel": 1, "allocator": "slots"}
VLLM = {"preset": "vllm", "context_tokens": 2048}


def _run(engine: dict, sessions: list[Session], rule: str | None, fidelity: str = "step"):
    workload = {} if rule is None else {"after_failure": rule}
    sc = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b", "weights": "q4_k_m",
                           "engine": engine, "latency": {"kind": "constant", "step_s": 0.02},
                           "workload": workload, "sim": {"fidelity": fidelity}})
    tokens = engine["context_tokens"]
    sizing = PoolSizing(kv_pool_tokens=tokens, slot_tokens=tokens, kv_reserved_bytes=tokens * 100,
                        num_gpu_blocks=512, block_tokens=16, static_device_bytes=10**9,
                        device_bytes=2 * 10**9)
    return simulate(sc, sessions=sessions, sizing=sizing)


def _session(sys_tokens: int, turns: list[tuple[int, int]], sid: str = "a") -> Session:
    ts = [Turn(start_s=0.0 if i == 0 else None, think_s=0.0 if i == 0 else 1.0,
               input_tokens=inp, output_tokens=out) for i, (inp, out) in enumerate(turns)]
    return Session(session_id=sid, system_prompt_id="p", system_prompt_tokens=sys_tokens,
                   turns=tuple(ts))


# llama.cpp: turn 1's prompt 100 + 200 + 50 + 800 = 1,150 tokens ≥ the 1,000-token slot
SLOT_TURNS = [(200, 50), (800, 10), (100, 20), (50, 5)]


def _rows(res) -> list[tuple]:
    r = res.requests
    return list(zip(r.request_id, r.prompt_tokens, r.cached_tokens, r.failure_reason))


def test_new_chat_is_the_default_and_restarts_from_the_system_prompt() -> None:
    assert WorkloadConfig().after_failure == "new_chat"
    res = _run(SLOTS, [_session(100, SLOT_TURNS)], None)
    assert _rows(res) == [
        ("a#0", 300, 0, ""),
        ("a#1", 1150, 0, "exceed_context_size_error"),
        # a new chat: system 100 + its own input 100; the slot still holds turn 0's
        # 300 + 50 - 1 tokens, of which it shares the system prompt
        ("a#2", 200, 100, ""),
        # the new chat grows: 100 + 100 + 20 + 50; reuses 200 + 20 - 1
        ("a#3", 270, 219, "")]
    ev = res.events[res.events.kind == "new_chat"]
    assert list(ev.request_id) == ["a#2"]
    assert list(ev.detail) == ["after a#1 failed: exceed_context_size_error"]
    assert (res.summary["new_chats"], res.summary["abandoned_turns"]) == (1, 0)
    assert res.summary["failed_requests"] == 1


def test_continue_replays_the_trace_verbatim() -> None:
    res = _run(SLOTS, [_session(100, SLOT_TURNS)], "continue")
    # every later prompt holds the whole history, so each one fails too
    assert _rows(res) == [
        ("a#0", 300, 0, ""),
        ("a#1", 1150, 0, "exceed_context_size_error"),
        ("a#2", 1150 + 10 + 100, 0, "exceed_context_size_error"),
        ("a#3", 1260 + 20 + 50, 0, "exceed_context_size_error")]
    assert (res.summary["new_chats"], res.summary["abandoned_turns"]) == (0, 0)
    assert not set(res.events.kind) & {"new_chat", "abandon"}


def test_end_session_drops_the_remaining_turns() -> None:
    other = _session(100, [(40, 5), (30, 5)], sid="b")  # untouched by a's failure
    res = _run(SLOTS, [_session(100, SLOT_TURNS), other], "end_session")
    assert sorted(res.requests.request_id) == ["a#0", "a#1", "b#0", "b#1"]
    ab = res.events[res.events.kind == "abandon"]
    assert list(ab.request_id) == ["a#2", "a#3"]
    assert set(ab.detail) == {"session ended after a#1 failed: exceed_context_size_error"}
    # dropped when the failure is seen (turn 1's arrival, 1 s after turn 0 ended),
    # without waiting turn 2's think time
    a1 = res.requests.set_index("request_id").loc["a#1"]
    assert (ab.time_s == a1.finish_s).all()
    assert (res.summary["new_chats"], res.summary["abandoned_turns"]) == (0, 2)


def test_vllm_new_chat_shares_only_the_system_prompt_blocks() -> None:
    # 160 + 320 + 16 + 1,700 = 2,196 ≥ max_model_len 2,048
    s = _session(160, [(320, 16), (1700, 8), (96, 8), (48, 4)])
    res = _run(VLLM, [s], None)
    assert _rows(res) == [
        ("a#0", 480, 0, ""),
        ("a#1", 2196, 0, "maximum context length exceeded"),
        # the system prompt's 10 full blocks are a prefix hit, nothing of the old chat
        ("a#2", 256, 160, ""),
        # 160 + 96 + 8 + 48: turn 2 held 256 + 8 - 1 tokens, 16 full blocks
        ("a#3", 312, 256, "")]
    cont = _run(VLLM, [s], "continue")
    assert list(cont.requests.failure_reason) == ["", *["maximum context length exceeded"] * 3]
    end = _run(VLLM, [s], "end_session")
    assert list(end.requests.request_id) == ["a#0", "a#1"]
    assert end.summary["abandoned_turns"] == 2


@pytest.mark.parametrize("engine", [SLOTS, VLLM], ids=["llama.cpp", "vllm"])
@pytest.mark.parametrize("rule", AFTER_FAILURE)
def test_fast_and_step_send_the_same_turns(engine, rule) -> None:
    s = _session(100, SLOT_TURNS if engine is SLOTS else [(320, 16), (1700, 8), (96, 8)])
    fast, step = (_run(engine, [s], rule, f) for f in ("fast", "step"))
    assert _rows(fast) == _rows(step)
    assert fast.events.drop(columns="time_s").equals(step.events.drop(columns="time_s"))


def test_a_failure_seen_after_a_new_chat_began_changes_nothing() -> None:
    """Open loop: turn 1 fails, turn 2 opens a new chat; turn 0 of the old chat fails
    only later — turn 3 stays in the new chat."""
    s = Session(session_id="x", system_prompt_id="p", system_prompt_tokens=10, turns=tuple(
        Turn(start_s=float(k), input_tokens=5 + k, output_tokens=3) for k in range(4)))
    seen: dict[int, str | None] = {0: None, 1: "boom", 2: "", 3: ""}
    chat = SessionChat(s, "new_chat", lambda i, now: seen[i])
    got = []
    for i in range(4):
        assert chat.begin(i, float(i))
        got.append((chat.start, chat.opened))
        chat.prompt(i)
        chat.sent(i, i)
        if i == 2:
            seen[0] = "late"  # the old chat's turn 0 fails after the new chat began
    assert got == [(0, None), (0, None), (2, ("x#1", "boom")), (2, None)]
    assert chat.new_chats == 1
    # turn 3's segments: system prompt, then turn 2 and its answer, then turn 3
    assert [g.id for g in chat.segments(3)] == ["sys/p", "x/t2/in", "x/t2/out", "x/t3/in"]
    assert chat_segments(s, 3, 0) == prompt_segments(s, 3)


def test_history_none_sessions_are_independent_requests() -> None:
    s = Session(session_id="m", history="none", turns=tuple(
        Turn(start_s=float(k), input_tokens=5, output_tokens=3) for k in range(3)))
    chat = SessionChat(s, "end_session", lambda i, now: "failed")
    for i in range(3):
        assert chat.begin(i, float(i))  # NOTE: nothing to end or restart
        chat.sent(i, i)
    assert chat.rule == "continue" and chat.abandoned == range(0)


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(InputError, match="after_failure"):
        resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b", "engine": "vllm",
                          "workload": {"after_failure": "retry"}})
