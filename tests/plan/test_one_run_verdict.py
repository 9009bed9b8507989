"""A single run's verdict gives the OOM risk's 95 % interval from what one run can say
(0 or 1 OOM of 1): the two Wilson intervals kvsim.plan.advice keeps, which must be
scipy.stats' own (kvsim.plan.stats.wilson_interval), and the lines it prints."""

import pytest

from kvsim.plan.advice import ONE_RUN_OOM_CI, constraints_for, run_verdict
from kvsim.plan.stats import wilson_interval
from kvsim.scenario import load_scenario


@pytest.mark.parametrize("oom", [False, True])
def test_the_kept_intervals_are_scipys_wilson_intervals(oom: bool) -> None:
    ci = wilson_interval(int(oom), 1)
    assert ONE_RUN_OOM_CI[oom] == (ci.low, ci.high)


@pytest.mark.parametrize(("failed", "words"), [
    (0, "no OOM in this run (one run: OOM risk 95 % CI 0%–79%; kvsim plan -n 8 narrows it)"),
    (3, "an OOM-class failure in this run (one run: OOM risk 95 % CI 21%–100%; kvsim plan "
        "-n 8 narrows it)"),
])
def test_the_memory_line_says_the_one_run_interval(failed: int, words: str) -> None:
    sc = load_scenario("quickstart", ["workload.max_sessions=2"])
    summary = {"ttft_p95_s": 0.5, "itl_p95_s": 0.03, "peak_device_fraction": 0.5,
               "peak_device_bytes": 8 * 2**30, "failed_kv_exhausted_requests": failed}
    v = run_verdict(summary, constraints_for(sc)[0])
    assert v.details[1].endswith(words)
