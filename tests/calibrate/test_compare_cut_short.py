"""kvsim compare judges the requests that ended: a prediction cut short by
``sim.max_sim_time_s`` keeps its unfinished requests as ``status`` rows, which its own
summary's percentiles and compare's leave out."""

from __future__ import annotations

import dataclasses

from kvsim.calibrate.validate import check_pair, compare_results
from kvsim.metrics.results import Results


def test_unfinished_predicted_rows_are_not_compared(tmp_path, make_results):
    m = Results.load(make_results(tmp_path / "m", ["a#0", "b#0"], source="measured"))
    p = Results.load(make_results(tmp_path / "p", ["a#0", "b#0", "c#0"]))
    # c#0 was still waiting at the stop: no first token, no end, 900 prompt tokens
    p = dataclasses.replace(p, requests=p.requests.assign(
        status=["finished", "finished", "unfinished"], ttft_s=[1.0, 1.0, float("nan")],
        e2e_s=[2.0, 2.0, float("nan")], prompt_tokens=[0, 0, 900]))
    t = compare_results(m, p).set_index("metric")
    assert t.loc["requests", "predicted"] == 2.0 == t.loc["requests", "measured"]
    assert t.loc["prompt_tokens", "predicted"] == 0.0
    assert t.loc["ttft_p95_s", "predicted"] == 1.0 and t.loc["e2e_p95_s", "predicted"] == 2.0


def test_a_side_that_stopped_early_is_noted(tmp_path, make_results):
    m = Results.load(make_results(tmp_path / "m", ["a#0"], source="measured"))
    p = Results.load(make_results(tmp_path / "p", ["a#0"]))
    m = dataclasses.replace(m, summary={**m.summary, "unfinished_requests": 3,
                                        "stopped_reason": "the server closed the connection"})
    assert check_pair(m, p) == [(
        "MEASURED stopped early (the server closed the connection) with 3 unfinished "
        "requests: only the requests that ended are compared")]
    assert check_pair(Results.load(tmp_path / "m"), p) == []  # ended: nothing to say
