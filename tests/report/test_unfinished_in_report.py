"""Report figures take what the summary takes: unfinished requests out of the latency
CDFs, prompts never looked up out of the prefix hit rate."""

import math

import pandas as pd

from kvsim.report import data_run as dr

NAN = math.nan


def _requests() -> pd.DataFrame:
    return pd.DataFrame({
        "request_id": ["a", "b", "c", "d"],
        "status": ["finished", "finished", "unfinished", "failed"],
        "arrival_s": [0.0, 1.0, 2.0, 3.0], "first_scheduled_s": [0.0, 1.0, 2.0, NAN],
        "ttft_s": [0.5, 1.5, 7.0, NAN], "e2e_s": [2.0, 4.0, NAN, NAN],
        "prompt_tokens": [100, 200, 300, 5000], "truncated_prompt_tokens": [0, 0, 0, 0],
        "cached_tokens": [0, 100, 150, 0]})


def test_latency_cdfs_leave_out_unfinished_requests() -> None:
    ttft = dr.ttft_cdf(_requests())
    assert list(ttft["x_s"]) == [0.5, 1.5] and ttft["n"] == 2  # not c's 7 s
    e2e = dr.e2e_cdf(_requests())
    assert list(e2e["x_s"]) == [2.0, 4.0] and list(e2e["p"]) == [0.5, 1.0]
    assert e2e["p95_s"] == 4.0


def test_prefix_hits_leave_out_the_rejected_prompt() -> None:
    h = dr.prefix_hits(_requests())
    # a, b, c looked up (d, rejected at entry, never was): cumulative 0/100, 100/300,
    # 250/600
    assert list(h["time_s"]) == [0.0, 1.0, 2.0]
    assert list(h["hit_rate"]) == [0.0, 100 / 300, 250 / 600]
    assert h["overall"] == 250 / 600
