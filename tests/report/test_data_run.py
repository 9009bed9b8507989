"""Per-run data functions on the hand-built run of conftest (values worked out by hand)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from report_helpers import EVIL, GIB, make_run

from kvsim.report import data_run as dr

STATIC = 400 * 2**20 + 4_920_000_000 + 300 * 2**20  # driver + weights + activations


def test_memory_stack_layers_sum_to_device_total_and_peak() -> None:
    run = make_run()
    data = dr.memory_stack(run.memory, run.summary, run.scenario)
    labels = [label for label, _ in data["device_layers"]]
    assert labels == ["driver reserve", "weights", "activations", "KV allocated (full)",
                      "KV quant", "KV cached prefix", "KV reserved, free"]
    layers = dict(data["device_layers"])
    # t = 2 s: 3 GiB allocated of which 1/4 GiB quantized, 1/2 GiB cached, 8 GiB pool
    assert layers["KV allocated (full)"][2] == 3 * GIB - GIB // 4
    assert layers["KV quant"][2] == GIB // 4
    assert layers["KV reserved, free"][2] == 8 * GIB - 3 * GIB - GIB // 2
    stacked = sum(v for _, v in data["device_layers"])
    assert list(stacked) == list(data["device_total_bytes"]) == [STATIC + 8 * GIB] * 4
    assert data["peak_device_bytes"] == run.summary["peak_device_bytes"] == STATIC + 8 * GIB
    assert data["capacity_bytes"] == 16 * GIB
    assert [(n, list(v)) for n, v in data["host_layers"]] == [("kv", [0, 0, 0, GIB])]


def test_static_rows_fall_back_to_one_exact_row_when_parts_disagree() -> None:
    summary = {"peak_device_bytes": 10 * GIB, "peak_kv_reserved_bytes": 4 * GIB,
               "weights_gpu_bytes": 5 * GIB}  # parts say 5 GiB, peaks say 6 GiB
    assert dr.static_layers(summary, {}) == [("weights, activations & reserves", 6 * GIB)]
    assert dr.static_layers({}, {}) == []


def test_memory_stack_absent_without_samples() -> None:
    run = make_run()
    assert dr.memory_stack(run.memory.iloc[0:0], run.summary, run.scenario) is None
    assert dr.memory_stack(None, run.summary, run.scenario) is None


def test_session_phases_by_hand() -> None:
    phases = dr.session_phases(make_run().requests)
    got = sorted((r.session_id, r.turn, r.phase, round(r.start_s, 6), round(r.end_s, 6))
                 for r in phases.itertuples())
    assert got == sorted([
        ("alice", 0, "queue", 0.0, 0.1), ("alice", 0, "prefill", 0.1, 0.6),
        ("alice", 0, "decode", 0.6, 2.6), ("alice", 1, "think", 2.6, 12.6),
        ("alice", 1, "queue", 12.6, 12.6), ("alice", 1, "prefill", 12.6, 12.9),
        ("alice", 1, "decode", 12.9, 14.9), (EVIL, 0, "queue", 1.0, 1.2)])


def test_session_markers_failures_and_preemptions() -> None:
    run = make_run()
    marks = dr.session_markers(run.requests, run.events)
    turns = marks[marks["kind"] == "turn"]
    assert sorted(zip(turns["session_id"], turns["time_s"])) == [
        (EVIL, 1.0), ("alice", 0.0), ("alice", 12.6)]
    marks = marks[marks["kind"] != "turn"]
    assert sorted(map(tuple, marks[["session_id", "kind", "time_s", "detail"]].values.tolist())
                  ) == sorted([(EVIL, "failed", 1.2, "exceed_context_size_error"),
                               ("alice", "preempt", 13.0, "recompute")])


def test_session_order_by_first_arrival() -> None:
    assert dr.session_order(make_run().requests) == ["alice", EVIL]


def test_slot_engines_count_cached_inside_allocated() -> None:
    run = make_run()
    run.scenario["engine"] = {"preset": "llama.cpp", "allocator": "unified"}
    layers = dict(dr.memory_stack(run.memory, run.summary, run.scenario)["device_layers"])
    # t = 3 s: 2 GiB used cells of which 1 GiB idle cached, 1/4 GiB quantized
    assert layers["KV allocated (full)"][3] == 2 * GIB - GIB - GIB // 4
    assert layers["KV cached prefix"][3] == GIB
    assert layers["KV reserved, free"][3] == 8 * GIB - 2 * GIB


def test_ttft_cdf_excludes_failed_requests() -> None:
    cdf = dr.ttft_cdf(make_run().requests)
    assert cdf["n"] == 2
    assert cdf["x_s"] == pytest.approx([0.3, 0.6])
    assert list(cdf["p"]) == [0.5, 1.0]
    assert cdf["p50_s"] == pytest.approx(0.3) and cdf["p95_s"] == pytest.approx(0.6)


def test_itl_cdf_is_weighted_by_run_length_count() -> None:
    cdf = dr.itl_cdf(make_run().itl)
    assert cdf["n"] == 198
    assert list(cdf["x_s"]) == [0.02, 0.03]
    assert cdf["p"] == pytest.approx([149 / 198, 1.0])
    # 149 of 198 gaps are 20 ms: the median is 20 ms, p95 is 30 ms
    assert (cdf["p50_s"], cdf["p95_s"]) == (0.02, 0.03)


def test_itl_cdf_carries_a_calibrated_spread() -> None:
    # every gap 20 ms, J ∈ {0.5, 1, 2} equally: the curve steps at 10, 20 and 40 ms
    itl = pd.DataFrame({"request_id": ["a"], "gap_s": [0.02], "count": [300]})
    cdf = dr.itl_cdf(itl, spread=(0.5, 1.0, 2.0))
    assert cdf["n"] == 300
    assert (cdf["x_s"][0], cdf["x_s"][-1]) == pytest.approx((0.01, 0.04))
    assert (cdf["p50_s"], cdf["p95_s"]) == pytest.approx((0.02, 0.04))
    # a third of the curve at or below 10 ms, two thirds at or below 20 ms
    assert float(np.interp(0.015, cdf["x_s"], cdf["p"])) == pytest.approx(1 / 3, abs=1e-3)


def test_concurrency_series() -> None:
    run = make_run()
    c = dr.concurrency(run.memory, run.steps)
    assert list(c["samples"]["running"]) == [0, 1, 2, 1]
    assert list(c["samples"]["waiting"]) == [0, 0, 1, 0]
    assert list(c["steps"]["batch_size"]) == [1, 1, 2, 1]
    assert dr.concurrency(None, None) is None


def test_pcie_traffic_from_events_per_direction() -> None:
    run = make_run()
    p = dr.pcie_traffic(run.events)
    assert p["totals_bytes"] == {"h2d": GIB, "d2h": GIB}
    assert list(p["series"]["d2h"]["time_s"]) == [3.0]
    assert list(p["series"]["h2d"]["cumulative_bytes"]) == [GIB]
    # a run without offload: no figure
    assert dr.pcie_traffic(run.events[run.events["kind"].isin(["fail", "preempt"])]) is None


def test_pcie_traffic_counts_ram_cache_saves_and_the_host_tier() -> None:
    # quickstart's llama.cpp RAM cache writes slots (cache_save, idle_save); vLLM's host
    # tier stores and loads blocks (host_store, host_load): all cross the link
    ev = pd.DataFrame({"time_s": [1.0, 2.0, 3.0, 4.0, 5.0],
                       "kind": ["cache_save", "idle_save", "host_store", "host_load", "fail"],
                       "bytes": [100, 200, 300, 50, 0]})
    p = dr.pcie_traffic(ev)
    assert p["totals_bytes"] == {"d2h": 600.0, "h2d": 50.0}
    assert list(p["series"]["d2h"]["cumulative_bytes"]) == [100, 300, 600]


def test_pcie_traffic_prefers_transfer_table() -> None:
    transfers = pd.DataFrame({"start_s": [1.0, 2.0, 4.0], "end_s": [1.5, 2.5, 4.5],
                              "direction": ["h2d", "D2H", "h2d"], "bytes": [100, 50, 300]})
    p = dr.pcie_traffic(make_run().events, transfers)
    assert p["totals_bytes"] == {"h2d": 400.0, "d2h": 50.0}
    assert list(p["series"]["h2d"]["cumulative_bytes"]) == [100, 400]


def test_prefix_hits_cumulative_by_arrival() -> None:
    h = dr.prefix_hits(make_run().requests)
    assert list(h["time_s"]) == [0.0, 1.0, 12.6]
    assert h["hit_rate"] == pytest.approx([0.0, 0.0, 1100 / 42300])
    assert h["overall"] == pytest.approx(1100 / 42300)


def test_accuracy_per_session_mean_worst_share_below_half() -> None:
    acc = dr.accuracy_per_session(make_run().references)
    assert acc["session_id"].tolist() == ["alice", EVIL]  # worst first
    assert acc["events"].tolist() == [2, 1]
    assert acc["mean"].tolist() == pytest.approx([0.55, 0.97])
    assert acc["worst"].tolist() == [0.1, 0.97]
    assert acc["below_half"].tolist() == [0.5, 0.0]
    assert dr.accuracy_per_session(None) is None


def test_time_scale_units() -> None:
    assert dr.time_scale(100.0) == (1.0, "time (s)")
    assert dr.time_scale(3600.0) == (60.0, "time (min)")
    assert dr.time_scale(7 * 86400.0) == (3600.0, "time (h)")


def test_scenario_config_accepts_wrapped_and_flat() -> None:
    assert dr.scenario_config({"scenario": {"gpu": {}}, "hash": "ab"}) == ({"gpu": {}}, "ab")
    assert dr.scenario_config({"name": "x", "hash": "cd"}) == ({"name": "x"}, "cd")
    assert np.isnan(dr.ttft_cdf(make_run().requests)["x_s"]).sum() == 0


def test_ttft_cdf_carries_a_calibrated_spread() -> None:
    # TTFTs 100 and 300 ms, J ∈ {1, 2}: 100, 200, 300, 600 ms, a quarter each
    req = pd.DataFrame({"ttft_s": [0.1, 0.3, np.nan]})
    cdf = dr.ttft_cdf(req, spread=(1.0, 2.0))
    assert cdf["n"] == 2  # requests that produced a first token
    assert list(cdf["x_s"]) == pytest.approx([0.1, 0.2, 0.3, 0.6])
    assert list(cdf["p"]) == [0.25, 0.5, 0.75, 1.0]
    assert (cdf["p50_s"], cdf["p95_s"]) == pytest.approx((0.2, 0.6))
