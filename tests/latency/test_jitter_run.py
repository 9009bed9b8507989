"""A run's speed drift (latency.jitter_run_cv): one factor per run on every step, from its
own stream, that moves no step draw, keeps decode stretches exact, and a scenario key
that changes nothing unset (its refused values: tests/latency/test_jitter_prompt.py)."""

import numpy as np
import pytest

from kvsim.api import run_fidelity, simulate
from kvsim.latency.base import BatchShape
from kvsim.latency.constant import ConstantLatency
from kvsim.latency.factory import make_latency_model
from kvsim.latency.jitter import JitteredLatency, run_speed_factor, with_jitter
from kvsim.plan.jitter import jitter_seeds
from kvsim.scenario import load_scenario, resolve_scenario, scenario_hash

EXACT = ConstantLatency(0.02, prefill_token_s=1e-4, decode_token_s=0.001)
PROMPT = BatchShape(prefill_tokens=(300,), prefill_context=(0,), decode_context=(50,))
DECODE = BatchShape(decode_context=(100, 200))
SMALL = ["workload.max_sessions=6"]


@pytest.mark.parametrize("median", [True, False])
def test_run_factors_over_seeds_have_the_cv_and_the_model_s_centre(median: bool) -> None:
    f = np.array([run_speed_factor(0.15, seed, median) for seed in range(20_000)])
    assert f.std(ddof=1) / f.mean() == pytest.approx(0.15, rel=0.04)
    centre = np.median(f) if median else f.mean()
    assert centre == pytest.approx(1.0, abs=0.006)  # ~3 standard errors at n = 20,000
    assert run_speed_factor(0.15, 7, median) == run_speed_factor(0.15, 7, median)
    assert run_speed_factor(0.0, 7, median) == 1.0


def test_run_noise_alone_scales_every_step_by_one_factor() -> None:
    lat = with_jitter(EXACT, 0.0, seed=3, prompt_cv=0.0, run_cv=0.2)
    assert isinstance(lat, JitteredLatency)
    k = lat.run_factor
    assert k == run_speed_factor(0.2, 3, EXACT.predicts_median) and k != 1.0
    assert lat.step_time_s(PROMPT) == pytest.approx(k * EXACT.step_time_s(PROMPT), rel=1e-12)
    assert lat.step_time_s(DECODE) == pytest.approx(k * EXACT.step_time_s(DECODE), rel=1e-12)
    steps = lat.decode_steps_s(np.array([100, 200]), 50)
    np.testing.assert_allclose(steps, k * EXACT.decode_steps_s(np.array([100, 200]), 50),
                               rtol=1e-12)
    assert lat.provenance == f"{EXACT.provenance} + jitter CV 0, run speed CV 0.2 (this run x{k:.3f})"


def test_run_noise_moves_no_step_draw() -> None:
    """Same seed: each step of the run with drift is the run without it times the run's
    factor (the step draws come from their own stream)."""
    plain = JitteredLatency(EXACT, 0.2, seed=9, prompt_cv=0.05)
    drift = JitteredLatency(EXACT, 0.2, seed=9, prompt_cv=0.05, run_cv=0.1)
    a = np.array([[plain.step_time_s(PROMPT), plain.step_time_s(DECODE)] for _ in range(300)])
    b = np.array([[drift.step_time_s(PROMPT), drift.step_time_s(DECODE)] for _ in range(300)])
    np.testing.assert_allclose(b, a * drift.run_factor, rtol=1e-12)


def test_drift_alone_keeps_the_fast_fidelity_and_its_results_exact() -> None:
    """A factor on every step is no per-step noise: decode stretches are still jumped,
    and give what simulating every step gives."""
    sc = load_scenario("quickstart", SMALL + ["latency.jitter_run_cv=0.2",
                                              "latency.jitter_seed=5"])
    assert sc.latency.jittered and not sc.latency.steps_jittered
    assert run_fidelity(sc) == "fast" and len(jitter_seeds(sc, 3)) == 3
    fast = simulate(sc).requests
    step = simulate(sc.model_copy(update={"sim": sc.sim.model_copy(
        update={"fidelity": "step"})})).requests
    for col in ("ttft_s", "e2e_s", "cached_tokens"):
        np.testing.assert_allclose(fast[col].to_numpy(float), step[col].to_numpy(float),
                                   rtol=1e-9)
    plain = simulate(load_scenario("quickstart", SMALL)).requests
    assert not np.allclose(fast["ttft_s"].to_numpy(float), plain["ttft_s"].to_numpy(float))


def test_the_key_unset_changes_nothing_and_set_round_trips() -> None:
    base = load_scenario("quickstart", SMALL)
    zero = load_scenario("quickstart", SMALL + ["latency.jitter_run_cv=0"])
    assert scenario_hash(zero) == scenario_hash(base)
    assert "jitter_run_cv" not in zero.model_dump(mode="json")["latency"]
    assert make_latency_model(zero) is not None and not zero.latency.jittered
    sc = load_scenario("quickstart", SMALL + ["latency.jitter_cv=0.1",
                                              "latency.jitter_run_cv=0.12"])
    dumped = sc.model_dump(mode="json")
    assert dumped["latency"]["jitter_run_cv"] == 0.12
    assert resolve_scenario(dumped) == sc and scenario_hash(sc) != scenario_hash(base)
    assert "run speed 0.12" in sc.latency.noise_words
