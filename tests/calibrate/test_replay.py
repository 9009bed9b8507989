"""Replay client against a fake one-slot llama-server: closed loop, token feedback,
failures recorded, bad servers refused before any load."""

import dataclasses
import math
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


def _two_turn_replay() -> Results:
    with FakeLlama() as srv:
        return replay([_session("s", 0.0, [(10, 5), (7, 4)])],
                      ReplayOptions(url=srv.url, space=SPACE))


def test_compare_identical_results_has_zero_error() -> None:
    res = _two_turn_replay()
    df = compare_results(res, res).set_index("metric")
    # no fillna: a NaN error (an empty quantile, a broken join) must fail here
    assert df["error"].notna().all() and (df["error"] == 0).all()
    assert df.loc["cached_tokens_match", "predicted"] == 1.0
    assert df.loc["computed_tokens_match", "predicted"] == 1.0
    assert df.loc["cached_tokens", "measured"] == 0 + 34


def test_compare_reports_ttft_relative_error_and_match_share() -> None:
    measured = _two_turn_replay()
    req = measured.requests.copy()
    req["ttft_s"] = req["ttft_s"] * 1.1  # every predicted TTFT 10 % slower
    rid = req["request_id"] == "s#1"
    assert req.loc[rid, "cached_tokens"].tolist() == [34]
    req.loc[rid, "cached_tokens"] = 30  # one of the two requests mispredicts its cache hit
    predicted = dataclasses.replace(measured, requests=req, source="simulated")
    df = compare_results(measured, predicted).set_index("metric")
    # error = predicted - measured, rel_error = error / measured (validate.py docstring).
    # A quantile of values all scaled by 1.1 is the quantile scaled by 1.1 (an observed
    # value, inverted_cdf), so each TTFT row: (1.1 m - m) / m = +0.10; m > 0 (a real TTFT).
    for q in ("p50", "p95", "p99"):
        row = df.loc[f"ttft_{q}_s"]
        assert row["measured"] > 0
        assert math.isclose(row["predicted"], 1.1 * row["measured"], rel_tol=1e-12)
        assert math.isclose(row["rel_error"], 0.10, rel_tol=1e-9), q  # NaN fails isclose
        # E2E and ITL come from other columns / the itl table: untouched, error exactly 0
        assert df.loc[f"e2e_{q}_s", "error"] == 0 and df.loc[f"itl_{q}_s", "error"] == 0
    # match share: joined on request_id, s#0 0 == 0, s#1 34 != 30 → 1 of 2 = 0.5;
    # the "measured" column holds 1.0, so error = 0.5 - 1.0 = -0.5 (the share that missed)
    match = df.loc["cached_tokens_match"]
    assert (match["measured"], match["predicted"], match["error"]) == (1.0, 0.5, -0.5)
    assert match["rel_error"] == -0.5
    # computed_prompt_tokens untouched: both requests still match
    assert df.loc["computed_tokens_match", "predicted"] == 1.0
    # totals: cached 0 + 34 measured vs 0 + 30 predicted
    tot = df.loc["cached_tokens"]
    assert (tot["measured"], tot["predicted"], tot["error"]) == (34, 30, -4)
    assert math.isclose(tot["rel_error"], -4 / 34, rel_tol=1e-12)


def test_compare_percentiles_are_the_summary_definition() -> None:
    """Observed values (numpy inverted_cdf), as summary.json gives them: TTFTs 1 s and
    3 s have p50 1 s (linear interpolation would say 2 s); a failed request that got its
    first token counts in TTFT, and has no E2E."""
    res = _two_turn_replay()
    req = res.requests.copy()
    req["ttft_s"] = [1.0, 3.0]
    req["e2e_s"] = [5.0, math.nan]
    req["failed"] = [False, True]
    m = compare_results(dataclasses.replace(res, requests=req),
                        dataclasses.replace(res, requests=req)).set_index("metric")
    assert (m.loc["ttft_p50_s", "measured"], m.loc["ttft_p95_s", "measured"]) == (1.0, 3.0)
    assert m.loc["e2e_p50_s", "measured"] == m.loc["e2e_p99_s", "measured"] == 5.0
