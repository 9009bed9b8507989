"""`kvsim sweep` as a user runs it: SIGKILL half-way then resume, and bad input."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = {"name": "base", "gpu": "rtx-4090", "model": "llama-3.1-8b",
        "engine": {"preset": "llama.cpp", "allocator": "slots", "context_tokens": 8192,
                   "parallel": 2},
        "workload": {"preset": "family-4", "days": 0.25}}


def _setup(tmp_path: Path, **spec) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE), encoding="utf-8")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "t", "base": "base.yaml", **spec}), encoding="utf-8")
    return sweep


def _cmd(sweep: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kvsim", "sweep", str(sweep), "-o", str(out), "--no-report",
            "--no-progress", *extra]


def _env(log: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "plan"),
            "KVSIM_TEST_RUN_LOG": str(log), "KVSIM_TEST_SLEEP_S": "0.4"}


def _records(out: Path) -> dict[str, float]:
    d = out / "results"
    return {p.name: (p / "record.json").stat().st_mtime_ns for p in d.iterdir()} \
        if d.is_dir() else {}


def test_sigkill_half_way_then_resume(tmp_path):
    sweep = _setup(tmp_path, factors={"engine.parallel": [1, 2, 3, 4],
                                      "engine.context_tokens": [4096, 8192]})
    out = tmp_path / "out"
    slow = ["--jobs", "1", "--runner", "plan_fake_runners:slow_run"]
    proc = subprocess.Popen(_cmd(sweep, out, *slow), env=_env(tmp_path / "run1.log"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(_records(out)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _records(out)
    assert 3 <= len(before) < 8, "kill must land half-way"
    res = subprocess.run(_cmd(sweep, out, *slow), env=_env(tmp_path / "run2.log"),
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    after = _records(out)
    assert len(after) == 8  # exactly one result per scenario
    assert {k: after[k] for k in before} == before  # finished ones untouched
    rerun = (tmp_path / "run2.log").read_text().splitlines()
    assert len(rerun) == 8 - len(before)  # only the missing ones were computed
    assert not any((out / ".tmp").iterdir())
    import pandas as pd
    table = pd.read_parquet(out / "sweep.parquet")
    assert len(table) == 8 and table["scenario_hash"].is_unique
    assert f"ran {8 - len(before)}, skipped {len(before)}" in res.stdout


@pytest.mark.parametrize("spec,extra,needle", [
    ({"factors": {"engine.paralel": [1, 2]}}, [], "sweep key: 'engine.paralel'"),
    ({"factors": {"engine.parallel": []}}, [], "empty grid"),
    ({"factors": {"engine.parallel": [1]}}, ["--dask", "tcp://127.0.0.1:9", "--dask-timeout", "1"], "--dask"),
])
def test_bad_input_exit_2_one_line_store_untouched(tmp_path, spec, extra, needle):
    sweep = _setup(tmp_path, **spec)
    out = tmp_path / "out"
    res = subprocess.run(_cmd(sweep, out, *extra), capture_output=True, text=True, timeout=60, check=False,
                         env=_env(tmp_path / "log"))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    assert not out.exists()


def test_sweep_writes_a_report_by_default(tmp_path):
    sweep = _setup(tmp_path, factors={"engine.parallel": [1, 2]})
    out = tmp_path / "out"
    cmd = [a for a in _cmd(sweep, out, "--jobs", "1", "--runner", "plan_fake_runners:fake_run")
           if a != "--no-report"]
    res = subprocess.run(cmd, env=_env(tmp_path / "log"), capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html") and "<script src=\"http" not in html


def test_sweep_report_can_share_plotlyjs_beside_it(tmp_path):
    sweep = _setup(tmp_path, factors={"engine.parallel": [1, 2]})
    out = tmp_path / "out"
    cmd = [a for a in _cmd(sweep, out, "--jobs", "1", "--runner", "plan_fake_runners:fake_run",
                           "--plotlyjs", "dir") if a != "--no-report"]
    res = subprocess.run(cmd, env=_env(tmp_path / "log"), capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    html = (out / "report.html").read_text(encoding="utf-8")
    # the page loads plotly.js from the file written once beside it (offline, small page)
    assert "<script type='text/javascript' src='plotly.min.js'></script>" in html
    assert (out / "plotly.min.js").stat().st_size > 2**20 > (out / "report.html").stat().st_size


def test_sweep_rows_say_too_long_apart_from_out_of_memory(tmp_path):
    # 4 slots of 1024 cells (-c 4096): family-4's conversations outgrow their slot;
    # llama-server refuses those turns as too long, which is no OOM (kvsim.metrics.failures)
    base = {**BASE, "engine": {**BASE["engine"], "context_tokens": 4096, "parallel": 4},
            "workload": {"preset": "family-4", "days": 1, "max_sessions": 4}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base), encoding="utf-8")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "t", "base": "base.yaml",
                                     "factors": {"engine.allocator": ["slots"]}}),
                     encoding="utf-8")
    res = subprocess.run([*_cmd(sweep, tmp_path / "out"), "--jobs", "1"],
                         env={**os.environ, "COLUMNS": "200"}, capture_output=True,
                         text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    header = next(line for line in res.stdout.splitlines() if "too long" in line)
    row = next(line for line in res.stdout.splitlines() if "slots" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    names = [c.strip() for c in header.strip("┃ ").split("┃")]
    got = dict(zip(names, cells, strict=True))
    assert int(got["failed"]) > 0 and got["too long"] == got["failed"]
    assert got["out of KV"] == "0" and got["oom"] == "no"
