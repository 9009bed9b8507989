"""family-4 (one household day, llama.cpp on a 16 GB RTX 4060 Ti, -c 32768, 4 unified
slots) side by side under f16, q8_0, q4_0, a sliding window, recoverable eviction
and idle offload.  Each row's direction, and why:

- q8_0 / q4_0: reserved KV = f16 × 34/64 / 18/64 exactly (block sizes, docs/reference/engines.md
§0); 8-bit reads are INTACT (§6.4), 4-bit DEGRADED (recall < 1); fewer KV bytes read per
  decode step → p95 inter-token latency not above f16's.
- sliding window (2048): old tokens dropped → peak allocated KV below f16; exact
  references beyond the window LOST → recall well below f16, with events < 0.5.
- recoverable eviction (2048, q4_0): old tokens at 18/64 bytes on the GPU → peak
  allocated below f16; recalls RECOVERED (≥ 0.955) → recall between the window's and
  f16's, with latency added.  Its full copies on the host → more PCIe bytes than the same
  server without it (both with ``--no-cache-idle-slots``, row ``recoverable_keep``: the
  default server's own RAM-cache traffic depends on the step timing, so f16 is no fixed
  yardstick for PCIe bytes).
- idle offload (10 s), on a server started with ``--no-cache-idle-slots`` (whose idle
  slots keep their KV on the GPU, row ``keep_idle``): idle slots leave the GPU → peak
  allocated below ``keep_idle``; written and restored over PCIe → more PCIe bytes;
  lossless → recall equals f16's.
- the default server (``--cache-idle-slots`` on, docs/reference/engines.md §3.4) already saves idle
  slots to its RAM cache and clears them from the unified pool whenever a task
  starts → peak allocated not above ``keep_idle``.
"""

import pytest

from kvsim.api import simulate
from kvsim.scenario import load_scenario

ROWS = {
    "f16": [],
    "q8_0": ["engine.cache_type_k=q8_0", "engine.cache_type_v=q8_0"],
    "q4_0": ["engine.cache_type_k=q4_0", "engine.cache_type_v=q4_0"],
    "window": ["policies=[{kind: sliding_window, window_tokens: 2048}]"],
    "recoverable": ["policies=[{kind: recoverable_eviction, window_tokens: 2048}]"],
    "keep_idle": ["engine.cache_idle_slots=false"],
    "recoverable_keep": ["engine.cache_idle_slots=false",
                         "policies=[{kind: recoverable_eviction, window_tokens: 2048}]"],
    "idle_offload": ["engine.cache_idle_slots=false",
                     "policies=[{kind: idle_offload, idle_after_s: 10}]"],
}
KEYS = ("peak_kv_reserved_bytes", "peak_kv_allocated_bytes", "ttft_p95_s", "itl_p95_s",
        "recall_mean", "recall_worst", "recall_share_below_0_5", "pcie_h2d_bytes",
        "pcie_d2h_bytes", "recall_latency_added_s", "recall_collapse_events")


@pytest.fixture(scope="module")
def table() -> dict[str, dict[str, float]]:
    out = {}
    for name, sets in ROWS.items():
        sc = load_scenario("quickstart", ["engine.ctx_size=32768", *sets])
        assert sc.gpu.name == "rtx-4060-ti-16gb"
        s = simulate(sc).summary
        out[name] = {k: s[k] for k in KEYS} | {"pcie": s["pcie_h2d_bytes"] + s["pcie_d2h_bytes"]}
    return out


def test_side_by_side_directions_match_the_mechanisms(table) -> None:
    f16, q8, q4 = table["f16"], table["q8_0"], table["q4_0"]
    win, rec, off = table["window"], table["recoverable"], table["idle_offload"]
    assert q8["peak_kv_reserved_bytes"] * 64 == f16["peak_kv_reserved_bytes"] * 34
    assert q4["peak_kv_reserved_bytes"] * 64 == f16["peak_kv_reserved_bytes"] * 18
    assert f16["recall_mean"] == q8["recall_mean"] == 1.0
    assert 0.97 <= q4["recall_mean"] < 1.0
    assert q4["itl_p95_s"] <= q8["itl_p95_s"] <= f16["itl_p95_s"]
    for row in (win, rec):
        assert row["peak_kv_allocated_bytes"] < f16["peak_kv_allocated_bytes"]
    keep = table["keep_idle"]
    assert off["peak_kv_allocated_bytes"] < keep["peak_kv_allocated_bytes"]
    assert f16["peak_kv_allocated_bytes"] <= keep["peak_kv_allocated_bytes"]
    assert win["recall_mean"] < rec["recall_mean"] < f16["recall_mean"]
    assert win["recall_share_below_0_5"] > 0 == rec["recall_share_below_0_5"]
    assert rec["recall_worst"] >= 0.955 - 1e-12 and rec["recall_latency_added_s"] > 0
    assert table["recoverable_keep"]["pcie"] > keep["pcie"] and off["pcie"] > keep["pcie"]
    assert off["recall_mean"] == f16["recall_mean"]
    assert all(row["recall_collapse_events"] == 0 for row in table.values())


def test_idle_offload_on_family_4_lowers_peak_gpu_kv_and_raises_pcie(table) -> None:
    f16, off = table["keep_idle"], table["idle_offload"]
    assert off["peak_kv_allocated_bytes"] < f16["peak_kv_allocated_bytes"]
    assert off["pcie_d2h_bytes"] > f16["pcie_d2h_bytes"]
    assert off["pcie_h2d_bytes"] > f16["pcie_h2d_bytes"]


@pytest.mark.parametrize("policy", [
    "policies=[{kind: idle_offload, idle_after_s: 10}]",
    "policies=[{kind: recoverable_eviction, window_tokens: 2048}]",
])
def test_fast_forward_and_per_step_agree_under_policies(policy) -> None:
    runs = [simulate(load_scenario("quickstart", ["engine.ctx_size=32768",
                                                  "workload.max_sessions=12", policy,
                                                  f"sim.fidelity={f}"]))
            for f in ("fast", "step")]
    fast, step = (r.requests.set_index("request_id").sort_index() for r in runs)
    assert (fast["ttft_s"] - step["ttft_s"]).abs().max() <= 1e-9
    for key in ("recall_mean", "peak_kv_allocated_bytes", "pcie_h2d_bytes", "pcie_d2h_bytes"):
        assert runs[0].summary[key] == runs[1].summary[key], key
