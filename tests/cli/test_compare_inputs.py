"""``kvsim compare MEASURED PREDICTED``: notes runs of different requests (two seeds of
one scenario still compare) and a MEASURED that is no replay, and refuses options of
the --gpus mode (audit C21, C33)."""

from __future__ import annotations


def test_runs_of_different_requests_are_noted(tmp_path, kvsim_cli, make_results):
    m = make_results(tmp_path / "m", ["a", "b", "c"], source="measured")
    p = make_results(tmp_path / "p", ["a", "x"])
    rc, err, _ = kvsim_cli("compare", m, p)
    assert rc == 0 and err == ""
    assert ("note: MEASURED and PREDICTED hold different requests (2 only in MEASURED, 1 "
            "only in PREDICTED") in kvsim_cli.stderr
    assert "the *_match rows cover the 1 requests in both" in kvsim_cli.stderr


def test_a_simulated_measured_is_noted(tmp_path, kvsim_cli, make_results):
    m = make_results(tmp_path / "m", ["a", "b"])
    p = make_results(tmp_path / "p", ["a", "b"])
    rc, err, _ = kvsim_cli("compare", m, p)
    assert rc == 0 and err == ""
    assert "note: MEASURED is a simulated result, not a kvsim replay" in kvsim_cli.stderr


def test_a_replay_pair_has_no_note(tmp_path, kvsim_cli, make_results):
    m = make_results(tmp_path / "m", ["a", "b"], source="measured")
    p = make_results(tmp_path / "p", ["a", "b"])
    assert kvsim_cli("compare", m, p)[0] == 0
    assert "note:" not in kvsim_cli.stderr


def test_options_of_the_gpus_mode_are_refused(tmp_path, kvsim_cli, make_results):
    m = make_results(tmp_path / "m", ["a"], source="measured")
    p = make_results(tmp_path / "p", ["a"])
    rc, err, _ = kvsim_cli("compare", m, p, "--contexts", "abc", "--slo", "ttft_p95=2s")
    assert rc == 2
    assert err.startswith("error: --") and "applies to 'compare --gpus A,B SCENARIO' only; " \
        "'compare MEASURED PREDICTED' takes only -o, --no-report and --plotlyjs" in err
    rc, err, _ = kvsim_cli("compare", m, p, "--replications", "8")
    assert rc == 2 and err.startswith("error: --replications: 8 — applies to")
