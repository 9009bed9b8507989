"""Recall scoring across a new chat (``workload.after_failure: new_chat``, §1.8 / §6.4).

After a failed request the session's next turn starts a fresh chat: its prompt is
the system prompt + that turn's own content.  The pinned head the COLLAPSE check
reads is the first tokens of the prompt actually sent — the system prompt, else the
first ``SINK_TOKENS`` of the chat's first turn — so:

- a reference before the failure reads the old chat: INTACT;
- after it, a reference into the old chat's content is LOST (not in the prompt any
  more, whatever the ledger holds of it), never COLLAPSE;
- a reference into the new chat's own content is INTACT, with or without a system
  prompt (it used to be COLLAPSE without one: the head was turn 0's first tokens).

Sessions (``a``: no system prompt; ``s``: a 100-token one), turns 0-4:

- t0 200 in / 50 out; t1 100 in / 20 out, refers to t0's input;
- t2 1,000 in fails: llama.cpp — its own input fills the 1,000-token slot; Ollama —
  ``OLLAMA_MAX_QUEUE`` 1 is full (another session runs, a third waits);
- t3 100 in starts the new chat, refers to t0's input and t1's answer (old chat)
  and to its own input (new chat);
- t4 50 in refers to t3's input and answer (new chat) and t0's input (old chat).
"""

import re

import pytest

from kvsim.api import simulate
from kvsim.core.build import PoolSizing
from kvsim.scenario import resolve_scenario
from kvsim.workload.schema import ReferenceEvent, Session, Turn

SLOTS = {"preset": "llama.cpp", "context_tokens": 1000, "parallel": 1, "allocator": "slots"}
OLLAMA = {"preset": "ollama", "context_tokens": 4096, "parallel": 1, "max_queue": 1}


def _ref(turn: int, part: str, lo: int, n: int = 16) -> ReferenceEvent:
    return ReferenceEvent(turn=turn, part=part, offset_tokens=lo, length_tokens=n)


def _session(sid: str, sys_tokens: int, fail_think_s: float = 1.0,
             after_s: float = 1.0) -> Session:
    sys = {"system_prompt_id": "p", "system_prompt_tokens": sys_tokens} if sys_tokens else {}
    return Session(session_id=sid, **sys, turns=(
        Turn(start_s=0.0, input_tokens=200, output_tokens=50),
        Turn(think_s=1.0, input_tokens=100, output_tokens=20, references=(_ref(0, "input", 10),)),
        Turn(think_s=fail_think_s, input_tokens=1000, output_tokens=10),
        Turn(think_s=after_s, input_tokens=100, output_tokens=20, references=(
            _ref(0, "input", 10), _ref(1, "output", 2), _ref(3, "input", 40))),
        Turn(think_s=1.0, input_tokens=50, output_tokens=5, references=(
            _ref(3, "input", 20), _ref(3, "output", 0, 8), _ref(0, "input", 100)))))


def _expected(sid: str) -> list[tuple[str, str, str]]:
    return [(f"{sid}#1", "INTACT", f"{sid}/t0/in[10:26]"),
            (f"{sid}#3", "LOST", f"{sid}/t0/in[10:26]"),
            (f"{sid}#3", "LOST", f"{sid}/t1/out[2:18]"),
            (f"{sid}#3", "INTACT", f"{sid}/t3/in[40:56]"),
            (f"{sid}#4", "INTACT", f"{sid}/t3/in[20:36]"),
            (f"{sid}#4", "INTACT", f"{sid}/t3/out[0:8]"),
            (f"{sid}#4", "LOST", f"{sid}/t0/in[100:116]")]


def _run(engine: dict, sessions: list[Session], *sets: dict):
    extra = {k: v for d in sets for k, v in d.items()}
    sc = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b", "weights": "q4_k_m",
                           "engine": engine, "latency": {"kind": "constant", "step_s": 0.02},
                           "workload": {}, **extra})
    tokens = engine["context_tokens"]
    sizing = PoolSizing(kv_pool_tokens=tokens, slot_tokens=tokens, kv_reserved_bytes=tokens * 100,
                        num_gpu_blocks=512, block_tokens=16, static_device_bytes=10**9,
                        device_bytes=2 * 10**9)
    return simulate(sc, sessions=sessions, sizing=sizing)


def _outcomes(res, sid: str) -> list[tuple[str, str, str]]:
    """(request id, outcome, span) of the session's scored references, in order."""
    ev = res.events[(res.events.kind == "reference")
                    & res.events.request_id.str.startswith(f"{sid}#")]
    return [(rid, *re.match(r"^(\S+) \S+ (\S+)", d).groups())
            for rid, d in zip(ev.request_id, ev.detail)]


def _failed(res) -> dict[str, str]:
    r = res.requests
    return dict(zip(r.request_id, r.failure_reason))


@pytest.mark.parametrize("fidelity", ["fast", "step"])
@pytest.mark.parametrize("sys_tokens", [0, 100], ids=["no-system-prompt", "system-prompt"])
def test_llama_cpp_new_chat_scores_old_content_lost_and_new_content_intact(sys_tokens,
                                                                            fidelity) -> None:
    res = _run(SLOTS, [_session("a", sys_tokens)], {"sim": {"fidelity": fidelity}})
    assert _failed(res)["a#2"] == "exceed_context_size_error"
    assert list(res.events[res.events.kind == "new_chat"].request_id) == ["a#3"]
    new = res.requests.set_index("request_id").loc["a#3"]
    assert new.prompt_tokens == sys_tokens + 100  # the new chat: system prompt + own input
    assert _outcomes(res, "a") == _expected("a")
    assert res.summary["recall_collapse_events"] == 0
    assert res.summary["recall_lost_events"] == 3


def _ollama_sessions(sys_tokens: int) -> list[Session]:
    # a#2 arrives at ~22 s, while b runs (10-~50 s) and c waits: the queue is full;
    # a#3 arrives after both ended
    a = _session("a", sys_tokens, fail_think_s=20.0, after_s=60.0)
    b = Session(session_id="b", turns=(Turn(start_s=10.0, input_tokens=50,
                                            output_tokens=2000),))
    c = Session(session_id="c", turns=(Turn(start_s=10.5, input_tokens=50, output_tokens=5),))
    return [a, b, c]


@pytest.mark.parametrize("sys_tokens", [0, 100], ids=["no-system-prompt", "system-prompt"])
def test_ollama_new_chat_scores_old_content_lost_and_new_content_intact(sys_tokens) -> None:
    res = _run(OLLAMA, _ollama_sessions(sys_tokens))
    failed = _failed(res)
    assert failed["a#2"] == "server busy" and failed["a#3"] == "" and failed["c#0"] == ""
    assert list(res.events[res.events.kind == "new_chat"].request_id) == ["a#3"]
    assert _outcomes(res, "a") == _expected("a")
    assert res.summary["recall_collapse_events"] == 0


WINDOW = {"kind": "sliding_window", "window_tokens": 64, "chunk_tokens": 16}


def test_new_chat_sinks_are_pinned_and_dropping_them_still_collapses() -> None:
    """The head moves with the chat: a window that keeps the sinks drops old tokens
    (LOST) and never collapses; one that may drop them (sink_tokens 0, no pinned turn
    boundaries) collapses the old chat's turn 1 and, in the new chat, turn 4 once the
    new chat's own first tokens are gone (turn 3 is scored on its fresh prompt)."""
    ok = _run(SLOTS, [_session("a", 0)], {"policies": [WINDOW]})
    assert _failed(ok)["a#2"] == "exceed_context_size_error"
    assert [o for _, o, _ in _outcomes(ok, "a")] == [
        "LOST", "LOST", "LOST", "INTACT", "LOST", "INTACT", "LOST"]
    bad = _run(SLOTS, [_session("a", 0)], {"policies": [
        {**WINDOW, "sink_tokens": 0, "boundary_tokens": 0}]})
    assert _failed(bad)["a#2"] == "exceed_context_size_error"
    assert [o for _, o, _ in _outcomes(bad, "a")] == [
        "COLLAPSE", "LOST", "LOST", "INTACT", "COLLAPSE", "COLLAPSE", "COLLAPSE"]


@pytest.mark.parametrize("sys_tokens", [0, 100], ids=["no-system-prompt", "system-prompt"])
def test_old_chat_content_offloaded_by_write_back_is_lost_not_recalled(sys_tokens) -> None:
    """A write-back window keeps dropped tokens on the host.  Before the failure, and for
    the new chat's own content, a reference recalls them (RECOVERED); the old chat's
    offloaded content is not in the new chat's prompt, so a reference to it is LOST."""
    res = _run(SLOTS, [_session("a", sys_tokens)], {"policies": [{**WINDOW,
                                                                   "write_back": True}]})
    assert _failed(res)["a#2"] == "exceed_context_size_error"
    assert [o for _, o, _ in _outcomes(res, "a")] == [
        "RECOVERED", "LOST", "LOST", "INTACT", "RECOVERED", "INTACT", "LOST"]
    assert res.summary["recall_collapse_events"] == 0


def test_a_request_refused_at_entry_leaves_nothing_pending() -> None:
    """A request the scheduler refuses inside add_request (after the runtime's on_admit
    saw it) is never scheduled: the next schedule forgets it, so the runtime's per-plan
    check does not stay on for the rest of the run; a queued one stays pending."""
    from types import SimpleNamespace

    from kvsim.policies.recall import RecallScorer

    scorer = RecallScorer(rt=None)
    refused = SimpleNamespace(request_id="a#0", session_id="a", turn=0, failure_reason="")
    queued = SimpleNamespace(request_id="b#0", session_id="b", turn=0, failure_reason="")
    scorer.sent(refused)
    scorer.sent(queued)
    refused.failure_reason = "exceed_context_size_error"  # set by add_request's entry check
    scorer.forget_rejected()
    assert list(scorer.pending) == ["b#0"]
    scorer.forget_rejected()  # each request is looked at once
    assert list(scorer.pending) == ["b#0"]
