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


@pytest.mark.parametrize(("queue_s", "peak", "words"), [
    # no request waited: the prompts' own compute sets the TTFT (quickstart's day)
    (0.0, 2, ("no change found: requests hardly waited for a slot (queue p95 0.00 ms of "
              "TTFT p95 2,500 ms): the card's own prompt and decode speed sets it")),
    # they waited, yet never more came at once than the four slots: more would not help
    (1.5, 4, ("no change found: requests waited (queue p95 1,500 ms of TTFT p95 2,500 ms) "
              "but never more came at once than the slots (4 at most)")),
])
def test_a_latency_miss_no_engine_setting_can_move_says_why(queue_s: float, peak: int,
                                                            words: str) -> None:
    from kvsim.plan.advice import advise

    sc = load_scenario("quickstart", ["workload.max_sessions=2"])
    summary = {"ttft_p95_s": 2.5, "itl_p95_s": 0.03, "queue_p95_s": queue_s,
               "peak_concurrent_requests": peak, "peak_device_fraction": 0.5}
    change, why = advise(sc, summary, constraints_for(sc)[0], "ttft_p95")
    assert change is None and f"no change found: {why}".startswith(words)
    assert why.endswith("a faster card (kvsim compare --gpus …), shorter prompts or a "
                        "looser target would")
