"""`kvsim plan` / `kvsim compare --gpus` as a user runs them (closed-form runner)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCEN = {"name": "t", "gpu": "rtx-4090", "model": "llama-3.1-8b",
        "engine": {"preset": "llama.cpp", "allocator": "slots"},
        "workload": {"preset": "family-4", "days": 1, "max_sessions": 2}}
FAKE = ["--runner", "plan_fake_runners:plan_run", "-j", "1", "-n", "2", "--no-progress"]


def kvsim(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump(SCEN), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "plan")}
    argv = [a.replace("SCEN", str(scen)) for a in args]
    return subprocess.run([sys.executable, "-m", "kvsim", *argv], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def test_plan_writes_tables_and_recommends_flags(tmp_path):
    out = tmp_path / "out"
    r = kvsim(tmp_path, "plan", "SCEN", "--slo", "ttft_p95=0.9s", "--max-oom-risk", "0",
              "--contexts", "8192,16384,98304", "--parallel", "1,4", "-o", str(out),
              "--no-report", *FAKE)
    assert r.returncode == 0, r.stderr
    # by hand (plan_fake_runners.plan_run + the 24 GiB layouts): 98304 × 1 fits at 0.70,
    # 16384 × 4 at 0.54, 98304 × 4 spills → the front is {98304×1, 16384×4}; 98304 > 65536
    assert "llama-server -m llama-3.1-8b-q4_k_m.gguf -c 98304 --parallel 1 -ctk f16 " \
           "-ctv f16 -fa on" in r.stdout
    table = pd.read_parquet(out / "plan.parquet")
    assert len(table) == 6
    rec = json.loads((out / "recommendation.json").read_text())["recommendation"]
    assert (rec["context_tokens"], rec["parallel"]) == (98304, 1)
    # the answer sits on the edges of the grid the user gave (98304 its largest context;
    # 16384 × 4, the most sessions, its largest parallel): not widened, but said — 7 is
    # the most 16384-token sessions that lay out under 85 % of the 4090 (16384 × 7 at
    # 0.79, 8 would pass the line), 131072 the model's maximum
    assert ("note: the answer is capped by the grid you gave: memory allows parallel 7 (add "
            "it to --parallel); context 131,072 is untried (add it to --contexts)"
            ) in " ".join(r.stdout.split())


def test_compare_gpus_table(tmp_path):
    out = tmp_path / "out"
    r = kvsim(tmp_path, "compare", "--gpus", "rtx-4060-ti-16gb,rtx-5090", "SCEN", "--slo",
              "ttft_p95=0.9s", "--max-oom-risk", "0", "--contexts", "8192,24576",
              "--parallel", "1,4", "-o", str(out), "--no-report", *FAKE)
    assert r.returncode == 0, r.stderr
    t = pd.read_csv(out / "compare.csv").set_index("gpu")
    # launch prices from reference/gpus.csv: 499 and 1999 USD
    assert t.loc["rtx-4060-ti-16gb", "price_usd"] == 499
    assert t.loc["rtx-5090", "price_usd"] == 1999
    # 16 GiB: 24576 × 4 = 98304 cells spill; 8192 × 4 fits → 4 sessions; 32 GiB: 24576 × 4
    assert t.loc["rtx-4060-ti-16gb", "max_parallel"] == 4
    assert t.loc["rtx-5090", "best_context_tokens"] == 24576
    assert t.loc["rtx-5090", "usd_per_session"] == pytest.approx(1999 / 4)


@pytest.mark.parametrize("args,needle", [
    (["--slo", "ttft_p95=2s", "--slo", "ttft_p95=1s"], "contradicts"),
    (["--slo", "ttft_p95=soon"], "--slo"),
    (["--contexts", ","], "empty grid"),
    (["--max-device-fraction", "1.5"], "--max-device-fraction"),
    (["--kv", "q9_9"], "cache_type_k"),
    (["--policy", "teleport"], "teleport"),
])
def test_plan_bad_input_one_line_exit_2(tmp_path, args, needle):
    r = kvsim(tmp_path, "plan", "SCEN", *args, *FAKE)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_compare_unknown_gpu(tmp_path):
    r = kvsim(tmp_path, "compare", "--gpus", "rtx-4090,rtx-9999", "SCEN", *FAKE)
    assert r.returncode == 2 and "rtx-9999" in r.stderr


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_plan_and_compare_write_a_self_contained_report_by_default(tmp_path, command):
    out = tmp_path / "out"
    gpus = ["--gpus", "rtx-4060-ti-16gb,rtx-5090"] if command == "compare" else []
    r = kvsim(tmp_path, command, *gpus, "SCEN", "--slo", "ttft_p95=0.9s", "--max-oom-risk",
              "0", "--contexts", "8192,24576", "--parallel", "1,4", "-o", str(out), *FAKE)
    assert r.returncode == 0, r.stderr
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html")
    # offline: no script or stylesheet fetched from elsewhere
    assert "<script src=\"http" not in html and "<link rel=\"stylesheet\" href=\"http" not in html
    assert f"{out / 'report.html'}" in r.stdout
