"""The answer a user reads (issue 25): the issue's own commands, run as a user runs them,
and the verdict, failure reasons, percentiles, units and reports they print."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from kvsim.config.units import format_latency, humanize_duration

ROOT = Path(__file__).resolve().parents[2]
SCEN = {"name": "t", "gpu": "rtx-4090", "model": "llama-3.1-8b",
        "engine": {"preset": "llama.cpp", "allocator": "slots"},
        "workload": {"preset": "family-4", "days": 1, "max_sessions": 2}}
FAKE = ["--runner", "plan_fake_runners:plan_run", "-j", "1", "-n", "1", "--no-progress"]


def kvsim(*args: object, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "plan"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "kvsim", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("q") / "q"
    return kvsim("simulate", "quickstart", "-o", out), out


def test_simulate_says_the_verdict_first_with_reasons_and_a_checked_change(quickstart,
                                                                          tmp_path) -> None:
    from kvsim.api import scenario_budget
    from kvsim.scenario import load_scenario

    r, out = quickstart
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # a prompt longer than -c is refused, counted from the requests table; the day's
    # TTFT p95 binds: just over kvsim's default 2 s
    req = pd.read_parquet(out / "requests.parquet")
    said = req.loc[req.failed, "failure_reason"].value_counts().to_dict()
    assert said == {"exceed_context_size_error": 1}
    longest = int((req.prompt_tokens + req.output_tokens).max())
    s = json.loads((out / "summary.json").read_text())
    assert lines[0] == "verdict: misses — binding: ttft_p95 (TTFT p95 over its SLO)"
    assert 2.0 < s["ttft_p95_s"] < 2.5 and s["itl_p95_s"] <= 0.15
    assert lines[1] == (f"  latency: TTFT p95 {format_latency(s['ttft_p95_s'])} > 2 s; ITL p95 "
                        f"{format_latency(s['itl_p95_s'])} ≤ 150 ms (SLOs: kvsim's defaults)")
    assert lines[3] == (
        f"  failed: 1 of {len(req)} requests: 1 prompt_exceeds_context (prompt longer than "
        f"the context: the longest needed {longest:,} tokens, a session holds 16,384) — "
        "\"exceed_context_size_error\"")
    # no request waited for a slot, so no engine setting is offered, and the line says why
    assert lines[4].startswith("  no change found: requests hardly waited for a slot "
                               "(queue p95 ")
    assert "a faster card (kvsim compare --gpus …)" in lines[4]
    # seed 2's day runs the unified -c 16384 pool out (2 requests): the change doubles -c,
    # laid out by the engine's own arithmetic (as kvsim fit would) and re-simulated with
    # the same seed (the scenario key it sets is per session: 8192 x 4 slots = -c 32768)
    r2 = kvsim("simulate", "quickstart", "--set", "seed=2", "-o", tmp_path / "s2",
               "--no-report")
    assert r2.returncode == 0, r2.stderr
    lines2 = r2.stdout.splitlines()
    assert lines2[0] == "verdict: misses — binding: kv_exhausted (KV memory exhausted under load)"
    req2 = pd.read_parquet(tmp_path / "s2" / "requests.parquet")
    assert list(req2.loc[req2.failed, "failure_code"].value_counts().items()) == [
        ("kv_exhausted", 2)]
    change = next(x for x in lines2 if x.startswith("  change that helps most"))
    frac = scenario_budget(load_scenario("quickstart", ["engine.ctx_size=32768"]))
    assert change.startswith(
        "  change that helps most — kv_exhausted: a larger KV pool: `-c 32768` "
        f"(engine.context_tokens=8192) lays out at {frac.device_fraction:.0%} of device "
        "memory; re-simulated (same seed): no request fails, TTFT p95 ")
    s2 = json.loads((tmp_path / "s2" / "summary.json").read_text())
    assert (s2["failed_kv_exhausted_requests"], s2["failed_prompt_exceeds_context_requests"],
            s2["failed_memory_requests"], s2["failed_too_long_requests"]) == (2, 0, 2, 0)


def test_simulate_prints_units_people_read(quickstart) -> None:
    r, out = quickstart
    s = json.loads((out / "summary.json").read_text())
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in r.stdout.splitlines() if line.startswith("│")}
    # p50 / p90 / p95 / p99 / mean, in ms below 10 s
    assert rows["TTFT"] == [format_latency(s[f"ttft_{k}_s"])
                            for k in ("p50", "p90", "p95", "p99", "mean")]
    # below 10 s in ms, above in s
    assert s["ttft_p95_s"] < 10 and rows["TTFT"][2].endswith(" ms")
    assert s["e2e_p95_s"] >= 10 and rows["E2E"][2].endswith(" s") and "ms" not in rows["E2E"][2]
    # a day of 136 requests keeps the server busy minutes, not the 23 h 26 min simulated
    assert rows["simulated time"] == [humanize_duration(s["sim_time_s"])] == ["23 h 26 min"]
    assert s["busy_s"] < 3600
    assert rows["busy (≥ 1 request in the server)"] == [humanize_duration(s["busy_s"])]
    assert rows["output tokens/s while busy"] == [f"{s['output_tokens'] / s['busy_s']:,.1f}"]
    assert rows["most requests at once"] == ["2"]


def test_plan_judges_the_pooled_p95_and_explains_identical_rows(tmp_path) -> None:
    from kvsim.api import simulate
    from kvsim.metrics.summary import ended
    from kvsim.plan.flags import configure
    from kvsim.plan.replicate import replication_seeds
    from kvsim.scenario import load_scenario

    out = tmp_path / "p"
    r = kvsim("plan", "quickstart", "--contexts", "8Ki,16Ki,32Ki", "--parallel", "2,4",
              "-n", "2", "--no-progress", "-o", out)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("verdict: context 16,384 × parallel 4 (kv f16) meets every "
                               "target — TTFT p95 ")
    t = pd.read_csv(out / "plan.csv").set_index(["context_tokens", "parallel"])
    # a prompt longer than 8192 per session is refused, which is no OOM: risk 0
    assert t.loc[(8192, 2), "failed_prompt_exceeds_context_requests"] > 0
    assert t.loc[(8192, 2), "oom_risk"] == 0 and bool(t.loc[(8192, 2), "feasible"])
    # pooled: the p95 over every ended request of the two seeded runs
    sc = configure(load_scenario("quickstart"), 16384, 4, None, None, 0.85)
    ttft = np.concatenate([ended(res.requests, res.itl)[0]["ttft_s"].to_numpy(dtype=float)
                           for res in (simulate(sc.model_copy(update={"seed": seed}))
                                       for seed in replication_seeds(0, 2))])
    ttft = ttft[np.isfinite(ttft)]
    assert t.loc[(16384, 4), "ttft_p95_s"] == np.percentile(ttft, 95, method="inverted_cdf")
    assert t.loc[(16384, 4), "latency_requests"] == len(ttft)
    assert t.loc[(16384, 4), "ttft_p95_s_low"] <= t.loc[(16384, 4), "ttft_p95_s_high"]
    flat = " ".join(r.stdout.split())
    # parallel 2 and 4 give the same rows: never more than 2 requests at once
    assert ("note: context × parallel 16,384 × 2, 32,768 × 2, 8,192 × 4, 16,384 × 4 give "
            "identical latency and failures: the workload never had more than 2 requests at "
            "once, and each of these serves at least 2") in flat
    # the grid the user gave is not what caps the answer: memory is
    assert ("note: the answer is capped by memory or the model, not the grid: parallel 4 is "
            "the most the layout holds under the 85% line at context 16,384") in flat
    rec = json.loads((out / "recommendation.json").read_text())
    assert rec["verdict"][0] == lines[0]


def test_plan_names_the_nearest_miss_when_nothing_is_feasible(tmp_path) -> None:
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump(SCEN), encoding="utf-8")
    # plan_run: TTFT p95 0.2 s × parallel, every session needs 8192 tokens — a 0.15 s SLO
    # is missed everywhere; parallel 1 misses it least (0.2 s, 33 % over)
    r = kvsim("plan", scen, "--slo", "ttft_p95=150ms", "--contexts", "8192,16384",
              "--parallel", "1,2", *FAKE)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("verdict: nothing on the grid meets every target; nearest "
                               "miss: context 8,192 × parallel 1 (kv f16) — binding ttft_p95 "
                               "(TTFT p95 over its SLO) (33.3% over): TTFT p95 200 ms > 150 ms")
    assert lines[1] == ("  what would help: every point on the grid misses it; the lowest "
                        "ttft p95 is 200 ms at context 8,192 × parallel 1 (kv f16): fewer "
                        "sessions at once, smaller weights or a faster card (kvsim compare "
                        "--gpus …)")


def test_compare_uses_default_slos_and_widens_a_grid_that_capped_it(tmp_path) -> None:
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump(SCEN), encoding="utf-8")
    out = tmp_path / "c"
    r = kvsim("compare", "--gpus", "rtx-4060-ti-16gb,rtx-5090", scen, *FAKE, "-o", out)
    assert r.returncode == 0, r.stderr
    t = pd.read_csv(out / "compare.csv").set_index("gpu")
    # no --slo: kvsim's defaults, ttft_p95 2 s and itl_p95 150 ms. plan_run's TTFT p95 is
    # 0.2 s × parallel, so 10 sessions meet it; the default grid stops at 8, the 32 GB card
    # holds more, so the grid is widened to 10 (what memory allows at 16384 per session
    # of the 32 GiB less 2 % that CUDA reports): 10 sessions, 1999 / 10 USD each
    assert "targets (kvsim's defaults): ttft_p95 <= 2 s; itl_p95 <= 0.15 s" in r.stdout
    assert t.loc["rtx-5090", "max_parallel"] == 10
    assert t.loc["rtx-5090", "usd_per_session"] == pytest.approx(1999 / 10)
    assert "the grid was widened: parallel 10 added" in t.loc["rtx-5090", "grid_notes"]
    # the 16 GB card is capped by memory, and said so
    assert t.loc["rtx-4060-ti-16gb", "max_parallel"] == 8
    assert "parallel 8 is the most the layout holds" in t.loc["rtx-4060-ti-16gb", "grid_notes"]
    assert r.stdout.startswith("verdict rtx-4060-ti-16gb: context ")
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.index("id='verdict'") < html.index("id='cards'")
    assert "Per card: the best configuration that meets every target" in html
    assert "llama-server -m llama-3.1-8b-q4_k_m.gguf -c 163840 --parallel 10" in html


def test_report_of_several_runs_compares_them_first(tmp_path) -> None:
    runs = []
    for name, c in (("a", 16384), ("b", 32768)):
        runs.append(tmp_path / name)
        r = kvsim("simulate", "quickstart", "--set", "workload.max_sessions=4", "--set",
                  f"engine.ctx_size={c}", "--no-report", "--no-advice", "-o", runs[-1])
        assert r.returncode == 0, r.stderr
    out = tmp_path / "rep"
    for page in ("one.html", "two.html"):
        r = kvsim("report", *runs, "--plotlyjs", "dir", "-o", out / page)
        assert r.returncode == 0, r.stderr
    # plotly.js written once beside both pages, each a small page that loads it
    assert sorted(p.name for p in out.iterdir()) == ["one.html", "plotly.min.js", "two.html"]
    html = (out / "one.html").read_text(encoding="utf-8")
    assert "<script type='text/javascript' src='plotly.min.js'></script>" in html
    assert (out / "one.html").stat().st_size < 2**20
    # the first screen: a verdict per run, then the runs side by side with the deltas
    assert html.index("id='verdict'") < html.index("id='comparison'") < html.index(
        "class='card'")
    a, b = (json.loads((p / "summary.json").read_text()) for p in runs)
    delta = (b["peak_device_bytes"] - a["peak_device_bytes"]) / 2**30
    assert f"+{delta:.2f} GiB" in html


def test_a_p95_on_fewer_than_100_requests_is_warned_about(tmp_path) -> None:
    out = tmp_path / "s"
    r = kvsim("simulate", "quickstart", "--set", "workload.max_sessions=4", "--no-report",
              "--no-advice", "-o", out)
    assert r.returncode == 0, r.stderr
    n = json.loads((out / "summary.json").read_text())["latency_requests"]
    assert 0 < n < 100
    assert (f"  the latency percentiles rest on {n} requests (fewer than 100: a p95 over them "
            "is one of its largest few)") in r.stdout
    r = kvsim("plan", "quickstart", "--set", "workload.max_sessions=4", "--contexts", "16Ki",
              "--parallel", "4", "-n", "1", "-j", "1", "--no-progress", "--no-report", "-o",
              tmp_path / "p")
    assert r.returncode == 0, r.stderr
    # one replication (its own seed, split from the scenario's): its requests only
    n = int(pd.read_csv(tmp_path / "p" / "plan.csv")["latency_requests"].iloc[0])
    assert 0 < n < 100 and f"pooled over {n} requests of 1 run;" in r.stdout
    assert (f"  the pooled p95 rests on {n} requests (fewer than 100: it is one of the "
            "largest few); raise --replications or workload.days") in r.stdout
