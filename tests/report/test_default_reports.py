"""``simulate``, ``plan``, ``compare`` and ``sweep`` write ``report.html`` by default;
``--no-report`` skips it.  Run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCEN = {"name": "t", "gpu": "rtx-4090", "model": "llama-3.1-8b",
        "engine": {"preset": "llama.cpp", "allocator": "slots", "context_tokens": 8192,
                   "parallel": 1},
        "workload": {"preset": "family-2", "days": 0.25, "max_sessions": 2}}
# closed-form runner from tests/plan (no simulation needed to exercise the report switch)
FAKE = ["--runner", "plan_fake_runners:plan_run", "-j", "1", "-n", "2", "--no-progress"]
GRID = ["--slo", "ttft_p95=0.9s", "--contexts", "8192", "--parallel", "1"]


def _commands(tmp: Path) -> dict[str, list[str]]:
    scen = tmp / "s.yaml"
    scen.write_text(yaml.safe_dump(SCEN), encoding="utf-8")
    sweep = tmp / "sw.yaml"
    sweep.write_text(yaml.safe_dump({"name": "t", "base": "s.yaml",
                                     "factors": {"engine.parallel": [1]}}), encoding="utf-8")
    return {
        "simulate": ["simulate", str(scen)],
        "plan": ["plan", str(scen), *GRID, *FAKE],
        "compare": ["compare", "--gpus", "rtx-4090,rtx-5090", str(scen), *GRID, *FAKE],
        "sweep": ["sweep", str(sweep), "-j", "1", "--no-progress"],
    }


def _kvsim(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "plan")}
    return subprocess.run([sys.executable, "-m", "kvsim", *argv], capture_output=True,
                          text=True, env=env, timeout=180, check=False)


@pytest.mark.parametrize("command", ["simulate", "plan", "compare", "sweep"])
def test_report_by_default_and_skipped_with_no_report(tmp_path: Path, command: str) -> None:
    argv = _commands(tmp_path)[command]
    with_report, without = tmp_path / "with", tmp_path / "without"
    r = _kvsim([*argv, "-o", str(with_report)])
    assert r.returncode == 0, r.stderr
    html = (with_report / "report.html").read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html") and "plotly" in html.lower()
    r = _kvsim([*argv, "-o", str(without), "--no-report"])
    assert r.returncode == 0, r.stderr
    assert without.is_dir() and not (without / "report.html").exists()
