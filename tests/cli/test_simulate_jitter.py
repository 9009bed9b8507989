"""`kvsim simulate --jitter-replications N`: the run as without it, then the spread of the
outcomes that hinge on timing, flagged with the reason, and jitter.json."""

import json
import re

import pandas as pd
from timing_households import sessions_scenario


def test_more_sessions_than_slots_is_flagged_and_the_run_is_unchanged(kvsim_cli,
                                                                       tmp_path) -> None:
    sc = sessions_scenario(tmp_path, 6)
    code, err, out = kvsim_cli("simulate", sc, "--no-report", "-o", tmp_path / "plain")
    assert (code, err) == (0, "")
    # a plain run of this shape says its reuse and TTFT tail are one draw of a race
    assert kvsim_cli.stderr.splitlines()[-1] == (  # type: ignore[attr-defined]
        "note: more sessions than slots (6 open at once on 4): which slot a returning "
        "session finds free hinges on milliseconds, so this run's prompt-cache reuse and "
        "TTFT p95 are one draw; --jitter-replications N shows their spread")
    code, err, out = kvsim_cli("simulate", sc, "--no-report", "-o", tmp_path / "jit",
                               "--jitter-replications", "6")
    assert (code, err) == (0, "")
    stderr = kvsim_cli.stderr  # type: ignore[attr-defined]
    assert "timing noise: this run and 6 jittered replications" in out
    assert re.search(r"prompt-cache reuse .* moves with timing", out)
    warning = next(ln for ln in stderr.splitlines() if "prompt-cache reuse" in ln)
    assert "one draw" not in stderr  # the spread itself is shown instead
    assert re.fullmatch(r"warning: prompt-cache reuse \d+\.\d–\d+\.\d % depending on timing: "
                        r"more sessions than slots \(6 open at once on 4\)", warning)
    # the run itself is saved as without the flag
    plain, jit = tmp_path / "plain", tmp_path / "jit"
    assert (plain / "summary.json").read_text() == (jit / "summary.json").read_text()
    assert (plain / "scenario.json").read_text() == (jit / "scenario.json").read_text()
    assert pd.read_parquet(plain / "requests.parquet").equals(
        pd.read_parquet(jit / "requests.parquet"))
    doc = json.loads((jit / "jitter.json").read_text())
    reuse = doc["metrics"]["prefix_hit_rate"]
    summary = json.loads((jit / "summary.json").read_text())
    assert len(doc["seeds"]) == 6 and len(reuse["values"]) == 7 and reuse["moved"]
    assert reuse["values"][0] == summary["prefix_hit_rate"]
    assert f"{100 * reuse['low']:.1f}–{100 * reuse['high']:.1f} %" in warning
    # the median over this run and the 6: the figure a server's typical run is held to
    ttft = doc["metrics"]["ttft_p95_s"]
    assert ttft["median"] == sorted(ttft["values"])[3] and doc["jitter_prompt_cv"] == 0.1
    row = next(ln for ln in out.splitlines() if ln.startswith("│ TTFT p95"))
    assert f"{ttft['median'] * 1000:.0f} ms" in row


def test_as_many_sessions_as_slots_keeps_its_reuse(kvsim_cli, tmp_path) -> None:
    code, err, out = kvsim_cli("simulate", sessions_scenario(tmp_path, 4), "--no-report",
                               "-o", tmp_path / "o", "--jitter-replications", "4")
    assert (code, err) == (0, "")
    assert re.search(r"prompt-cache reuse .* steady", out)
    assert "prompt-cache reuse" not in kvsim_cli.stderr  # type: ignore[attr-defined]
    code, _, _ = kvsim_cli("simulate", sessions_scenario(tmp_path, 4), "--no-report",
                           "-o", tmp_path / "plain")
    assert code == 0 and "one draw" not in kvsim_cli.stderr  # type: ignore[attr-defined]


def test_an_exact_run_of_a_racing_shape_says_how_to_see_the_spread(kvsim_cli,
                                                                  tmp_path) -> None:
    code, _, _ = kvsim_cli("simulate", sessions_scenario(tmp_path, 6, jitter_cv=0.0),
                           "--no-report", "-o", tmp_path / "o")
    assert code == 0
    assert kvsim_cli.stderr.splitlines()[-1].endswith(  # type: ignore[attr-defined]
        "are one draw; --jitter-replications N with latency.jitter_cv or arrival_jitter_s "
        "set (kvsim calibrate engine measures a server's) shows their spread")


def test_bad_jitter_replications_is_one_line_before_any_run(kvsim_cli, tmp_path) -> None:
    exact = sessions_scenario(tmp_path, 6, jitter_cv=0.0)
    code, err, _ = kvsim_cli("simulate", exact, "-o", tmp_path / "o",
                             "--jitter-replications", "3")
    assert code == 2 and err.startswith("error: --jitter-replications: 3 — a scenario with "
                                        "timing noise: set latency.jitter_cv")
    assert not (tmp_path / "o").exists()
    code, err, _ = kvsim_cli("simulate", exact, "-o", tmp_path / "o", "--set",
                             "latency.jitter_cv=0.05", "--jitter-replications", "0")
    assert (code, err) == (2, "error: --jitter-replications: 0 — an integer from 1 to 1000")


def test_worker_processes_give_the_same_replications(kvsim_cli, tmp_path) -> None:
    sc = sessions_scenario(tmp_path, 6)
    docs = []
    for jobs in ("1", "2"):
        code, err, _ = kvsim_cli("simulate", sc, "--no-report", "-o", tmp_path / jobs,
                                 "--jitter-replications", "3", "-j", jobs)
        assert (code, err) == (0, "")
        docs.append((tmp_path / jobs / "jitter.json").read_text())
    assert docs[0] == docs[1]
    code, err, _ = kvsim_cli("simulate", sc, "-o", tmp_path / "x", "-j", "0")
    assert (code, err) == (2, "error: --jobs: 0 — between 1 and 1024 worker processes")


def test_late_arrivals_alone_are_timing_noise_to_replicate(kvsim_cli, tmp_path) -> None:
    """Exact step times, requests 20 ms late (sd 20 ms): replications move the race, the
    table's title names the noise, and jitter.json keeps its knobs."""
    sc = sessions_scenario(tmp_path, 6, jitter_cv=0.0)
    code, err, out = kvsim_cli("simulate", sc, "--no-report", "-o", tmp_path / "o",
                               "--set", "latency.arrival_delay_s=0.02",
                               "--set", "latency.arrival_jitter_s=0.02",
                               "--jitter-replications", "8")
    assert (code, err) == (0, "")
    assert ("timing noise: this run and 8 jittered replications (latency.jitter_cv 0, "
            "requests 20 ms late (sd 20 ms))") in " ".join(out.split())
    doc = json.loads((tmp_path / "o" / "jitter.json").read_text())
    assert (doc["jitter_cv"], doc["arrival_delay_s"], doc["arrival_jitter_s"]) == (
        0.0, 0.02, 0.02)
    assert doc["metrics"]["prefix_hit_rate"]["moved"]
