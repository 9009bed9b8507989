"""The requests table's ``status`` column: recorded per row, derived for older folders
and measured replays (which have none), and what the summary does with it."""

import json
import math

import pandas as pd
import pytest

from kvsim.metrics.results import Results
from kvsim.metrics.summary import summarize
from kvsim.report import build_report


def test_an_older_folder_without_status_loads_with_it_derived(tmp_path, make_results) -> None:
    path = make_results(tmp_path / "old", ["a", "b", "c"])
    req = pd.read_parquet(path / "requests.parquet")
    req["failed"] = [False, True, False]
    req.drop(columns=["status"]).to_parquet(path / "requests.parquet", index=False)
    summary = json.loads((path / "summary.json").read_text())
    assert "unfinished_requests" not in summary  # as written before the key existed
    res = Results.load(path)
    assert list(res.requests["status"]) == ["finished", "failed", "finished"]
    html = build_report([res])  # no "unfinished" line on an old folder's card
    assert "unfinished at the stop" not in html


def test_a_results_object_built_without_status_gets_it() -> None:
    """A measured replay builds its tables without the column (kvsim.calibrate.replay)."""
    req = pd.DataFrame({"request_id": ["x", "y"], "failed": [True, False]})
    empty = pd.DataFrame()
    res = Results(requests=req, itl=empty, steps=empty, memory=empty, events=empty,
                  summary={}, references=empty)
    assert list(res.requests["status"]) == ["failed", "finished"]


def _summary(requests: pd.DataFrame, itl: pd.DataFrame, sim_time_s: float) -> dict:
    memory = pd.DataFrame({c: [0] for c in ("kv_reserved_bytes", "kv_allocated_bytes",
                                             "kv_cached_bytes", "host_kv_bytes")})
    return summarize(requests, itl, memory, pd.DataFrame({"steps": [1]}),
                     static_device_bytes=0, device_bytes=1, preemptions=3,
                     sim_time_s=sim_time_s)


def test_percentiles_cover_ended_requests_totals_cover_all() -> None:
    nan = math.nan
    req = pd.DataFrame({
        "request_id": ["a", "b", "c"], "status": ["finished", "unfinished", "unfinished"],
        "arrival_s": [0.0, 0.0, 1.0], "finish_s": [2.0, nan, nan],
        "first_scheduled_s": [0.0, 0.5, nan], "queue_s": [0.0, 0.5, nan],
        "ttft_s": [0.1, 9.0, nan], "e2e_s": [2.0, nan, nan],
        "output_tokens": [20, 30, 0], "prompt_tokens": [100, 100, 100],
        "cached_tokens": [50, 10, 0], "computed_prompt_tokens": [50, 90, 0],
        "recomputed_tokens": [0, 0, 0], "preemptions": [1, 2, 0], "failed": False,
        "truncated": False, "truncated_prompt_tokens": 0})
    itl = pd.DataFrame({"request_id": ["a", "b"], "gap_s": [0.02, 0.5], "count": [19, 29],
                        "gap_delta_s": [0.0, 0.0]})
    s = _summary(req, itl, sim_time_s=4.0)
    assert (s["requests"], s["unfinished_requests"]) == (3, 2)
    # latency: request a alone (b's 9 s TTFT and 0.5 s gaps left out)
    assert s["ttft_p99_s"] == 0.1 and s["itl_p99_s"] == 0.02 and s["e2e_p50_s"] == 2.0
    # totals: every row; 50 tokens over 0 s → the 4 s stop (not a's finish at 2 s)
    assert s["output_tokens"] == 50 and s["tokens_per_s"] == 50 / 4.0
    assert s["preemptions"] == 3 == req["preemptions"].sum()
    # looked up: a and b (scheduled), not c (waiting): (50 + 10) / (100 + 100)
    assert s["prefix_hit_rate"] == pytest.approx(60 / 200)
