"""Planning data functions on hand-built plan / compare / sweep / policy tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from report_helpers import make_run, plan_table

from kvsim.errors import InputError
from kvsim.report import data_plan as dp


def test_plan_grid_by_hand() -> None:
    (grid,) = dp.plan_grids(plan_table())
    assert grid["label"] == "kv_dtype=q8_0"
    assert list(grid["contexts"]) == [8192, 16384, 32768]
    assert list(grid["parallels"]) == [1, 2, 4]
    # fraction = 0.55 + (0.05·log2(ctx/8192) + 0.02)·parallel
    assert grid["fraction"] == pytest.approx(np.array(
        [[0.57, 0.59, 0.63], [0.62, 0.69, 0.83], [0.67, 0.79, 1.03]]))
    assert grid["feasible"].tolist() == [[1, 1, 0], [1, 1, 0], [1, 1, 0]]
    assert grid["binding"].tolist() == [["", "", "ttft_p95"], ["", "", "ttft_p95"],
                                        ["", "", "device_fraction"]]


def test_plan_grid_marks_untried_points_and_groups_by_policy() -> None:
    plan = plan_table()
    plan = plan[~((plan["context_tokens"] == 32768) & (plan["parallel"] == 4))]
    plan = pd.concat([plan, plan.assign(policy="sliding-window")], ignore_index=True)
    plan.loc[: len(plan) // 2 - 1, "policy"] = None
    grids = dp.plan_grids(plan)
    assert [g["label"] for g in grids] == ["kv_dtype=q8_0", "kv_dtype=q8_0 · policy=sliding-window"]
    assert np.isnan(grids[0]["fraction"][2, 2]) and grids[0]["hover"][2, 2] == "not tried"


def test_plan_missing_columns_named() -> None:
    with pytest.raises(InputError, match="feasible, binding"):
        dp.plan_grids(plan_table().drop(columns=["feasible", "binding"]))
    assert dp.plan_grids(None) == []


def test_binding_labels() -> None:
    assert [dp.binding_label(b) for b in ("ttft_p95", "device_fraction", "config")] == [
        "TTFT", "MEM", "CONF"]


def test_gpu_comparison_price_per_feasible_session() -> None:
    table = pd.DataFrame({"gpu": ["rtx-4060-ti-16gb", "rtx-4090", "tiny"],
                          "feasible": [True, True, False], "best_parallel": [2, 4, 0],
                          "best_context_tokens": [16384, 32768, 0],
                          "price_usd": [499.0, 1599.0, 99.0]})
    out = dp.gpu_comparison(table)
    assert out["usd_per_session"].tolist()[:2] == [249.5, 399.75]
    assert np.isnan(out["usd_per_session"].iloc[2])


def test_runs_table_and_policy_comparison() -> None:
    runs = [make_run("f16"), make_run("f16", kv_scale=0.5)]
    runs[1].summary["recall_mean"] = 0.8
    table = dp.runs_table(runs)
    assert table["label"].tolist() == ["f16", "f16 (2)"]
    # run 1: from its reference events (1.0, 0.1, 0.97); run 2: summary recall_mean
    assert table["accuracy_mean"].tolist() == pytest.approx([2.07 / 3, 0.8])
    assert table["peak_kv_allocated_bytes"].tolist() == [3 * 2**30, 1.5 * 2**30]
    comp = dp.policy_comparison(table)
    assert "ttft_p95_s" in comp.columns and "itl_p95_s" in comp.columns
    assert dp.runs_table(runs[:1]) is None


def test_sweep_dimensions_from_combined_table() -> None:
    sweep = pd.DataFrame({"point": [0, 1, 2], "engine.parallel": [1, 2, 4],
                          "engine.cache_type_k": ["q8_0", "f16", "q4_0"], "seed": [0, 0, 1],
                          "scenario_hash": ["a", "b", "c"], "name": ["s"] * 3,
                          "ttft_p95_s": [0.3, 0.5, 0.9], "peak_device_fraction": [0.6, 0.7, 0.8]})
    d = dp.sweep_dimensions(sweep)
    assert [x["label"] for x in d["dimensions"]] == [
        "engine.parallel", "engine.cache_type_k", "seed", "ttft_p95_s", "peak_device_fraction"]
    cat = d["dimensions"][1]
    assert cat["ticktext"] == ["f16", "q4_0", "q8_0"] and list(cat["values"]) == [2, 0, 1]
    assert d["color_label"] == "ttft_p95_s" and d["rows"] == 3


def test_sweep_dimensions_with_a_key_only_some_points_set() -> None:
    # listed points: one sets a latency block, the other keeps the base scenario's
    sweep = pd.DataFrame({"point": [0, 1], "latency": [{"kind": "calibrated"}, np.nan],
                          "scenario_hash": ["a", "b"], "ttft_p95_s": [0.3, 0.5]})
    dim = dp.sweep_dimensions(sweep)["dimensions"][0]
    assert dim["ticktext"] == ["(unset)", "{'kind': 'calibrated'}"]
    assert list(dim["values"]) == [1, 0]


def test_the_recommended_star_is_on_its_own_kv_and_policy_grid_only() -> None:
    from kvsim.report.figures_plan import plan_figure

    plan = pd.DataFrame([
        {"kv_dtype": "q8_0", "policy": "scenario", "context_tokens": 32768, "parallel": 2,
         "feasible": True, "binding": "", "peak_device_fraction": 0.8},
        {"kv_dtype": "f16", "policy": "scenario", "context_tokens": 32768, "parallel": 2,
         "feasible": False, "binding": "device_fraction", "peak_device_fraction": 1.1}])
    rec = {"kv_dtype": "q8_0", "policy": "scenario", "context_tokens": 32768, "parallel": 2}
    stars = {g["label"]: [t.name for t in plan_figure(g, rec).data].count("recommended")
             for g in dp.plan_grids(plan)}
    assert stars == {"kv_dtype=q8_0 · policy=scenario": 1, "kv_dtype=f16 · policy=scenario": 0}


def test_gpu_comparison_sessions_are_the_most_that_fit() -> None:
    # USD / session divides by max_parallel (kvsim.plan.compare): the fallback and the
    # bars use it too, not the recommended point's parallel
    table = pd.DataFrame({"gpu": ["rtx-4090"], "feasible": [True], "best_parallel": [1],
                          "max_parallel": [4], "best_context_tokens": [32768],
                          "price_usd": [1600.0]})
    assert dp.gpu_comparison(table)["usd_per_session"].tolist() == [400.0]
    from kvsim.report.figures_plan import gpu_figure
    assert list(gpu_figure(table).data[0].y) == [4]
