"""A per-session context above the model's maximum is refused up front on every engine
(audit: Ollama clamped it and llama-server capped each slot, so plan recommended
262144 with the command of 131072, or -c cells no session could use)."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvsim.config.catalog import load_gpu
from kvsim.errors import InputError
from kvsim.plan.compare import compare_gpus
from kvsim.plan.search import PlanGrid, PlanResult, search
from kvsim.plan.slo import build_constraints
from kvsim.scenario import load_scenario, resolve_scenario

ROOT = Path(__file__).resolve().parents[2]
C = build_constraints(["ttft_p95=60s"], max_device_fraction=0.85, max_oom_risk=1.0)


def never(_s):
    raise AssertionError("nothing may run before the grid is checked")


@pytest.mark.parametrize("preset", ["llama.cpp", "ollama", "vllm", "sglang"])
def test_search_refuses_a_context_above_the_maximum(preset):
    s = resolve_scenario({"gpu": "rtx-5090", "model": "llama-3.1-8b",
                          "engine": {"preset": preset},
                          "workload": {"preset": "family-4", "days": 0.05}})
    with pytest.raises(InputError) as exc:
        search(s, C, PlanGrid((131072, 262144), (1,)), replications=1, runner=never)
    # llama-3.1-8b: max_context_tokens 131,072 (docs/reference/models.csv)
    assert (exc.value.field, exc.value.value) == ("--contexts", 262144)
    assert "llama-3.1-8b's maximum, 131072 tokens" in exc.value.allowed


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "plan")}
    return subprocess.run([sys.executable, "-m", "kvsim", *args], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


@pytest.mark.parametrize("cmd", [["plan", "family-4-ollama"],
                                 ["compare", "--gpus", "rtx-4090,rtx-5090", "quickstart"]])
def test_cli_exits_2_with_one_line(cmd):
    r = run(*cmd, "--set", "gpu=rtx-5090", "--contexts", "131072,262144,300000",
            "--parallel", "1", "-n", "1", "-j", "1", "--no-progress",
            "--runner", "plan_fake_runners:plan_run")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [(
        "error: --contexts: [262144, 300000] — per-session contexts at most llama-3.1-8b's "
        "maximum, 131072 tokens (vLLM/SGLang refuse a larger max_model_len, Ollama clamps "
        "num_ctx to it, llama-server caps each slot at it)")]


def test_compare_shows_what_the_engine_may_use():
    # apple-m4-max: 128 GiB of unified memory, of which the GPU may wire 70 % by default
    # (docs/reference/hardware-and-models.md §4): 0.70 x 128 = 89.6 GiB, fit's "device memory"
    s = load_scenario("quickstart", [])
    empty = PlanResult(pd.DataFrame({"feasible": [], "parallel": []}), pd.DataFrame(), None)
    res = compare_gpus(s, ["apple-m4-max", "rtx-5090"], C, PlanGrid((8192,), (1,)),
                       search_fn=lambda *a, **k: empty)
    rows = res.table.set_index("gpu")
    assert rows.loc["apple-m4-max", "memory_gib"] == 128.0
    assert rows.loc["apple-m4-max", "usable_gib"] == pytest.approx(89.6, abs=1e-9)
    assert load_gpu("apple-m4-max").usable_memory_bytes == 96_207_267_430  # int(0.7 x 128 GiB)
    # a discrete card: what CUDA reports, 32 GiB less 2 % (kvsim.config.device_memory)
    assert rows.loc["rtx-5090", "memory_gib"] == 32
    assert rows.loc["rtx-5090", "usable_gib"] == pytest.approx(32 * 0.98, abs=1e-8)


def test_compare_table_heads_the_usable_figure():
    r = run("compare", "--gpus", "apple-m4-max", "quickstart", "--contexts", "8192",
            "--parallel", "1", "-n", "1", "-j", "1", "--no-progress",
            "--runner", "plan_fake_runners:plan_run")
    assert r.returncode == 0, r.stderr
    assert "device GiB" in r.stdout and "│ 89.6 " in r.stdout and "│ 128 " not in r.stdout
