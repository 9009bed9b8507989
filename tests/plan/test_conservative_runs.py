"""--conservative bounds each estimate by its confidence interval; one run has none
(a Student-t interval needs two), so a one-run conservative plan is refused up front
instead of judging every point infeasible against a NaN bound."""

import pytest

from kvsim.errors import InputError
from kvsim.plan.search import PlanGrid, search
from kvsim.plan.slo import build_constraints
from kvsim.scenario import load_scenario


def test_conservative_plan_needs_two_runs():
    c = build_constraints(["ttft_p95=2s"], max_oom_risk=0.9)
    with pytest.raises(InputError) as exc:
        search(load_scenario("quickstart", []), c, PlanGrid((4096,), (1,)), replications=1,
               conservative=True)
    assert str(exc.value) == ("--replications: 1 — at least 2 with --conservative: one run "
                              "gives no confidence interval to bound")


@pytest.mark.parametrize("contexts,parallels,err", [
    ((0, 4096), (1,), "--contexts: '0' — each value >= 1"),
    ((4096,), (2, -1), "--parallel: '-1' — each value >= 1")])
def test_grid_values_below_one_name_their_flag(contexts, parallels, err):
    with pytest.raises(InputError) as exc:
        PlanGrid(contexts, parallels)
    assert str(exc.value) == err
