"""A sweep point with bad input: named, found before anything runs when possible, and
never costing the other points their finished work (audit A10)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from sweep_files import write_sweep


def _sweep(kvsim_cli, sweep: Path, out: Path, runner: str, *extra: str
           ) -> tuple[int, str, str]:
    return kvsim_cli("sweep", str(sweep), "-o", str(out), "--no-report", "--no-progress",
                  "--runner", f"{runner}", *extra)


def _stored(out: Path) -> int:
    d = out / "results"
    return sum(1 for p in d.iterdir()) if d.is_dir() else 0


def test_bad_workload_params_are_refused_before_anything_runs(tmp_path, base_yaml, kvsim_cli):
    sweep = write_sweep(tmp_path, points=[{"engine.parallel": 1},
                                          {"workload.params.nosuch": 1}])
    out = tmp_path / "out"
    rc, err, _ = _sweep(kvsim_cli, sweep, out, "plan_fake_runners:fake_run", "-j", "1")
    assert rc == 2
    assert err.startswith("error: sweep point 1 workload.preset 'family-4'.nosuch: 1 — not a "
                          "key here; allowed: name, description, assistants, kinds, members")
    assert _stored(out) == 0


def test_too_many_days_are_refused_before_anything_runs(tmp_path, base_yaml, kvsim_cli):
    sweep = write_sweep(tmp_path, points=[{"engine.parallel": 1}, {"workload.days": 1e9}])
    out = tmp_path / "out"
    rc, err, _ = _sweep(kvsim_cli, sweep, out, "plan_fake_runners:fake_run", "-j", "1")
    assert rc == 2
    assert err.startswith("error: sweep point 1 workload.days: 1000000000.0 — at most "), err
    assert _stored(out) == 0


def test_a_bad_trace_is_refused_before_anything_runs(tmp_path, base_yaml, kvsim_cli):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kvsim_trace": 1}\n{"session_id": "s", "turns": "nope"}\n')
    sweep = write_sweep(tmp_path, points=[{"engine.parallel": 1},
                                          {"workload": {"trace": str(bad)}}])
    rc, err, _ = _sweep(kvsim_cli, sweep, tmp_path / "out", "plan_fake_runners:fake_run")
    assert rc == 2 and err.startswith("error: sweep point 1 "), err


@pytest.mark.parametrize("jobs", ["1", "4"])
def test_a_point_failing_while_running_keeps_every_other_point(tmp_path, base_yaml, kvsim_cli,
                                                               jobs):
    sweep = write_sweep(tmp_path, factors={"engine.parallel": [1, 2, 3, 4]})
    out = tmp_path / "out"
    rc, err, _ = _sweep(kvsim_cli, sweep, out, "failing_runners:fails_at_parallel_3", "-j", jobs)
    assert rc == 2
    assert err.startswith("error: sweep point 2 workload.trace: 't.jsonl' — found bad while "
                          "running (3 other point(s) finished and are stored")
    assert _stored(out) == 3
    records = [json.loads(p.read_text()) for p in (out / "results").glob("*/record.json")]
    assert sorted(r["params"]["engine.parallel"] for r in records) == [1, 2, 4]
    # the table is written before the error: every point, the failed one marked
    table = pd.read_csv(out / "sweep.csv")
    assert list(table["status"]) == ["ok", "ok", "failed", "ok"]
    assert table.loc[2, "reason"] == ("workload.trace: 't.jsonl' — found bad while running")
    # the rerun (input fixed) runs only the missing point
    rc, _, stdout = _sweep(kvsim_cli, sweep, out, "plan_fake_runners:fake_run", "-j", "1")
    assert rc == 0 and _stored(out) == 4
    assert "ran 1, skipped 3" in stdout
