"""Requests that reach the engine late (latency.arrival_delay_s / arrival_jitter_s): the
client's lateness and the server's request handling, which decide races between sessions
that step-time noise alone leaves alone (docs/design/timing-noise.md)."""

import statistics

import pytest

from kvsim.api import run_fidelity, simulate
from kvsim.errors import InputError
from kvsim.latency.jitter import ArrivalNoise, arrival_noise
from kvsim.plan.jitter import jitter_replications
from kvsim.scenario import load_scenario, resolve_scenario, scenario_hash
from tests.timing_households import sessions_scenario

SMALL = ["workload.max_sessions=6"]


def test_delays_are_lognormal_of_the_mean_and_sd_given() -> None:
    d = ArrivalNoise(0.002, 0.001, seed=4).take(40_000)
    assert statistics.fmean(d) == pytest.approx(0.002, rel=0.01)
    assert statistics.stdev(d) == pytest.approx(0.001, rel=0.03)
    assert min(d) > 0  # never early
    assert ArrivalNoise(0.002, 0.001, seed=4).take(5) == d[:5]  # the seed decides
    assert ArrivalNoise(0.002, 0.001, seed=5).take(5) != d[:5]
    assert ArrivalNoise(0.002, 0.0, seed=4).take(3) == [0.002] * 3
    assert arrival_noise(0.0, 0.0, seed=4) is None


def _closed_loop(tmp_path, *keys: str):
    sc = load_scenario(sessions_scenario(tmp_path, 2, jitter_cv=0.0), list(keys))
    return simulate(sc).requests.set_index("request_id")


def test_each_turn_reaches_the_engine_the_delay_late(tmp_path) -> None:
    """sd 0: the first turn at start + d, each follow-up d after its think time ends."""
    late = _closed_loop(tmp_path, "latency.arrival_delay_s=0.003")
    think = [2.0 + 0.5 * ((7 * i + 3 * t) % 5) for i in range(2) for t in range(6)]
    for i in range(2):
        assert late.loc[f"s{i}#0", "arrival_s"] == 0.5 * i + 0.003
        for t in range(1, 6):
            prev = late.loc[f"s{i}#{t - 1}", "finish_s"]
            assert late.loc[f"s{i}#{t}", "arrival_s"] == pytest.approx(
                prev + think[6 * i + t] + 0.003, abs=1e-12)
    on_time = _closed_loop(tmp_path)
    assert (late["ttft_s"] - on_time["ttft_s"]).abs().max() < 1e-9  # no race: same service


def test_the_keys_unset_change_nothing_and_set_round_trip() -> None:
    base = load_scenario("quickstart", SMALL)
    zero = load_scenario("quickstart", SMALL + ["latency.arrival_delay_s=0"])
    assert scenario_hash(zero) == scenario_hash(base)
    assert "arrival_delay_s" not in zero.model_dump(mode="json")["latency"]
    sc = load_scenario("quickstart", SMALL + ["latency.arrival_delay_s=2ms",
                                              "latency.arrival_jitter_s=0.001"])
    dumped = sc.model_dump(mode="json")["latency"]
    assert (dumped["arrival_delay_s"], dumped["arrival_jitter_s"]) == (0.002, 0.001)
    assert resolve_scenario(sc.model_dump(mode="json")) == sc
    assert sc.latency.jittered and run_fidelity(sc) == "fast"  # steps stay exact
    assert sc.latency.noise_words == ("latency.jitter_cv 0, requests 2 ms late "
                                      "(sd 1 ms)")


@pytest.mark.parametrize(("keys", "message"), [
    (["latency.arrival_jitter_s=0.001"],
     ("latency.roofline.arrival_jitter_s: 0.001 — 0 unless arrival_delay_s > 0 (the "
      "delay's mean; its draws are lognormal, never early)")),
    (["latency.arrival_delay_s=-0.001"],
     "latency.roofline.arrival_delay_s: -0.001 — a duration must be a finite number >= 0"),
    # NOTE: 1e99 s ran forever before the bound (the clock stops advancing at that size)
    (["latency.arrival_delay_s=1e99"],
     "latency.roofline.arrival_delay_s: '1e99' — Input should be less than or equal to 60"),
    (["latency.arrival_delay_s=1", "latency.arrival_jitter_s=61"],
     "latency.roofline.arrival_jitter_s: 61 — Input should be less than or equal to 60"),
])
def test_bad_arrival_keys_are_one_line(keys, message) -> None:
    with pytest.raises(InputError) as exc:
        load_scenario("quickstart", SMALL + keys)
    assert exc.value.one_line() == message


def test_both_fidelities_see_the_same_late_arrivals(tmp_path) -> None:
    keys = ["latency.arrival_delay_s=0.004", "latency.arrival_jitter_s=0.003"]
    fast = _closed_loop(tmp_path, *keys, "sim.fidelity=fast")
    step = _closed_loop(tmp_path, *keys, "sim.fidelity=step")
    for col in ("arrival_s", "ttft_s", "e2e_s", "cached_tokens"):
        assert fast[col].tolist() == pytest.approx(step[col].tolist(), rel=1e-9, abs=1e-12)


def test_arrival_noise_alone_moves_a_race_between_sessions(tmp_path) -> None:
    """Six sessions on four slots, exact step times: which slot a returning session finds
    hinges on a few milliseconds of its arrival, so its reuse moves across replications
    (with four sessions on four slots it cannot)."""
    keys = ["latency.arrival_delay_s=0.02", "latency.arrival_jitter_s=0.02"]
    six = load_scenario(sessions_scenario(tmp_path, 6, jitter_cv=0.0), keys)
    reuse = {round(r.summary["prefix_hit_rate"], 6) for r in jitter_replications(six, 12)[1]}
    assert len(reuse) > 1
    four = load_scenario(sessions_scenario(tmp_path, 4, jitter_cv=0.0), keys)
    assert len({r.summary["prefix_hit_rate"] for r in jitter_replications(four, 6)[1]}) == 1
