"""The assembled page: figure count, omitted-figure notes, escaping, determinism, atomic write."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from report_helpers import EVIL, GIB, make_run, plan_table

from kvsim.errors import InputError
from kvsim.report import build_report, write_report
from kvsim.report.card import card_data


def _figures(html: str) -> int:
    return len(re.findall(r"class=\"plotly-graph-div\"", html))


def test_single_run_has_one_figure_per_available_dataset() -> None:
    html = build_report([make_run()])
    # TTFT, ITL and E2E CDFs, prefix hits + memory, sessions, concurrency, PCIe, accuracy
    assert _figures(html) == 9
    assert "data-figures='9'" in html
    assert html.count("<script type='text/javascript'>") == 1  # plotly.js inline once


def test_absent_data_gives_a_note_not_an_empty_figure() -> None:
    run = make_run()
    run.events = run.events[run.events["kind"] == "preempt"]  # no offload / restore
    run.references = None
    html = build_report([run])
    assert _figures(html) == 7
    assert "no PCIe traffic" in html and "no reference events" in html


def test_user_strings_are_escaped_everywhere() -> None:
    run = make_run(EVIL)
    html = build_report([run], extra={"title": EVIL, "plan": plan_table(),
                                      "recommendation": {"context_tokens": 16384,
                                                         "parallel": 2, "flags": EVIL}})
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # card, title, recommendation
    assert "</script>alert" not in html


def test_report_is_deterministic() -> None:
    assert build_report([make_run()]) == build_report([make_run()])


def test_planning_outputs_and_policy_comparison() -> None:
    compare = pd.DataFrame({"gpu": ["a", "b"], "feasible": [True, False],
                            "best_parallel": [2, 0], "best_context_tokens": [8192, 0],
                            "price_usd": [500.0, 900.0]})
    sweep = pd.DataFrame({"point": [0, 1], "engine.parallel": [1, 2], "scenario_hash": ["x", "y"],
                          "ttft_p95_s": [0.3, 0.5]})
    html = build_report([make_run("f16"), make_run("q8_0", 0.5)],
                        extra={"plan": plan_table(), "compare": compare, "sweep": sweep})
    # plan + compare + sweep + policy comparison + 5 overlays (TTFT, ITL, E2E, prefix
    # hits, per-session recall) + 2 × 5 per run
    assert _figures(html) == 19


def test_write_report_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "out" / "report.html"
    bad_plan = plan_table().drop(columns=["binding"])
    with pytest.raises(InputError, match="binding"):
        write_report(target, [make_run()], {"plan": bad_plan})
    assert not target.exists() and list(target.parent.glob("*")) == []
    path = write_report(target, [make_run()], kind="simulate")
    assert path == target and target.stat().st_size > 1_000_000
    assert list(target.parent.iterdir()) == [target]
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_write_report_accepts_planning_keywords(tmp_path: Path) -> None:
    path = write_report(tmp_path / "r.html", kind="plan", plan=plan_table())
    html = path.read_text()
    assert "<title>kvsim plan — kvsim</title>" in html and _figures(html) == 1


def test_card_data_names_version_hash_and_latency_model() -> None:
    card = card_data(make_run())
    facts = dict(card["facts"])
    assert facts["scenario hash"] == "0123456789abcdef"
    assert facts["kvsim version (results)"] == "0.1.0"
    assert facts["engine"] == "vllm"
    assert card["latency"]["model"] == "roofline(rtx-4060-ti-16gb, llama-3.1-8b, q4_k_m)"
    assert card["latency"]["config.kind"] == "roofline"
    head = dict(card["headline"])
    total = 400 * 2**20 + 4_920_000_000 + 300 * 2**20 + 8 * GIB
    assert head["peak device use"] == f"{total / (16 * GIB):.1%}" == "82.9%"
    # latencies in ms below 10 s, as benchmark_serving and GuideLLM print them
    assert head["TTFT p95"] == "600 ms" and head["peak KV allocated"] == "3.00 GiB"


def test_card_shows_calibrated_fit_error() -> None:
    run = make_run()
    run.summary["latency_model"] = "calibrated(calibration/rtx-4090.json, f16, MAPE 6.1%)"
    run.summary["latency_fit_mape"] = 0.061
    lat = card_data(run)["latency"]
    assert "MAPE 6.1%" in lat["model"] and lat["latency_fit_mape"] == 0.061


def test_card_says_the_speed_band_in_words() -> None:
    run = make_run()
    run.summary.update(latency_fit_decode_speed_p10=0.88, latency_fit_decode_speed_p90=1.1,
                       latency_fit_prompt_speed_p10=0.584, latency_fit_prompt_speed_p90=1.335)
    lat = card_data(run)["latency"]
    assert lat["speed on cards the fit left out (8 in 10)"] == (
        "decode 0.88–1.10×, prompt processing 0.58–1.33× kvsim's")


def test_card_shows_the_recall_proxy_summary() -> None:
    """docs/policies.md: the report gives recall_mean, recall_worst and
    recall_share_below_0_5, as summary.json does."""
    run = make_run()
    run.summary.update(recall_mean=0.8125, recall_worst=0.25, recall_share_below_0_5=0.125)
    head = dict(card_data(run)["headline"])
    assert head["recall proxy (mean)"] == "0.812"
    assert head["recall proxy (worst reference)"] == "0.250"
    assert head["references recalled below 0.5"] == "12.5%"
