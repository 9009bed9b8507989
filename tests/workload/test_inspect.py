"""``inspect`` statistics checked against independent pandas computations on the raw files."""

import json

import numpy as np
import pandas as pd
import pytest

from kvsim.workload.inspect import ServiceModel, inspect_sessions
from kvsim.workload.schema import Session, Turn

PREFILL, DECODE = 2000.0, 50.0


def _peak(starts: pd.Series, ends: pd.Series) -> int:
    """Event sweep: +1 at a start, -1 at an end; ends first when times tie."""
    ev = pd.DataFrame({"t": pd.concat([starts, ends], ignore_index=True),
                       "d": [1] * len(starts) + [-1] * len(ends)})
    ev = ev.sort_values(["t", "d"], kind="mergesort")
    return int(ev["d"].cumsum().max())


@pytest.fixture(scope="module")
def azure_stats(azure_sessions):
    return inspect_sessions(azure_sessions, ServiceModel(PREFILL, DECODE))


def test_azure_matches_pandas(azure_stats, azure_path):
    df = pd.read_csv(azure_path)
    t = pd.to_datetime(df["TIMESTAMP"])
    secs = (t - t.iloc[0]).dt.total_seconds()
    s = azure_stats
    assert s["rows"] == len(df) == s["sessions"] == 19366
    assert s["span_s"] == pytest.approx(secs.max(), abs=1e-5)
    assert s["arrival_rate_per_s"] == pytest.approx(len(df) / secs.max(), rel=1e-9)
    # every kvsim percentile is inverted_cdf (the smallest value with at least q of the
    # column at or below it), as simulate's and plan's latency percentiles
    for col, key in (("ContextTokens", "input_tokens"), ("GeneratedTokens", "output_tokens")):
        assert s[key]["p50"] == np.percentile(df[col], 50, method="inverted_cdf")
        assert s[key]["p95"] == np.percentile(df[col], 95, method="inverted_cdf")
        assert s[key]["mean"] == pytest.approx(df[col].mean())
        assert s[key]["max"] == df[col].max()
    per_min = (secs // 60).astype(int).value_counts().reindex(
        range(int(secs.max() // 60) + 1), fill_value=0)
    assert s["requests_per_minute"] == {
        "min": per_min.min(), "p50": np.percentile(per_min, 50, method="inverted_cdf"),
        "max": per_min.max()}
    ends = secs + df["ContextTokens"] / PREFILL + df["GeneratedTokens"] / DECODE
    peak = _peak(secs, ends)
    assert s["concurrency"]["peak_requests"] == peak
    assert s["concurrency"]["per_minute_peak_requests"]["max"] == peak
    assert s["concurrency"]["peak_sessions"] == peak  # one request per session
    assert s["prefix_reuse"]["hit_tokens"] == 0  # no prefix information in this trace


def test_mooncake_matches_pandas(mooncake_sessions, mooncake_path):
    df = pd.read_json(mooncake_path, lines=True)
    s = inspect_sessions(mooncake_sessions, ServiceModel(PREFILL, DECODE))
    secs = df["timestamp"] / 1000.0
    assert s["rows"] == 3993
    assert s["span_s"] == secs.max() - secs.min() == 1022.025
    assert s["input_tokens"]["p50"] == np.percentile(df["input_length"], 50,
                                                     method="inverted_cdf") == 11587
    assert s["input_tokens"]["p95"] == np.percentile(df["input_length"], 95,
                                                     method="inverted_cdf")
    assert s["output_tokens"]["p95"] == np.percentile(df["output_length"], 95,
                                                      method="inverted_cdf")
    ends = secs + df["input_length"] / PREFILL + df["output_length"] / DECODE
    assert s["concurrency"]["peak_requests"] == _peak(secs, ends)
    # unlimited token-exact cache: every distinct block chain is computed once, at
    # its largest size; everything else is a hit.
    biggest: dict[tuple[int, ...], int] = {}
    for ids, n in zip(df["hash_ids"], df["input_length"]):
        for k in range(len(ids)):
            key = tuple(ids[:k + 1])
            biggest[key] = max(biggest.get(key, 0), min(512, n - 512 * k))
    total = int(df["input_length"].sum())
    assert s["prefix_reuse"]["prompt_tokens"] == total
    assert s["prefix_reuse"]["hit_tokens"] == total - sum(biggest.values())
    assert s["prefix_reuse"]["fraction"] == pytest.approx(0.6512, abs=1e-4)


def test_closed_loop_arrivals_and_references_by_hand():
    # one session: sys 100; t0 in 1000 / out 50; t1 think 10, in 20 / out 10 referring to
    # t0's input (offset 5) exactly; service: prefill 1000 tok/s, decode 10 tok/s.
    s = Session(session_id="s", system_prompt_id="p", system_prompt_tokens=100, turns=(
        Turn(start_s=0.0, input_tokens=1000, output_tokens=50),
        Turn(think_s=10.0, input_tokens=20, output_tokens=10, references=(
            {"turn": 0, "part": "input", "offset_tokens": 5, "length_tokens": 8},))))
    st = inspect_sessions([s], ServiceModel(1000.0, 10.0))
    # t0 busy 1100/1000 + 50/10 = 6.1 s; t1 arrives at 16.1
    assert st["span_s"] == pytest.approx(16.1)
    assert st["input_tokens"]["max"] == 100 + 1000 + 50 + 20
    assert st["new_input_tokens"]["max"] == 1000
    # t1's prompt = sys/p, t0/in, t0/out, t1/in → hit on sys + t0 in + t0 out
    assert st["prefix_reuse"]["hit_tokens"] == 1150
    refs = st["references"]
    assert refs["by_class"] == {"exact": 1, "gist": 0}
    assert refs["distance_turns"]["max"] == 1
    assert refs["distance_tokens"]["max"] == 1170 - 100 - 5
    assert st["concurrency"]["peak_sessions"] == 1


def test_json_serialisable(azure_stats):
    assert json.loads(json.dumps(azure_stats))["rows"] == 19366
    assert np.isfinite(azure_stats["concurrency"]["per_minute_peak_requests"]["p95"])
