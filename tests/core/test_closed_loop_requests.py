"""A ``history: none`` session may be a closed loop of independent requests: each turn
is its own content only and leaves ``think_s`` after the previous answer (a benchmark
client at a fixed concurrency); both fidelities agree."""
import pytest

from kvsim.api import simulate
from kvsim.scenario import load_scenario
from kvsim.workload.schema import Session, Turn


def _run(fidelity: str):
    sc = load_scenario("quickstart", [f"sim.fidelity={fidelity}"])
    s = Session(session_id="a", history="none", turns=(
        Turn(start_s=0.0, input_tokens=100, output_tokens=10),
        Turn(think_s=0.5, input_tokens=120, output_tokens=10),
        Turn(input_tokens=90, output_tokens=12)))
    return simulate(sc, sessions=[s]).requests.set_index("request_id")


@pytest.mark.parametrize("fidelity", ["fast", "step"])
def test_each_request_follows_the_last_answer_with_its_own_content(fidelity):
    r = _run(fidelity)
    assert list(r["prompt_tokens"]) == [100, 120, 90]      # no history carried
    assert list(r["cached_tokens"]) == [0, 0, 0]
    assert r.loc["a#1", "arrival_s"] == pytest.approx(r.loc["a#0", "finish_s"] + 0.5,
                                                      abs=1e-9)
    assert r.loc["a#2", "arrival_s"] == pytest.approx(r.loc["a#1", "finish_s"], abs=1e-9)


def test_fast_and_step_fidelity_give_the_same_requests():
    fast, step = _run("fast"), _run("step")
    for col in ("arrival_s", "finish_s", "ttft_s", "e2e_s"):
        assert list(fast[col]) == pytest.approx(list(step[col]), rel=1e-9)
