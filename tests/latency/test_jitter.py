"""Timing noise (latency.jitter_cv): its distribution, its seed, and that 0 changes nothing."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from kvsim.api import simulate
from kvsim.errors import InputError
from kvsim.latency.base import BatchShape
from kvsim.latency.constant import ConstantLatency
from kvsim.latency.factory import make_latency_model
from kvsim.latency.jitter import JitteredLatency, Noise, lognormal_params
from kvsim.scenario import load_scenario, resolve_scenario, scenario_hash

SMALL = ["workload.max_sessions=6"]


@pytest.mark.parametrize("cv", [0.05, 0.2, 0.6])
def test_noise_has_mean_one_and_the_given_cv(cv: float) -> None:
    x = np.array(Noise(cv, seed=11).take(200_000))
    # the mean's standard error is cv / sqrt(n): 5 of them is a tight, seeded bound
    assert abs(x.mean() - 1.0) < 5 * cv / math.sqrt(len(x))
    assert x.std(ddof=1) / x.mean() == pytest.approx(cv, rel=0.03)
    mu, sigma = lognormal_params(cv)
    assert stats.kstest(x, stats.lognorm(s=sigma, scale=math.exp(mu)).cdf).pvalue > 0.01


def test_noise_depends_on_the_seed_only_not_on_how_it_is_taken() -> None:
    single = Noise(0.2, 3)
    one_by_one = [single.take(1)[0] for _ in range(3)] + [single.next(), single.next()]
    a = Noise(0.2, 3)
    pieces = a.take(1) + a.take(4095) + a.take(5000)
    assert pieces[:5] == one_by_one
    assert pieces == Noise(0.2, 3).take(9096)
    assert pieces != Noise(0.2, 4).take(9096)


def test_jittered_step_times_scatter_around_the_exact_ones() -> None:
    exact = ConstantLatency(0.02, decode_token_s=0.001)
    lat = JitteredLatency(exact, 0.15, seed=5, prompt_cv=0.15)
    batch = BatchShape(decode_context=(100, 200))
    dts = np.array([lat.step_time_s(batch) for _ in range(50_000)])
    assert dts.mean() == pytest.approx(exact.step_time_s(batch), rel=0.005)
    assert dts.std(ddof=1) / dts.mean() == pytest.approx(0.15, rel=0.05)
    assert lat.step_time_s(BatchShape()) == 0.0  # an empty step stays free
    steps = lat.decode_steps_s(np.array([5, 6]), 1000)
    assert len(set(steps.tolist())) == 1000 and steps.mean() == pytest.approx(0.022, rel=0.05)
    assert lat.provenance == "constant(step 0.02 s) + jitter CV 0.15"


def test_jitter_zero_is_the_exact_model_and_the_same_scenario() -> None:
    sc = load_scenario("quickstart", SMALL)
    zero = load_scenario("quickstart", SMALL + ["latency.jitter_cv=0"])
    assert scenario_hash(zero) == scenario_hash(sc)
    assert zero.model_dump(mode="json") == sc.model_dump(mode="json")
    assert "jitter" not in json.dumps(sc.model_dump(mode="json"))
    assert not isinstance(make_latency_model(zero), JitteredLatency)
    a, b = simulate(sc), simulate(zero)
    assert a.summary == b.summary and a.requests.equals(b.requests)


def test_a_jittered_scenario_round_trips_and_hashes_apart() -> None:
    sc = load_scenario("quickstart", SMALL + ["latency.jitter_cv=0.1", "latency.jitter_seed=4"])
    dumped = sc.model_dump(mode="json")
    assert list(dumped["latency"])[-2:] == ["jitter_cv", "jitter_seed"]
    again = resolve_scenario(dumped)
    assert again == sc and scenario_hash(again) == scenario_hash(sc)
    assert scenario_hash(sc) != scenario_hash(load_scenario("quickstart", SMALL))


def test_same_seed_same_run_other_seed_other_timing_same_workload() -> None:
    jit = ["latency.jitter_cv=0.2"]
    a = simulate(load_scenario("quickstart", SMALL + jit))
    b = simulate(load_scenario("quickstart", SMALL + jit))
    assert a.summary == b.summary and a.requests.equals(b.requests) and a.itl.equals(b.itl)
    c = simulate(load_scenario("quickstart", SMALL + jit + ["latency.jitter_seed=99"]))
    assert c.summary["ttft_p95_s"] != a.summary["ttft_p95_s"]
    same = ["request_id", "prompt_tokens"]
    assert c.requests[same].equals(a.requests[same])  # the sessions are the seed's own


def test_jitter_runs_every_step_whatever_the_fidelity() -> None:
    """A jittered run cannot jump decode stretches (kvsim.latency.jitter): fast is step."""
    jit = ["latency.jitter_cv=0.2"]
    fast = simulate(load_scenario("quickstart", SMALL + jit + ["sim.fidelity=fast"]))
    step = simulate(load_scenario("quickstart", SMALL + jit + ["sim.fidelity=step"]))
    assert fast.summary == step.summary and fast.requests.equals(step.requests)


@pytest.mark.parametrize("value", ["1", "-0.1", "2.5"])
def test_jitter_cv_outside_its_range_is_refused(value: str) -> None:
    with pytest.raises(InputError) as exc:
        load_scenario("quickstart", [f"latency.jitter_cv={value}"])
    assert "jitter_cv" in exc.value.one_line()


def test_jittered_steps_do_not_carry_the_calibrated_spread_again() -> None:
    """An exact run's percentiles carry the calibration's measured spread; a jittered
    run's gaps already carry that noise, so its percentiles must not carry it twice."""
    from kvsim.latency.artifact import FEATURES, FeatureRange, LatencyFit
    from kvsim.latency.calibrated import CalibratedLatencyModel

    fit = LatencyFit(cache_type="f16", coefficients_s=dict.fromkeys(FEATURES, 1e-3), mape=0.0,
                     max_ape=0.0, points=1, max_context=10, max_batch=1,
                     valid={n: FeatureRange(min=0.0, max=1.0) for n in FEATURES[1:]},
                     decode_spread=(0.8, 1.0, 1.4), prefill_spread=(0.9, 1.0, 1.1))
    exact = CalibratedLatencyModel(fit)
    both = JitteredLatency(exact, 0.2, seed=1, prompt_cv=0.1)
    assert (both.decode_spread, both.prefill_spread) == ((), ())
    decode_only = JitteredLatency(exact, 0.2, seed=1, prompt_cv=0.0)
    assert decode_only.decode_spread == () and decode_only.prefill_spread == (0.9, 1.0, 1.1)
    prompt_only = JitteredLatency(exact, 0.0, seed=1, prompt_cv=0.1)
    assert prompt_only.decode_spread == (0.8, 1.0, 1.4) and prompt_only.prefill_spread == ()


def test_calibrations_predict_medians_rooflines_and_constants_means() -> None:
    from kvsim.latency.calibrated import CalibratedLatencyModel
    from kvsim.latency.roofline import RooflineLatency

    assert CalibratedLatencyModel.predicts_median is True
    assert RooflineLatency.predicts_median is False
    assert ConstantLatency.predicts_median is False


class _MedianModel(ConstantLatency):
    """A constant model that says its times are measured medians (as a calibration's)."""

    predicts_median = True


@pytest.mark.parametrize("prompt_cv", [0.3, 0.1])   # the noise's own CV, and rescaled
def test_noise_centres_on_the_median_where_the_model_predicts_medians(prompt_cv) -> None:
    # a calibrated model's points are medians: its jittered steps keep that median (and
    # run exp(s^2/2) = sqrt(1 + cv^2) above it in the mean); a roofline's keep their mean
    decode, prompt = BatchShape(decode_context=(10,)), BatchShape(prefill_tokens=(64,),
                                                                  prefill_context=(0,))
    for model, centre in ((_MedianModel(0.02, decode_token_s=0.0), np.median),
                          (ConstantLatency(0.02, decode_token_s=0.0), np.mean)):
        lat = JitteredLatency(model, 0.3, seed=8, prompt_cv=prompt_cv)
        assert lat.predicts_median is model.predicts_median
        d = np.array([lat.step_time_s(decode) for _ in range(40_000)])
        p = np.array([lat.step_time_s(prompt) for _ in range(40_000)])
        assert centre(d) == pytest.approx(0.02, rel=0.01)
        assert centre(p) == pytest.approx(model.step_time_s(prompt), rel=0.01)
        if model.predicts_median:
            assert d.mean() == pytest.approx(0.02 * math.sqrt(1 + 0.3 ** 2), rel=0.01)
        assert d.std(ddof=1) / d.mean() == pytest.approx(0.3, rel=0.05)
        assert p.std(ddof=1) / p.mean() == pytest.approx(prompt_cv, rel=0.05)
