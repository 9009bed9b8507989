"""Grid points the engine or a policy refuses: recorded per point, or bad input when
no point of a KV type / policy set is valid."""

import pytest

from kvsim.errors import InputError
from kvsim.plan.executor import LocalExecutor
from kvsim.plan.search import PlanGrid, search
from kvsim.plan.slo import build_constraints
from kvsim.scenario import resolve_scenario

C = build_constraints(["ttft_p95=60s"], max_device_fraction=0.85, max_oom_risk=1.0)
WINDOW = ("sliding_window:window_tokens=12000",
          ({"kind": "sliding_window", "window_tokens": 12000},))


def tiny():
    return resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.2-1b",
                             "engine": {"preset": "llama.cpp", "allocator": "slots"},
                             "workload": {"preset": "family-4", "days": 0.05,
                                          "max_sessions": 1}})


def test_a_window_larger_than_some_contexts_invalidates_only_those_points():
    # the window (+ 4 sinks) must be smaller than the slot: 12,004 > 8,192 but < 16,384
    res = search(tiny(), C, PlanGrid((8192, 16384), (1,), (None,), (WINDOW,)),
                 replications=1)
    rows = res.table.set_index("context_tokens")
    assert rows.loc[8192, "binding"] == "config" and not rows.loc[8192, "feasible"]
    assert "window_tokens" in rows.loc[8192, "notes"]
    assert rows.loc[16384, "evaluated"] == "simulated"


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_policy_no_point_accepts_is_an_input_error(jobs):
    # NOTE: with a process pool the error crosses a pickle boundary (InputError.__reduce__)
    ex = LocalExecutor(jobs) if jobs > 1 else None
    try:
        with pytest.raises(InputError, match="window_tokens"):
            search(tiny(), C, PlanGrid((4096, 8192), (1,), (None,), (WINDOW,)),
                   replications=1, executor=ex)
    finally:
        if ex is not None:
            ex.close()


def test_an_unknown_kv_type_is_an_input_error():
    with pytest.raises(InputError, match="cache_type"):
        search(tiny(), C, PlanGrid((8192,), (1,), ("q9_9",)), replications=1)
