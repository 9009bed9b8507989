"""Results: save/load round trip, contract columns, version check, weighted percentiles."""

import json
import math

import pytest

from kvsim.api import simulate
from kvsim.core.build import PoolSizing
from kvsim.errors import InputError
from kvsim.metrics.records import weighted_quantile
from kvsim.metrics.results import Results
from kvsim.scenario import resolve_scenario
from kvsim.workload.schema import Session, Turn

CONTRACT = {
    "requests": {"request_id", "session_id", "turn", "member", "kind", "arrival_s",
                 "first_scheduled_s", "first_token_s", "finish_s", "queue_s", "ttft_s", "e2e_s",
                 "prompt_tokens", "cached_tokens", "computed_prompt_tokens", "recomputed_tokens",
                 "output_tokens", "preemptions", "failed", "failure_reason", "itl_mean_s",
                 "itl_p50_s", "itl_p95_s", "itl_max_s", "status"},
    "itl": {"request_id", "gap_s", "count"},
    "steps": {"start_s", "end_s", "steps", "prefill_tokens", "decode_tokens", "batch_size"},
    "memory": {"time_s", "kv_reserved_bytes", "kv_allocated_bytes", "kv_cached_bytes",
               "running", "waiting"},
    "events": {"time_s", "kind", "request_id", "detail", "bytes"},
}


def _results() -> Results:
    sc = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b",
                           "engine": {"preset": "vllm", "context_tokens": 4096},
                           "latency": {"kind": "constant", "step_s": 0.01}, "workload": {}})
    sessions = [Session(session_id="s", turns=(
        Turn(start_s=0.0, input_tokens=100, output_tokens=5),
        Turn(think_s=2.0, input_tokens=10, output_tokens=3)))]
    sizing = PoolSizing(kv_pool_tokens=1024, slot_tokens=4096, kv_reserved_bytes=1024 * 1000,
                        num_gpu_blocks=512, block_tokens=16, static_device_bytes=10**9,
                        device_bytes=2 * 10**9)
    return simulate(sc, sessions=sessions, sizing=sizing)


def test_exact_small_run_and_round_trip(tmp_path) -> None:
    res = _results()
    r = res.requests.set_index("request_id")
    # constant 10 ms steps: prefill in one step (first token), then one token per step
    assert r.loc["s#0", "ttft_s"] == pytest.approx(0.01)
    assert r.loc["s#0", "e2e_s"] == pytest.approx(0.05)
    assert r.loc["s#1", "arrival_s"] == pytest.approx(2.05)
    # turn 1's prompt 100 + 5 + 10 = 115; KV held 104 tokens = 6 full blocks = 96 tokens
    assert r.loc["s#1", "cached_tokens"] == 96
    assert res.itl.groupby("request_id")["count"].sum().to_dict() == {"s#0": 4, "s#1": 2}
    assert res.summary["itl_p50_s"] == pytest.approx(0.01)
    assert res.summary["peak_device_fraction"] == pytest.approx((10**9 + 1024 * 1000) / 2e9)
    for name, cols in CONTRACT.items():
        assert cols <= set(res.table(name).columns), name
    path = res.save(tmp_path / "run")
    back = Results.load(path)
    disk = json.loads((path / "summary.json").read_text())
    # no reference events in these turns: recall not measured, null on disk, NaN loaded
    assert disk["reference_events"] == 0 and disk["recall_mean"] is None
    nan = {k for k, v in back.summary.items() if isinstance(v, float) and math.isnan(v)}
    assert nan == {k for k, v in disk.items() if v is None}
    assert {k: v for k, v in back.summary.items() if k not in nan} == \
        {k: v for k, v in disk.items() if v is not None}
    assert list(back.requests["status"]) == ["finished", "finished"]
    assert back.requests.equals(res.requests)
    assert back.scenario_hash == res.scenario_hash and back.source == "simulated"
    res.save(tmp_path / "run")  # overwriting an existing result directory works


def test_load_names_missing_and_wrong_version(tmp_path) -> None:
    path = _results().save(tmp_path / "run")
    (path / "itl.parquet").unlink()
    with pytest.raises(InputError, match="missing itl.parquet"):
        Results.load(path)
    path = _results().save(tmp_path / "run2")
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(InputError, match="format_version"):
        Results.load(path)


def test_weighted_quantile_is_inverted_cdf() -> None:
    # gaps 0.01 ×3, 0.05 ×1: p50 = 0.01, p95 = 0.05 (the 4th of 4 gaps)
    assert weighted_quantile([0.05, 0.01], [1, 3], 0.5) == 0.01
    assert weighted_quantile([0.05, 0.01], [1, 3], 0.95) == 0.05
    assert weighted_quantile([0.05, 0.01], [1, 3], 0.75) == 0.01
