"""Timing noise of prompt steps (latency.jitter_prompt_cv): its own CV on steps that
compute prompt tokens, the same draws as without it, and a scenario key that changes
nothing unset."""

import math

import numpy as np
import pytest

from kvsim.api import run_fidelity
from kvsim.errors import InputError
from kvsim.latency.base import BatchShape
from kvsim.latency.constant import ConstantLatency
from kvsim.latency.factory import make_latency_model
from kvsim.latency.jitter import JitteredLatency, lognormal_params, with_jitter
from kvsim.plan.jitter import jitter_seeds
from kvsim.scenario import load_scenario, resolve_scenario, scenario_hash

EXACT = ConstantLatency(0.02, prefill_token_s=1e-4, decode_token_s=0.001)
PROMPT = BatchShape(prefill_tokens=(300,), prefill_context=(0,), decode_context=(50,))
DECODE = BatchShape(decode_context=(100, 200))
SMALL = ["workload.max_sessions=6"]


def _times(lat: JitteredLatency, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n prompt steps and n decode steps, alternating."""
    out = np.array([[lat.step_time_s(PROMPT), lat.step_time_s(DECODE)] for _ in range(n)])
    return out[:, 0], out[:, 1]


def test_prompt_steps_take_their_own_cv_and_decode_steps_keep_theirs() -> None:
    prompt, decode = _times(JitteredLatency(EXACT, 0.2, seed=5, prompt_cv=0.05), 40_000)
    assert prompt.mean() == pytest.approx(EXACT.step_time_s(PROMPT), rel=0.002)
    assert prompt.std(ddof=1) / prompt.mean() == pytest.approx(0.05, rel=0.05)
    assert decode.mean() == pytest.approx(EXACT.step_time_s(DECODE), rel=0.005)
    assert decode.std(ddof=1) / decode.mean() == pytest.approx(0.2, rel=0.05)


def test_a_prompt_cv_moves_no_draw_and_keeps_each_draws_quantile() -> None:
    """Same seed: every decode step is bit-identical to the run without a prompt CV, and
    each prompt step is the same draw at its own CV — the same quantile of its
    lognormal: exp(mu' + sigma'/sigma · (ln f − mu)) of the draw f."""
    plain_p, plain_d = _times(JitteredLatency(EXACT, 0.2, seed=9, prompt_cv=0.2), 500)
    own_p, own_d = _times(JitteredLatency(EXACT, 0.2, seed=9, prompt_cv=0.05), 500)
    assert own_d.tolist() == plain_d.tolist()
    (mu, sigma), (mu2, sigma2) = lognormal_params(0.2), lognormal_params(0.05)
    f = plain_p / EXACT.step_time_s(PROMPT)
    expected = np.exp(mu2 + sigma2 / sigma * (np.log(f) - mu)) * EXACT.step_time_s(PROMPT)
    np.testing.assert_allclose(own_p, expected, rtol=1e-12)
    same = JitteredLatency(EXACT, 0.2, seed=9, prompt_cv=0.2)
    assert _times(same, 500)[0].tolist() == plain_p.tolist()  # at the same CV: itself


def test_noise_on_prompt_steps_only() -> None:
    lat = with_jitter(EXACT, 0.0, seed=3, prompt_cv=0.1)
    assert isinstance(lat, JitteredLatency)
    prompt, decode = _times(lat, 20_000)
    assert set(decode.tolist()) == {EXACT.step_time_s(DECODE)}
    assert prompt.std(ddof=1) / prompt.mean() == pytest.approx(0.1, rel=0.05)
    assert lat.provenance == "constant(step 0.02 s) + jitter CV 0, prompt steps 0.1"
    assert with_jitter(EXACT, 0.0, seed=3, prompt_cv=0.0) is EXACT


def test_the_key_unset_changes_nothing_and_set_round_trips() -> None:
    base = load_scenario("quickstart", SMALL + ["latency.jitter_cv=0.2"])
    assert "jitter_prompt_cv" not in base.model_dump(mode="json")["latency"]
    assert base.latency.prompt_cv == 0.2
    sc = load_scenario("quickstart", SMALL + ["latency.jitter_cv=0.2",
                                              "latency.jitter_prompt_cv=0.07",
                                              "latency.jitter_seed=4"])
    dumped = sc.model_dump(mode="json")
    assert list(dumped["latency"])[-3:] == ["jitter_cv", "jitter_prompt_cv", "jitter_seed"]
    assert resolve_scenario(dumped) == sc
    assert scenario_hash(sc) != scenario_hash(load_scenario(
        "quickstart", SMALL + ["latency.jitter_cv=0.2", "latency.jitter_seed=4"]))
    assert make_latency_model(sc).provenance.endswith("+ jitter CV 0.2, prompt steps 0.07")


def test_prompt_noise_alone_is_timing_noise() -> None:
    """A run with noise on its prompt steps only is jittered: every step simulated, and
    it has replications to take."""
    sc = load_scenario("quickstart", SMALL + ["latency.jitter_prompt_cv=0.1"])
    assert sc.latency.jittered and run_fidelity(sc) == "step"
    assert len(jitter_seeds(sc, 3)) == 3
    assert not load_scenario("quickstart", SMALL).latency.jittered


@pytest.mark.parametrize("key", ["jitter_prompt_cv", "jitter_run_cv"])
@pytest.mark.parametrize("value", ["1", "-0.1", "nan"])
def test_a_cv_key_outside_its_range_is_refused(key: str, value: str) -> None:
    """latency.jitter_prompt_cv and jitter_run_cv (tests/latency/test_jitter_run.py)."""
    with pytest.raises(InputError) as exc:
        load_scenario("quickstart", [f"latency.{key}={value}"])
    line = exc.value.one_line()
    assert f"{key}: " in line and value in line and "\n" not in line


def test_lognormal_params_give_mean_one() -> None:
    mu, sigma = lognormal_params(0.05)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(1.0, abs=1e-15)
