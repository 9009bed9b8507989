"""Sweep points as the audit found them: keys set twice, duplicate points, engines that
cannot start, unreadable files, paths relative to the sweep file, summary-only entries
completed later (audit 3, defects 2, 5, 6, 8, 9)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from plan_fake_runners import fake_run, fake_summary
from sweep_files import write_sweep

from kvsim.errors import InputError
from kvsim.plan.replicate import RunOutput
from kvsim.plan.store import ResultStore
from kvsim.plan.sweep import SweepSpec, expand, grid, load_sweep, run_sweep


def _points(tmp_path, **spec):
    s, d = load_sweep(write_sweep(tmp_path, **spec))
    return expand(s, d)


@pytest.mark.parametrize("factors,message", [
    ({"engine.parallel": [1, 3], "engine.parallel,engine.context_tokens": [[2, 8192]]},
     ("sweep.factors: 'engine.parallel' — set twice (by factors 'engine.parallel' and "
     "'engine.parallel,engine.context_tokens'); give each key in one factor only (a "
     "linked factor for values that go together)")),
    ({"engine.parallel, engine.parallel": [[1, 2]]},
     ("sweep.factors: 'engine.parallel' — set twice (twice in factor 'engine.parallel, "
     "engine.parallel'); give each key in one factor only (a linked factor for values "
     "that go together)")),
    ({"workload": [{"preset": "family-2", "days": 1}], "workload.days": [2]},
     "sweep.factors: 'workload.days' — set twice: directly and inside 'workload'"),
])
def test_a_key_set_twice_is_an_error_naming_it(factors, message):
    with pytest.raises(InputError) as exc:
        grid(SweepSpec(base={}, factors=factors))
    assert str(exc.value) == message


def test_a_listed_point_setting_a_key_twice_is_an_error():
    spec = SweepSpec(base={}, points=[{"seed": 1},
                                      {"engine": {"parallel": 2}, "engine.parallel": 3}])
    with pytest.raises(InputError) as exc:
        grid(spec)
    assert str(exc.value) == ("sweep.points.1: 'engine.parallel' — set twice: directly and "
                              "inside 'engine'")


def test_a_mapping_and_a_key_inside_it_apply_mapping_first(tmp_path, base_yaml):
    # workload.days is not in the workload mapping: the mapping is set, then the key,
    # whatever their order in the sweep file
    pts = _points(tmp_path, points=[{"workload.days": 0.5, "workload": "family-2"}])
    assert (pts[0].scenario.workload.preset, pts[0].scenario.workload.days) == ("family-2", 0.5)


def test_every_point_keeps_its_row_duplicates_included(tmp_path, base_yaml):
    # the audit's listed sweep: points 0 and 3 are the same scenario (parallel 2 is the
    # base value), 1 differs by parallel, 2 by seed
    pts = _points(tmp_path, points=[{"seed": 0}, {"engine.parallel": 4}, {"seed": 1},
                                    {"seed": 0, "engine.parallel": 2}])
    with ResultStore(tmp_path / "out") as store:
        out = run_sweep(pts, store, runner=fake_run)
        assert len(store.finished()) == 3
    assert (out.ran, out.skipped) == (3, 0)
    t = out.table
    assert list(t["point"]) == [0, 1, 2, 3]
    assert list(t["seed"]) == [0, 0, 1, 0]
    assert list(t["engine.parallel"]) == [2, 4, 2, 2]
    assert t.loc[0, "scenario_hash"] == t.loc[3, "scenario_hash"] != t.loc[2, "scenario_hash"]
    assert list(t["seed_echo"]) == [0, 0, 1, 0]


def _vllm_sweep(tmp_path: Path, contexts: list[int]) -> Path:
    p = tmp_path / "mixed.yaml"
    p.write_text(yaml.safe_dump({"name": "mixed", "base": "family-4-vllm",
                                 "factors": {"engine.context_tokens": contexts}}))
    return p


def test_an_engine_that_cannot_start_is_a_row_not_an_error(tmp_path):
    # vLLM refuses max_model_len 120000 on a 24 GB card with bf16 llama-3.1-8b
    spec, d = load_sweep(_vllm_sweep(tmp_path, [8192, 120000, 16384]))
    pts = expand(spec, d)
    assert [bool(p.refused) for p in pts] == [False, True, False]
    with ResultStore(tmp_path / "out") as store:
        out = run_sweep(pts, store, runner=fake_run)
        assert len(store.finished()) == 2  # nothing is run or stored for the refused one
    assert (out.ran, out.skipped, out.refused, out.error) == (2, 0, 1, None)
    row = out.table.set_index("point").loc[1]
    assert (row["status"], row["oom"], row["engine.context_tokens"]) == (
        "cannot_start", True, 120000)
    assert row["reason"].startswith(
        "cannot start on rtx-4090 with llama-3.1-8b: The model's max seq len (120000) is "
        "larger than the maximum number of tokens that can be stored in KV cache (")
    assert row["oom_reason"] == row["reason"]
    # the closed set's reason for an engine that does not start (kvsim.metrics.failures)
    assert row["failure_code"] == "oom_at_load"
    assert list(out.table["status"]) == ["ok", "cannot_start", "ok"]


def test_a_model_that_does_not_load_is_a_row(tmp_path):
    # bf16 llama-3.1-8b weights (16 GB) on a card cut to 8 GiB under vLLM
    spec = SweepSpec(base="family-4-vllm", factors={"gpu.memory_bytes": ["24 GiB", "8 GiB"]})
    pts = expand(spec, tmp_path)
    assert pts[0].refused == ""
    assert pts[1].refused.startswith("cannot load on rtx-4090: needs ")
    # vLLM's share is of the total the driver reports: 2 % below 8 GiB on GDDR6X
    assert ", the card has 7.84 GiB (" in pts[1].refused


def test_a_bad_value_stays_an_up_front_error_naming_the_swept_key(tmp_path, base_yaml):
    with pytest.raises(InputError) as exc:
        _points(tmp_path, factors={"engine.context_tokens": [8192, -1]})
    assert exc.value.field == "sweep point 1 engine.context_tokens"


@pytest.mark.parametrize("path,reason", [("nosuch.json", "No such file or directory"),
                                         ("cal", "Is a directory")])
def test_an_unreadable_calibration_file_is_one_line(tmp_path, base_yaml, path, reason):
    (tmp_path / "cal").mkdir()
    with pytest.raises(InputError) as exc:
        _points(tmp_path, factors={"latency": [{"kind": "calibrated", "path": path}]})
    assert str(exc.value) == (f"sweep point 0 latency.path: '{tmp_path / path}' — cannot "
                              f"read ({reason})")


def test_a_calibration_artifact_for_another_model_is_refused_up_front(tmp_path, base_yaml):
    cal = Path(__file__).resolve().parents[2] / "calibration" / "cpu__llama-3.2-1b.json"
    with pytest.raises(InputError) as exc:
        _points(tmp_path, factors={"latency": [{"kind": "calibrated", "path": str(cal)}]})
    assert exc.value.field == "sweep point 0 latency.path"
    assert exc.value.allowed.startswith("measured llama-3.2-1b's layers, but the scenario's "
                                        "model is llama-3.1-8b")


def test_paths_in_a_sweep_file_are_read_from_its_folder(tmp_path, base_yaml, monkeypatch):
    from kvsim.workload.io import write_trace
    from kvsim.workload.schema import Session, Turn

    sub = tmp_path / "tr"
    sub.mkdir()
    write_trace(sub / "t.jsonl", [Session(session_id="a", turns=(
        Turn(start_s=0.0, input_tokens=10, output_tokens=2),))])
    sweep = sub / "sw.yaml"
    sweep.write_text(yaml.safe_dump({"base": "quickstart", "points": [
        {"workload": "t.jsonl"}, {"workload.trace": "t.jsonl", "workload.preset": None},
        {"workload": {"trace": "t.jsonl"}}]}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    pts = expand(*load_sweep(Path("..") / "tr" / "sw.yaml"))
    assert {p.scenario.workload.trace for p in pts} == {str(sub.absolute() / "t.jsonl")}
    assert next(p.params for p in pts) == {"workload": "t.jsonl"}  # as the file gives it
    (sub / "t.jsonl").unlink()
    with pytest.raises(InputError) as exc:
        expand(*load_sweep(sweep))
    assert str(exc.value) == f"sweep point 0 trace: '{sub / 't.jsonl'}' — file not found"


class _Res:
    """A stand-in for Results: save() writes one file."""

    def save(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "summary.json").write_text("{}")
        return Path(path)


def _full(scenario) -> RunOutput:
    return RunOutput(fake_summary(scenario), "", _Res())


def test_summary_only_entries_get_their_results_in_a_full_run(tmp_path, base_yaml):
    pts = _points(tmp_path, factors={"engine.parallel": [1, 2]})
    with ResultStore(tmp_path / "out") as store:
        first = run_sweep(pts, store, runner=fake_run, summary_only=True)
        assert first.ran == 2 and store.results_dir(pts[0].key) is None
        again = run_sweep(pts, store, runner=fake_run, summary_only=True)
        assert (again.ran, again.skipped) == (0, 2)  # summary-only asked: all stored
        full = run_sweep(pts, store, runner=_full)
        assert (full.ran, full.skipped) == (2, 0)
        for p in pts:
            assert (store.results_dir(p.key) / "summary.json").read_text() == "{}"
            assert store.get(p.key)["summary_only"] is False
        done = run_sweep(pts, store, runner=_full)
        assert (done.ran, done.skipped) == (0, 2)
        assert not any(store.tmp.iterdir())
    assert json.loads((tmp_path / "out" / "results" / pts[1].key / "record.json")
                      .read_text())["summary"] == fake_summary(pts[1].scenario)
