"""Weights left on the CPU that host RAM cannot keep resident: flagged, never hidden
(the latency model reads them at RAM bandwidth; the host profiles have no disk figure)."""

import dataclasses

from kvsim.api import simulate
from kvsim.config.catalog import load_gpu, load_host, load_model
from kvsim.engines.budget import memory_budget, weights_beyond_ram
from kvsim.engines.memory import GIB
from kvsim.engines.resolve import resolve_engine
from kvsim.scenario import load_scenario

SMALL = ["workload.days=0.05", "workload.max_sessions=1"]


def _budget():
    return memory_budget(load_gpu("rtx-4090"), load_model("llama-3.2-1b"), "f16",
                         resolve_engine({"preset": "llama.cpp", "ctx_size": 4096}))


def test_discrete_host_holds_the_cpu_weights_beside_the_cpu_kv():
    host = load_host("desktop-64gb")  # 64 GiB = 68,719,476,736 B
    b = dataclasses.replace(_budget(), weights_cpu_bytes=60 * GIB, kv_cpu_bytes=3 * GIB)
    assert weights_beyond_ram(b, host) == 0            # 60 + 3 = 63 GiB <= 64 GiB
    b = dataclasses.replace(b, kv_cpu_bytes=5 * GIB)   # 60 + 5 = 65 GiB: 1 GiB too many
    assert weights_beyond_ram(b, host) == GIB == 1_073_741_824


def test_unified_memory_counts_the_gpu_layout_too():
    host = load_host("apple-m4-max-128gb")  # 128 GiB shared by the GPU and the CPU
    assert host.unified_with_gpu and host.memory_bytes == 128 * GIB
    # GPU rows: driver 1 + weights 100 + KV 20 GiB = 121 GiB, then 8 GiB of CPU weights:
    # 121 + 8 = 129 GiB, 1 GiB over the 128 GiB
    b = dataclasses.replace(_budget(), driver_reserve_bytes=GIB, display_reserve_bytes=0,
                            weights_gpu_bytes=100 * GIB, activation_bytes=0,
                            engine_overhead_bytes=0, kv_reserved_bytes=20 * GIB,
                            weights_cpu_bytes=8 * GIB, kv_cpu_bytes=0)
    assert weights_beyond_ram(b, host) == GIB


def test_simulate_flags_the_summary_and_the_cli_warns(tmp_path, kvsim_cli):
    # the audit's case: llama-3.1-70b bf16 on a 16 GB card beside the default 64 GiB
    # desktop; fit puts most of its 141,199,999,968 B of weights (70.6e9 x 2 B) in RAM
    sets = ["model=llama-3.1-70b", "weights=bf16", *SMALL]
    res = simulate(load_scenario("quickstart", sets))
    assert res.summary["weights_exceed_host_ram"] is True
    short = res.summary["weights_beyond_host_ram_bytes"]
    assert short > 141_199_999_968 - 16 * GIB - 64 * GIB  # more than the card + RAM spare
    code, err, _ = kvsim_cli("simulate", "quickstart", *[a for x in sets for a in ("--set", x)],
                             "-o", tmp_path / "r", "--no-report")
    warns = [ln for ln in kvsim_cli.stderr.splitlines() if "host RAM" in ln]
    assert (code, err) == (0, "") and len(warns) == 1
    assert warns[0].startswith("warning: the weights left in host RAM and the KV there "
                               "exceed desktop-64gb's memory by ")


def test_resident_weights_are_silent(tmp_path, kvsim_cli):
    # quickstart: llama-3.1-8b q4_k_m all but 303 MiB on the card, 64 GiB host
    res = simulate(load_scenario("quickstart", SMALL))
    assert res.summary["weights_exceed_host_ram"] is False
    assert res.summary["weights_beyond_host_ram_bytes"] == 0
    code, err, _ = kvsim_cli("simulate", "quickstart", "--set", SMALL[0], "--set", SMALL[1],
                             "-o", tmp_path / "r", "--no-report")
    assert (code, err) == (0, "") and "host RAM" not in kvsim_cli.stderr
