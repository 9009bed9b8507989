"""Replay client against a fake one-slot llama-server: closed loop, token feedback,
failures recorded, bad servers refused before any load."""

from pathlib import Path

import pytest

from kvsim.calibrate.replay import ReplayOptions, replay
from kvsim.calibrate.validate import compare_results
from kvsim.calibrate.wire import TokenSpace
from kvsim.errors import InputError
from kvsim.metrics.results import Results
from kvsim.workload.schema import Session, Turn

from .fake_llama import FakeLlama

SPACE = TokenSpace(low=300, high=900, banned=tuple(range(3, 259)))


def _session(sid: str, start: float, turns: list[tuple[int, int]]) -> Session:
    ts = [Turn(start_s=start if i == 0 else None, think_s=0.01 if i else 0.0,
               input_tokens=inp, output_tokens=out) for i, (inp, out) in enumerate(turns)]
    return Session(session_id=sid, system_prompt_id="a", system_prompt_tokens=20,
                   turns=tuple(ts))


def test_two_turns_feed_generated_tokens_back(tmp_path: Path) -> None:
    with FakeLlama() as srv:
        res = replay([_session("s", 0.0, [(10, 5), (7, 4)])],
                     ReplayOptions(url=srv.url, space=SPACE))
    p0, p1 = srv.prompts
    # turn 1 = system 20 + in 10 + the 5 tokens the server generated + in 7
    assert len(p0) == 30 and len(p1) == 30 + 5 + 7
    assert p1[:30] == p0 and p1[30:35] == [1000, 1001, 1002, 1003, 1004]
    assert srv.bodies[0]["logit_bias"][:2] == [[3, False], [4, False]]
    assert all(b["cache_prompt"] and b["ignore_eos"] and b["stream"] for b in srv.bodies)
    req = res.requests.set_index("request_id")
    # the slot holds prompt + output minus the last token: 30 + 4 reused
    assert req.loc["s#1", "cached_tokens"] == 34
    assert req.loc["s#1", "computed_prompt_tokens"] == 42 - 34
    assert list(req["output_tokens"]) == [5, 4]
    assert len(res.itl) == 4 + 3 and res.source == "measured"
    # gaps come from the server's per-token timings, not the client's clock
    assert res.itl["gap_s"].tolist() == pytest.approx([0.0025] * 7, abs=1e-12)
    # identical segments map to identical tokens across sessions (the system prompt)
    assert SPACE.segment_ids("sys/a", 20) == p0[:20]
    saved = Results.load(res.save(tmp_path / "m"))
    assert saved.source == "measured" and len(saved.requests) == 2


def test_server_errors_become_failed_requests_and_replay_goes_on() -> None:
    with FakeLlama(slot_tokens=60, fail_500_on_turn=0) as srv:
        res = replay([_session("s", 0.0, [(10, 5), (7, 4), (40, 3)])],
                     ReplayOptions(url=srv.url, space=SPACE))
    req = res.requests.set_index("request_id")
    assert req.loc["s#0", "failure_reason"] == "server_error"
    assert not req.loc["s#1", "failed"]
    assert req.loc["s#2", "failure_reason"] == "exceed_context_size_error"
    assert res.summary["failed_requests"] == 2


def test_unreachable_or_wrong_api_refused_before_load() -> None:
    with pytest.raises(InputError, match="unreachable"):
        replay([_session("s", 0, [(1, 1)])], ReplayOptions(url="http://127.0.0.1:9"))
    with FakeLlama() as srv:
        with pytest.raises(InputError, match="is it a llama.cpp server"):
            replay([_session("s", 0, [(1, 1)])], ReplayOptions(url=srv.url, api="openai"))
        assert srv.prompts == []


def test_compare_identical_results_has_zero_error() -> None:
    with FakeLlama() as srv:
        res = replay([_session("s", 0.0, [(10, 5), (7, 4)])],
                     ReplayOptions(url=srv.url, space=SPACE))
    df = compare_results(res, res).set_index("metric")
    assert (df["error"].fillna(0) == 0).all()
    assert df.loc["cached_tokens_match", "predicted"] == 1.0
    assert df.loc["cached_tokens", "measured"] == 0 + 34
