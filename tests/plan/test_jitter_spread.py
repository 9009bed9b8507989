"""Jittered replications (kvsim.plan.jitter): more sessions than slots makes prompt-cache
reuse move with timing; as many sessions as slots does not; plan's intervals take the
scenario's jitter."""

import math

import pytest
from timing_households import sessions_scenario

from kvsim.api import simulate
from kvsim.errors import InputError
from kvsim.plan.jitter import jitter_replications, jitter_seeds, timing_spread
from kvsim.plan.races import peak_open_sessions, timing_reason
from kvsim.plan.replicate import RunOutput, replicate
from kvsim.plan.search import PlanGrid, search
from kvsim.plan.slo import build_constraints
from kvsim.scenario import load_scenario


def _spread(tmp_path, sessions: int, n: int = 6):
    sc = load_scenario(sessions_scenario(tmp_path, sessions))
    res = simulate(sc)
    seeds, runs = jitter_replications(sc, n)
    main = RunOutput(dict(res.summary))
    return sc, res, seeds, runs, {s.key: s for s in timing_spread(
        main, runs, timing_reason(sc, res.requests))}


def test_six_sessions_on_four_slots_reuse_moves_with_timing(tmp_path) -> None:
    _, res, seeds, runs, spread = _spread(tmp_path, 6)
    reuse = spread["prefix_hit_rate"]
    assert reuse.moved and reuse.high - reuse.low >= 0.02
    assert reuse.values[0] == res.summary["prefix_hit_rate"]  # the run itself is one
    assert reuse.reason == "more sessions than slots (6 open at once on 4)"
    assert reuse.warning().startswith("prompt-cache reuse ")
    assert "% depending on timing: more sessions than slots" in reuse.warning()
    # every replication ran the same requests, only the timing differs
    assert {r.summary["requests"] for r in runs} == {res.summary["requests"]}
    assert len(set(seeds)) == len(seeds)
    assert not spread["failed_requests"].moved and not spread["oom"].moved
    assert (spread["oom"].text(spread["oom"].values[0]), spread["oom"].range_text()) == \
        ("no", "0 of 7")


def test_four_sessions_on_four_slots_reuse_the_same_whatever_the_timing(tmp_path) -> None:
    sc, res, _, runs, spread = _spread(tmp_path, 4)
    reuse = spread["prefix_hit_rate"]
    assert not reuse.moved and reuse.low == reuse.high == res.summary["prefix_hit_rate"]
    assert timing_reason(sc, res.requests) == ""
    assert peak_open_sessions(res.requests) == 4
    # the timing itself did vary
    assert len({r.summary["ttft_p95_s"] for r in runs}) > 1


def test_replications_are_reproducible_and_need_jitter(tmp_path) -> None:
    sc = load_scenario(sessions_scenario(tmp_path, 6))
    a = [r.summary for r in jitter_replications(sc, 3)[1]]
    assert a == [r.summary for r in jitter_replications(sc, 3)[1]]
    exact = load_scenario(sessions_scenario(tmp_path, 6, jitter_cv=0.0))
    with pytest.raises(InputError) as exc:
        jitter_seeds(exact, 3)
    assert exc.value.one_line().startswith("--jitter-replications: 3 — a scenario with "
                                           "timing noise: set latency.jitter_cv")
    for bad in (0, 1001):
        with pytest.raises(InputError, match="an integer from 1 to 1000"):
            jitter_seeds(sc, bad)


def test_plan_replications_take_the_scenarios_jitter(tmp_path) -> None:
    """A trace's sessions are the same under every seed: without jitter a plan's
    replications are one run repeated — pooled, their p95 and its bootstrap interval over
    the trace's sessions are one run's (copies add nothing); with jitter they spread."""
    jittered = load_scenario(sessions_scenario(tmp_path, 6))
    exact = load_scenario(sessions_scenario(tmp_path, 6, jitter_cv=0.0))
    reps = replicate(jittered, 4)
    assert all(r.summary["latency_model"].endswith("+ jitter CV 0.1") for r in reps.runs)
    assert len({r.summary["prefix_hit_rate"] for r in reps.runs}
               | {r.summary["ttft_p95_s"] for r in reps.runs}) > 2
    c = build_constraints(["ttft_p95=5s"], max_device_fraction=0.95, max_oom_risk=0.5)
    rows = {}
    for name, sc in (("exact", exact), ("jittered", jittered)):
        t = search(sc, c, PlanGrid((8192,), (4,)), replications=4).table
        rows[name] = t.iloc[0]
        assert rows[name]["evaluated"] == "simulated" and rows[name]["replications"] == 4
    one = search(exact, c, PlanGrid((8192,), (4,)), replications=1).table.iloc[0]
    keys = ["ttft_p95_s", "ttft_p95_s_low", "ttft_p95_s_high"]
    assert list(rows["exact"][keys]) == pytest.approx(list(one[keys]))
    assert rows["exact"]["latency_requests"] == 4 * one["latency_requests"]
    width = rows["jittered"]["ttft_p95_s_high"] - rows["jittered"]["ttft_p95_s_low"]
    assert width > 0 and not math.isnan(width)


def test_plan_says_its_intervals_include_the_timing_noise(kvsim_cli, tmp_path) -> None:
    args = ["plan", sessions_scenario(tmp_path, 6), "--slo", "ttft_p95=5s", "--contexts",
            "8192", "--parallel", "4", "-n", "2", "-j", "1", "--no-progress"]
    code, err, out = kvsim_cli(*args)
    assert (code, err) == (0, "")
    assert "note: timing noise: every run's timing carries latency.jitter_cv 0.1" in out
    code, err, out = kvsim_cli(*args, "--set", "latency.jitter_cv=0")
    assert (code, err) == (0, "") and "timing noise" not in out
