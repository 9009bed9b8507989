"""Recall per session in the report, multi-run labels and the comparison's recall keys,
on hand-built runs and on real quickstart results folders (the user audit's repro)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from report_helpers import EVIL, make_run

from kvsim.report import build_report
from kvsim.report import data_plan as dp
from kvsim.report import data_recall as dc
from kvsim.report.card import card_data, significant
from kvsim.report.figures_plan import policy_figure
from kvsim.report.labels import run_labels, short_keys, show_value

SW = "policies=[{kind: sliding_window, window_tokens: %d}]"


def test_per_session_recall_and_its_distribution() -> None:
    refs = make_run().references  # alice: 1.0 (INTACT), 0.1 (LOST); EVIL: 0.97 (DEGRADED)
    per = dc.accuracy_per_session(refs)
    assert per.values.tolist() == [["alice", 2, pytest.approx(0.55), 0.1, 0.5, 1],
                                   [EVIL, 1, 0.97, 0.97, 0.0, 0]]
    assert dc.recall_overall(refs) == {"mean": pytest.approx(2.07 / 3), "worst": 0.1,
                                       "below_half": 1 / 3, "session_mean_worst": 0.55}
    cdf = dc.session_recall_cdf(refs)
    assert cdf["x"].tolist() == [0.55, 0.97] and cdf["p"].tolist() == [0.5, 1.0]
    assert (cdf["sessions"], cdf["worst"], cdf["below_half"]) == (2, 0.55, 0.0)
    assert dc.session_recall_cdf(refs.iloc[:0]) is None and dc.recall_overall(None) is None


def test_comparison_reads_the_summary_recall_keys() -> None:
    runs = [make_run("a"), make_run("b")]
    for run, (mean, worst, below) in zip(runs, ((0.9, 0.1, 0.125), (0.75, 0.05, 0.25))):
        run.summary.update(recall_mean=mean, recall_worst=worst,
                           recall_share_below_0_5=below)
    table = dp.runs_table(runs)
    assert table[["label", "accuracy_mean", "accuracy_worst", "accuracy_below_half"]
                 ].values.tolist() == [["a", 0.9, 0.1, 0.125], ["b", 0.75, 0.05, 0.25]]
    fig = policy_figure(dp.policy_comparison(table))
    assert [a.text for a in fig.layout.annotations][-1] == "refs below 0.5"
    assert [(t.name, list(t.y)) for t in fig.data[-2:]] == [("a", [0.125]), ("b", [0.25])]


def _run(config: dict, path: str = "", source: str = "simulated") -> SimpleNamespace:
    return SimpleNamespace(scenario={"scenario": config, "hash": "h"}, path=path,
                           meta={"source": source})


BASE = {"name": "quickstart", "description": "one day", "seed": 0, "policies": [],
        "gpu": {"name": "rtx-4060-ti-16gb", "memory_bytes": 16 * 2**30, "notes": "x"},
        "engine": {"preset": "llama.cpp", "parallel": 4, "cache_ram_bytes": 8 * 2**30}}


def _with(**changes: object) -> dict:
    doc = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *head, last = dotted.split("__")
        node = doc
        for k in head:
            node = node[k]
        node[last] = value
    return doc


def test_labels_name_what_differs_between_same_named_runs() -> None:
    sw = lambda w: [{"kind": "sliding_window", "window_tokens": w, "sink_tokens": 4}]
    runs = [_run(_with()), _run(_with(policies=sw(2048))), _run(_with(policies=sw(4096)))]
    assert run_labels(runs) == [
        "quickstart · policies=none",
        "quickstart · policies=sliding_window, window_tokens=2048",
        "quickstart · policies=sliding_window, window_tokens=4096"]
    gpu = {"name": "rtx-4090", "memory_bytes": 24 * 2**30, "notes": "y"}
    runs = [_run(_with(engine__parallel=2, engine__cache_ram_bytes=512 * 2**20)),
            _run(_with(gpu=gpu))]
    assert run_labels(runs) == [  # the GPU by name, not by its memory_bytes and notes
        "quickstart · gpu=rtx-4060-ti-16gb, cache_ram_bytes=512 MiB, parallel=2",
        "quickstart · gpu=rtx-4090, cache_ram_bytes=8 GiB, parallel=4"]
    runs.append(_run(_with(seed=3, engine__parallel=2, engine__cache_ram_bytes=2**30)))
    assert run_labels(runs)[2] == "quickstart · gpu=rtx-4060-ti-16gb, cache_ram_bytes=1 GiB, " \
        "parallel=2, …"  # seed=3 would pass 60 characters


def test_keys_an_older_folder_lacks_are_not_differences() -> None:
    # a folder written before engine.op_offload and workload.after_failure existed,
    # beside a new one that differs from it only in after_failure
    old = _with(workload={"preset": "family-4"})
    new = _with(engine__op_offload=True,
                workload={"preset": "family-4", "after_failure": "continue"})
    other = _with(engine__op_offload=True,
                  workload={"preset": "family-4", "after_failure": "end_session"})
    assert run_labels([_run(old), _run(new), _run(other)]) == [
        "quickstart", "quickstart · after_failure=continue",
        "quickstart · after_failure=end_session"]


def test_labels_fall_back_to_names_folders_and_counters() -> None:
    other = _with(name="family-4-vllm", engine__parallel=8)
    assert run_labels([_run(BASE), _run(other)]) == ["quickstart", "family-4-vllm"]
    assert run_labels([_run(BASE, "/r/a/base"), _run(BASE, "/r/b/tuned")]) == ["base", "tuned"]
    assert run_labels([_run(BASE), _run(BASE)]) == ["quickstart", "quickstart (2)"]
    assert run_labels([_run(BASE), _run(BASE, source="measured")]) == [
        "quickstart · source=simulated", "quickstart · source=measured"]
    long = [_run(_with(description="d", engine__preset="a" * 40)), _run(BASE)]
    assert run_labels(long)[0] == "quickstart · preset=" + "a" * 17 + "…"


def test_short_keys_and_values() -> None:
    assert short_keys(["engine.parallel", "policies.0.window_tokens", "a.kind", "b.kind",
                       "policies.0", "policies.1"]) == {
        "engine.parallel": "parallel", "policies.0.window_tokens": "window_tokens",
        "a.kind": "a.kind", "b.kind": "b.kind", "policies.0": "policies.0",
        "policies.1": "policies.1"}
    assert [show_value("x_bytes", 3 * 2**29), show_value("x_bytes", 2**20), show_value("f", 0.1),
            show_value("t", True), show_value("n", None), show_value("l", [1, 2])] == [
        "1.5 GiB", "1 MiB", "0.1", "true", "none", "[1, 2]"]


def test_card_gives_small_rates_three_significant_digits() -> None:
    run = make_run()
    run.summary["tokens_per_s"] = 0.3663
    run.summary.pop("output_tokens_per_busy_s", None)
    # an older folder without the busy throughput: the whole run's average, named so
    assert dict(card_data(run)["headline"])["output tokens/s (whole run)"] == "0.366"
    run.summary["output_tokens_per_busy_s"] = 32.96
    head = dict(card_data(run)["headline"])
    assert head["output tokens/s while busy"] == "33" and "output tokens/s (whole run)" \
        not in head
    assert [significant(v) for v in (12.34, 999.6, 12345.6)] == ["12.3", "1,000", "12,346"]


def _titles(html: str, text: str, *, prefix: bool = False) -> int:
    """How many figure titles in the page read `text` (or start with it).

    Plotly writes non-ASCII as \\u escapes with its stdlib JSON engine and as
    raw UTF-8 with orjson (picked when installed); count both spellings.
    """
    spellings = {json.dumps(text), json.dumps(text, ensure_ascii=False)}
    return sum(html.count(f'"text":{s[:-1] if prefix else s}') for s in spellings)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from kvsim.api import simulate
    from kvsim.scenario import load_scenario

    root = tmp_path_factory.mktemp("recall")
    sets = ([], [SW % 2048], [SW % 4096])
    return [simulate(load_scenario("quickstart", ["workload.max_sessions=8", *s])).save(
        root / f"run{i}") for i, s in enumerate(sets)]


def test_report_of_a_folder_shows_recall_per_session(folders, tmp_path, kvsim_cli) -> None:
    from kvsim.metrics.results import Results

    res = Results.load(folders[1])
    assert len(res.references) == res.summary["reference_events"] == 12
    per = dc.accuracy_per_session(res.references)
    assert per["mean"].min() == res.summary["recall_session_mean_worst"]
    code, err, _ = kvsim_cli("report", folders[1], "-o", tmp_path / "one.html")
    html = (tmp_path / "one.html").read_text()
    assert (code, err) == (0, "") and _titles(html, "Recall proxy per session — quickstart") == 1
    assert "no reference events" not in html


def test_multi_run_report_labels_and_recall_comparison(folders, tmp_path, kvsim_cli) -> None:
    from kvsim.metrics.results import Results

    runs = [Results.load(f) for f in folders]
    table = dp.runs_table(runs)
    assert table["label"].tolist() == [
        "quickstart · policies=none",
        "quickstart · policies=sliding_window, window_tokens=2048",
        "quickstart · policies=sliding_window, window_tokens=4096"]
    assert table["accuracy_below_half"].tolist() == [
        r.summary["recall_share_below_0_5"] for r in runs]
    code, _, _ = kvsim_cli("report", *folders, "-o", tmp_path / "all.html")
    html = build_report(runs)
    assert code == 0 and (tmp_path / "all.html").read_text() == html
    assert _titles(html, "Recall proxy per session") == 1  # the overlay of 3 runs
    assert _titles(html, "Recall proxy per session — quickstart · policies=", prefix=True) == 3
