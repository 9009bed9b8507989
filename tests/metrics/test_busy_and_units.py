"""Units people read: throughput while the server was busy, the most requests at once,
the longest request; latencies in ms below 10 s; durations humanised."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvsim.config.units import format_latency, humanize_duration
from kvsim.metrics.summary import busy, percentiles


def _req(rows: list[tuple[float, float, int, int]]) -> pd.DataFrame:
    """(arrival_s, finish_s, prompt_tokens, output_tokens) per request."""
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))],
                         "arrival_s": [r[0] for r in rows], "finish_s": [r[1] for r in rows],
                         "first_token_s": [r[0] for r in rows],
                         "first_scheduled_s": [r[0] for r in rows],
                         "prompt_tokens": [r[2] for r in rows],
                         "output_tokens": [r[3] for r in rows],
                         "failed": [math.isnan(r[1]) for r in rows]})


def test_throughput_is_over_the_time_the_server_was_busy() -> None:
    # [0, 1] and [0.5, 2] overlap into one busy span of 2 s; [100, 101] adds 1 s; the
    # request failed at entry at 50 s (no finish) lasts no time: busy 3 s, not the 101 s
    # from the first arrival to the last finish. 30 + 30 + 30 output tokens / 3 s = 30/s
    got = busy(_req([(0.0, 1.0, 100, 30), (0.5, 2.0, 10, 30), (50.0, math.nan, 40_000, 0),
                     (100.0, 101.0, 5, 30)]))
    assert got == {"busy_s": 3.0, "output_tokens_per_busy_s": 30.0,
                   "peak_concurrent_requests": 2, "longest_request_tokens": 40_000}


def test_a_request_ending_as_another_arrives_is_not_concurrent_with_it() -> None:
    got = busy(_req([(0.0, 1.0, 1, 1), (1.0, 2.0, 1, 1)]))
    assert got["peak_concurrent_requests"] == 1 and got["busy_s"] == 2.0


def test_every_latency_has_p50_p90_p95_p99_and_the_mean() -> None:
    # 1..20 s: inverted_cdf p50 = the 10th value, p90 the 18th, p95 the 19th, p99 the 20th
    got = percentiles("ttft", pd.Series([float(v) for v in range(1, 21)]))
    assert got == {"ttft_p50_s": 10.0, "ttft_p90_s": 18.0, "ttft_p95_s": 19.0,
                   "ttft_p99_s": 20.0, "ttft_mean_s": 10.5}


@pytest.mark.parametrize("seconds,text", [
    (0.0592, "59.2 ms"), (1.9801, "1,980 ms"), (0.0005, "0.50 ms"), (9.9994, "9,999 ms"),
    (14.0, "14.0 s"), (250.3, "250 s"), (math.nan, "-")])
def test_latencies_read_in_ms_below_10_s(seconds: float, text: str) -> None:
    assert format_latency(seconds) == text


@pytest.mark.parametrize("seconds,text", [
    (12.34, "12.3 s"), (243.0, "4 min 3 s"), (84405.2, "23 h 26 min"),
    (3 * 86400 + 4 * 3600 + 5, "3 d 4 h")])
def test_durations_are_humanised(seconds: float, text: str) -> None:
    assert humanize_duration(seconds) == text
