"""``kvsim replay`` applies the simulator's after_failure rule against a fake one-slot
llama-server (60-token slot): the prompts it sends after a failure, the server's cached
tokens, dropped turns, events and counts — and the same turns the simulator sends."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvsim.api import simulate
from kvsim.calibrate.replay import ReplayOptions, replay
from kvsim.calibrate.wire import TokenSpace
from kvsim.cli import cli
from kvsim.core.build import PoolSizing
from kvsim.errors import InputError
from kvsim.metrics.results import Results
from kvsim.scenario import resolve_scenario
from kvsim.workload.schema import Session, Turn

from .fake_llama import FakeLlama

SPACE = TokenSpace(low=300, high=900, banned=tuple(range(3, 259)))
# system 20; turn 1's prompt 20 + 10 + 5 + 40 = 75 > the 60-token slot
TURNS = [(10, 5), (40, 3), (7, 4), (5, 2)]


def _session() -> Session:
    ts = [Turn(start_s=0.0 if i == 0 else None, think_s=0.0 if i == 0 else 0.01,
               input_tokens=inp, output_tokens=out) for i, (inp, out) in enumerate(TURNS)]
    return Session(session_id="s", system_prompt_id="a", system_prompt_tokens=20,
                   turns=tuple(ts))


def _replay(rule: str) -> tuple[Results, FakeLlama]:
    with FakeLlama(slot_tokens=60) as srv:
        res = replay([_session()], ReplayOptions(url=srv.url, space=SPACE, after_failure=rule))
    return res, srv


def _rows(res: Results) -> list[tuple]:
    """(request, prompt, cached, failure); a failed request has no cache figure measured."""
    r = res.requests
    return [(rid, p, None if why else c, why)
            for rid, p, c, why in zip(r.request_id, r.prompt_tokens, r.cached_tokens,
                                      r.failure_reason)]


def test_new_chat_sends_the_system_prompt_and_the_turns_own_input() -> None:
    res, srv = _replay("new_chat")
    p0, _, p2, p3 = srv.prompts
    sys_ids = SPACE.segment_ids("sys/a", 20)
    assert p2 == sys_ids + SPACE.segment_ids("s/t2/in", 7)
    # the new chat grows: turn 2's prompt, the 4 tokens the server generated, turn 3
    assert p3[:27] == p2 and len(p3) == 27 + 4 + 5
    assert p0[:20] == p2[:20] == sys_ids
    assert _rows(res) == [("s#0", 30, 0, ""), ("s#1", 75, None, "exceed_context_size_error"),
                          ("s#2", 27, 20, ""),  # the slot shares the system prompt only
                          ("s#3", 36, 30, "")]  # 27 + 4 − 1 reused
    ev = res.events[res.events.kind == "new_chat"]
    assert list(ev.request_id) == ["s#2"]
    assert list(ev.detail) == ["after s#1 failed: exceed_context_size_error"]
    assert (res.summary["new_chats"], res.summary["abandoned_turns"]) == (1, 0)
    assert res.summary["replay_after_failure"] == "new_chat"


def test_continue_and_end_session() -> None:
    res, _ = _replay("continue")
    assert [r[1:] for r in _rows(res)][1:] == [
        (75, None, "exceed_context_size_error"), (85, None, "exceed_context_size_error"),
        (94, None, "exceed_context_size_error")]
    res, srv = _replay("end_session")
    assert list(res.requests.request_id) == ["s#0", "s#1"] and len(srv.prompts) == 2
    assert list(res.events[res.events.kind == "abandon"].request_id) == ["s#2", "s#3"]
    assert (res.summary["new_chats"], res.summary["abandoned_turns"]) == (0, 2)


@pytest.mark.parametrize("rule", ["new_chat", "end_session", "continue"])
def test_replay_and_simulator_send_the_same_turns(rule: str) -> None:
    measured, _ = _replay(rule)
    sc = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b", "engine": {
        "preset": "llama.cpp", "context_tokens": 256, "parallel": 1, "allocator": "slots"},
        "workload": {"after_failure": rule}})
    sizing = PoolSizing(kv_pool_tokens=61, slot_tokens=61, kv_reserved_bytes=6100)
    predicted = simulate(sc, sessions=[_session()], sizing=sizing)
    assert _rows(predicted) == _rows(measured)
    for res in (predicted, measured):
        assert res.summary["new_chats"] == measured.summary["new_chats"]
        assert res.summary["abandoned_turns"] == measured.summary["abandoned_turns"]


def test_cli_flag(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"trace_meta": {"source": "test", "schema_version": 1}}) + "\n"
                     + _session().model_dump_json() + "\n")
    with FakeLlama(slot_tokens=60) as srv:
        r = CliRunner().invoke(cli, ["replay", "--url", srv.url, "--token-range", "300:900",
                                     "--after-failure", "end_session", str(trace), "-o",
                                     str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    assert Results.load(tmp_path / "m").summary["abandoned_turns"] == 2
    r = CliRunner().invoke(cli, ["replay", "--url", "http://127.0.0.1:9", "--after-failure",
                                 "retry", str(trace), "-o", str(tmp_path / "n")])
    assert r.exit_code == 2 and "--after-failure" in r.output
    with pytest.raises(InputError, match="--after-failure"):
        ReplayOptions(url="http://127.0.0.1:9", after_failure="retry")  # type: ignore[arg-type]
