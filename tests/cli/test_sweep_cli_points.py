"""`kvsim sweep` on the audit's inputs: an engine that cannot start is a row, a bad
Dask address fails at once, a calibration file it cannot read is one line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvsim", "sweep", *args, "--no-report",
                           "--no-progress"], capture_output=True, text=True, timeout=300,
                          check=False, env={"PATH": "/usr/bin:/bin",
                                            "PYTHONPATH": str(ROOT / "tests" / "plan")})


def _sweep(tmp_path: Path, **spec) -> Path:
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump({"name": "t", **spec}))
    return p


def test_a_point_that_cannot_start_is_a_row_and_the_table_is_written(tmp_path):
    sweep = _sweep(tmp_path, base="family-4-vllm",
                   factors={"engine.context_tokens": [8192, 120000, 16384]})
    out = tmp_path / "out"
    res = _run(str(sweep), "-o", str(out), "--jobs", "1", "--runner",
               "plan_fake_runners:fake_run")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert lines[0] == "sweep 't': 3 points, 2 distinct scenarios, 0 already stored, 2 to run"
    assert lines[1].startswith("note: point 1 (engine.context_tokens=120000): cannot start "
                               "on rtx-4090 with llama-3.1-8b: The model's max seq len "
                               "(120000) is larger than")
    assert "ran 2, skipped 0 (already stored), 1 cannot start; wrote " in res.stdout
    table = pd.read_csv(out / "sweep.csv")
    assert list(table["status"]) == ["ok", "cannot_start", "ok"]
    again = _run(str(sweep), "-o", str(out), "--jobs", "1", "--runner",
                 "plan_fake_runners:fake_run")
    assert again.returncode == 0 and "ran 0, skipped 2 (already stored), 1 cannot start" \
        in again.stdout


@pytest.mark.parametrize("address,needle", [
    ("foo://x", ("--dask: 'foo://x' — not a Dask scheduler address: scheme 'foo://' is not "
                "one Dask connects over; one of tcp://")),
    ("", "--dask: '' — empty; give the scheduler's address"),
])
def test_a_bad_dask_address_fails_at_once_in_one_line(tmp_path, address, needle):
    sweep = _sweep(tmp_path, base="quickstart", factors={"engine.parallel": [1]})
    t0 = time.monotonic()
    res = _run(str(sweep), "-o", str(tmp_path / "o"), "--dask", address)
    assert time.monotonic() - t0 < 30  # was ~12 s of connection attempts, then a traceback
    assert res.returncode == 2
    assert res.stderr.splitlines() == [res.stderr.strip()]
    assert res.stderr.startswith(f"error: {needle}")
    assert not (tmp_path / "o").exists()


def test_an_unreadable_calibration_file_is_one_line(tmp_path):
    sweep = _sweep(tmp_path, base="quickstart", factors={
        "model": ["llama-3.2-1b"], "latency": [{"kind": "calibrated", "path": "nosuch.json"}]})
    res = _run(str(sweep), "-o", str(tmp_path / "o"))
    assert res.returncode == 2
    assert res.stderr.strip() == (f"error: sweep point 0 latency.path: "
                                  f"'{tmp_path / 'nosuch.json'}' — cannot read (No such file "
                                  "or directory)")
