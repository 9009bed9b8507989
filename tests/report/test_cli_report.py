"""``kvsim report`` on real simulated results: exit codes, atomic output, exact peak."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvsim.cli import main
from kvsim.report import data_run as dr
from kvsim.report import figures_run as fr


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvsim.api import simulate
    from kvsim.scenario import load_scenario

    sc = load_scenario("quickstart", ["workload.max_sessions=6"])
    return simulate(sc).save(tmp_path_factory.mktemp("res") / "quickstart")


def _run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code)


def test_report_from_simulated_results(results_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.html"
    assert _run(["report", str(results_dir), "-o", str(out), "--slo", "ttft_p95=2s"]) == 0
    html = out.read_text()
    assert "quickstart" in html and "roofline(rtx-4060-ti-16gb" in html
    assert "data-figures=" in html and "report:" in capsys.readouterr().out


def test_plotted_peak_equals_simulated_peak(results_dir: Path) -> None:
    from kvsim.metrics.results import Results

    res = Results.load(results_dir)
    data = dr.memory_stack(res.memory, res.summary, res.scenario)
    # the static rows come from the engine's memory budget, labelled, and add up exactly
    assert {"driver reserve", "weights"} <= {label for label, _ in data["device_layers"]}
    fig = fr.memory_figure(data, "m")
    total = next(t for t in fig.data if t.name == "device total")
    assert max(total.y) * 2**30 == res.summary["peak_device_bytes"]
    stacked = sum(t.y for t in fig.data if t.stackgroup == "device")
    assert stacked.max() * 2**30 == pytest.approx(res.summary["peak_device_bytes"], abs=1)


def test_missing_table_is_one_line_exit_2(results_dir: Path, tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(results_dir, broken)
    (broken / "itl.parquet").unlink()
    out = tmp_path / "report.html"
    assert _run(["report", str(results_dir), str(broken), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "missing itl.parquet" in err
    assert not out.exists() and list(tmp_path.glob(".report.html*")) == []


def test_other_kvsim_release_is_refused(results_dir: Path, tmp_path: Path, capsys) -> None:
    old = tmp_path / "old"
    shutil.copytree(results_dir, old)
    meta = json.loads((old / "meta.json").read_text())
    (old / "meta.json").write_text(json.dumps({**meta, "kvsim_version": "0.0.9"}))
    out = tmp_path / "report.html"
    assert _run(["report", str(old), "-o", str(out)]) == 2
    assert "written by kvsim 0.0.9" in capsys.readouterr().err and not out.exists()


def test_bad_slo_flag(results_dir: Path, tmp_path: Path, capsys) -> None:
    assert _run(["report", str(results_dir), "-o", str(tmp_path / "r.html"),
                 "--slo", "e2e=3s"]) == 2
    assert "--slo" in capsys.readouterr().err
