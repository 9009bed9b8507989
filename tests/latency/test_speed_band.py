"""The speed model's error band (kvsim.latency.speed_band): the factors read from the
fitted constants' leave-one-device-out percentiles, a latency model scaled by them, and a
scenario rerun at either end."""

import numpy as np
import pytest

from kvsim.api import simulate
from kvsim.errors import InputError
from kvsim.latency.backend import load_constants
from kvsim.latency.base import BatchShape
from kvsim.latency.constant import ConstantLatency
from kvsim.latency.factory import make_latency_model
from kvsim.latency.speed_band import ScaledLatency, band_from_errors, speed_band
from kvsim.scenario import load_scenario, resolve_scenario, scenario_hash

EXACT = ConstantLatency(0.02, prefill_token_s=1e-4, decode_token_s=0.001)
PROMPT = BatchShape(prefill_tokens=(300,), prefill_context=(0,), decode_context=(50,))
SMALL = ["workload.max_sessions=6"]
ERRORS = {"single/ROCm/tg_tps": {"n": 10.0, "p10_rel_err": -0.25, "p90_rel_err": 0.1},
          "single/ROCm/pp_tps": {"n": 12.0, "p10_rel_err": -0.5, "p90_rel_err": 0.6},
          "single/Metal/tg_tps": {"n": 56.0, "median_abs_rel_err": 0.03}}


def test_prompt_steps_and_decode_steps_take_their_own_factor() -> None:
    lat = ScaledLatency(EXACT, decode=1.25, prompt=0.5)
    assert lat.step_time_s(PROMPT) == 0.5 * EXACT.step_time_s(PROMPT)
    contexts = np.array([100, 200])
    steps = lat.decode_steps_s(contexts, 40)
    # a stretch's steps are the scaled decode-only steps, as fast-forward requires
    singles = [lat.step_time_s(BatchShape(decode_context=tuple(int(c) + j for c in contexts)))
               for j in range(40)]
    np.testing.assert_allclose(steps, singles, rtol=1e-12)
    np.testing.assert_allclose(steps, 1.25 * EXACT.decode_steps_s(contexts, 40), rtol=1e-12)
    assert lat.decode_steps_list([100, 200], 40) is None  # the inner model has no list path
    roof = make_latency_model(load_scenario("quickstart", SMALL))
    base = roof.decode_steps_list([100, 200], 40)
    assert base is not None
    scaled = ScaledLatency(roof, decode=1.25, prompt=0.5).decode_steps_list([100, 200], 40)
    assert scaled == [1.25 * d for d in base]
    assert lat.provenance == f"{EXACT.provenance} x1.25 decode, x0.5 prompt step time"
    with pytest.raises(ValueError, match="positive"):
        ScaledLatency(EXACT, decode=0.0, prompt=1.0)


def test_a_band_is_one_plus_the_signed_error_percentiles_of_its_backend() -> None:
    band = band_from_errors(ERRORS, "ROCm")
    assert band is not None and band.backend == "ROCm"
    # kvsim 25 % slower than measured at the 10th percentile: steps 0.75 as long
    assert (band.decode, band.prompt) == ((0.75, 1.1), (0.5, 1.6))
    assert (band.decode_rows, band.prompt_rows) == (10, 12)
    assert band.factors("fast") == (0.75, 0.5) and band.factors("slow") == (1.1, 1.6)
    assert band.speed_words() == ("decode 0.91–1.33× and prompt processing 0.62–2.00× "
                                  "kvsim's speed")
    assert band.summary() == pytest.approx({
        "latency_fit_decode_speed_p10": 1 / 1.1, "latency_fit_decode_speed_p90": 1 / 0.75,
        "latency_fit_prompt_speed_p10": 1 / 1.6, "latency_fit_prompt_speed_p90": 2.0})
    # no percentiles written (an older constants file), or no rows of the backend
    assert band_from_errors(ERRORS, "Metal") is None
    assert band_from_errors(ERRORS, "SYCL") is None


def test_a_scenario_s_band_is_its_backend_s_and_only_a_fitted_roofline_has_one() -> None:
    sc = load_scenario("quickstart", SMALL)  # an RTX 4090: CUDA
    errors = load_constants().errors
    band = speed_band(sc)
    assert band is not None and band.backend == "CUDA"
    assert band.decode == (1 + errors["single/CUDA/tg_tps"]["p10_rel_err"],
                           1 + errors["single/CUDA/tg_tps"]["p90_rel_err"])
    assert band.decode[0] < 1 < band.decode[1] and band.prompt[0] < 1 < band.prompt[1]
    assert speed_band(load_scenario("quickstart", SMALL + ["latency.backend=Vulkan"])
                      ).backend == "Vulkan"
    assert speed_band(load_scenario("quickstart", SMALL + ["latency.rates=peak"])) is None
    const = load_scenario("quickstart", SMALL + ["latency.kind=constant",
                                                 "latency.step_s=0.01"])
    assert speed_band(const) is None


def test_a_run_at_either_end_keeps_fast_forward_exact_and_moves_latency_its_way() -> None:
    sc = load_scenario("quickstart", SMALL)
    plain = simulate(sc)
    assert plain.summary["latency_fit_decode_speed_p10"] == 1 / speed_band(sc).decode[1]
    none = load_scenario("quickstart", SMALL + ["latency.speed_band=none"])
    assert scenario_hash(none) == scenario_hash(sc)
    assert "speed_band" not in none.model_dump(mode="json")["latency"]
    slow_sc = load_scenario("quickstart", SMALL + ["latency.speed_band=slow"])
    assert scenario_hash(slow_sc) != scenario_hash(sc)
    assert resolve_scenario(slow_sc.model_dump(mode="json")) == slow_sc
    slow = simulate(slow_sc)
    decode, prompt = speed_band(sc).factors("slow")
    assert slow.summary["latency_model"] == (
        f"{plain.summary['latency_model']} x{decode:.3g} decode, x{prompt:.3g} prompt step time")
    step = slow_sc.model_copy(update={"sim": slow_sc.sim.model_copy(
        update={"fidelity": "step"})})
    np.testing.assert_allclose(slow.requests["ttft_s"].to_numpy(float),
                               simulate(step).requests["ttft_s"].to_numpy(float), rtol=1e-9)
    fast = simulate(load_scenario("quickstart", SMALL + ["latency.speed_band=fast"]))
    for col in ("ttft_s", "e2e_s"):
        a, b, c = (r.requests[col].to_numpy(float) for r in (fast, plain, slow))
        assert np.nanmedian(a) < np.nanmedian(b) < np.nanmedian(c)


def test_an_end_without_a_band_is_refused_in_one_line() -> None:
    sc = load_scenario("quickstart", SMALL + ["latency.rates=peak", "latency.speed_band=slow"])
    with pytest.raises(InputError, match="latency.speed_band") as exc:
        simulate(sc)
    assert "rates: backend" in str(exc.value)
