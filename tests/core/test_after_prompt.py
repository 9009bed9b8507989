"""The first decode steps after a prompt step run slower on llama-server (another slot's
decode too): `calibrate engine` measures by how much (LatencyFit.after_prompt_s), a
calibrated model adds it to those steps (BatchShape.after_prompt, set by the slot
scheduler), and fast-forward starts no stretch before them."""

import pytest
from core_helpers import req

from kvsim.calibrate.engine_noise import after_prompt_excess
from kvsim.calibrate.engine_samples import DecodeSample, EngineSamples
from kvsim.core.slot_scheduler import SlotScheduler
from kvsim.latency.artifact import FEATURES, FeatureRange, LatencyFit
from kvsim.latency.base import BatchShape
from kvsim.latency.calibrated import CalibratedLatencyModel


def _sample(head: list[float], steady: float = 0.002, n: int = 20) -> DecodeSample:
    return DecodeSample(steady, n, tuple(head + [steady] * (n - len(head))))


def test_the_excess_is_the_median_first_gaps_over_each_samples_steady_step() -> None:
    """One-sequence samples: gap k minus the sample's median gap after the first four.
    Steps 0-2 above steady by (6, 2, 0.5) ms, (8, 3, 1) ms and (7, 1, 0) ms: medians
    7, 2 and 0.5 ms; step 3 is steady in all (0: dropped as a trailing zero).  The
    batch-2 sample's first gaps (other requests' prompts beside it) are left out."""
    decode = {(1, 0): [_sample([0.008, 0.004, 0.0025]), _sample([0.010, 0.005, 0.003])],
              (1, 256): [_sample([0.009, 0.003, 0.002], steady=0.002)],
              (2, 0): [_sample([0.5, 0.5, 0.5, 0.5])]}
    got = after_prompt_excess(EngineSamples(props={}, decode=decode))
    assert got == pytest.approx((0.007, 0.002, 0.0005))
    assert after_prompt_excess(EngineSamples(props={})) == ()


def _model(after: tuple[float, ...]) -> CalibratedLatencyModel:
    coef = dict.fromkeys(FEATURES, 0.0) | {"step": 0.001, "decode_seq": 0.0005}
    fit = LatencyFit(cache_type="f16", coefficients_s=coef, mape=0.0, max_ape=0.0, points=1,
                     max_context=8192, max_batch=4, after_prompt_s=after,
                     valid={n: FeatureRange(min=0, max=1e12) for n in FEATURES})
    return CalibratedLatencyModel(fit)


def test_a_calibrated_model_adds_the_excess_to_the_first_decode_steps_after_a_prompt() -> None:
    m = _model((0.006, 0.002))
    assert m.settle_steps == 2
    # steady: 1 ms + 0.5 ms for one sequence
    steps = [m.step_time_s(BatchShape(decode_context=(100,), after_prompt=k))
             for k in (-1, 0, 1, 2)]
    assert steps == pytest.approx([0.0015, 0.0075, 0.0035, 0.0015])


def test_the_slot_scheduler_counts_the_decode_steps_since_the_last_prompt_step() -> None:
    s = SlotScheduler(parallel=2, slot_tokens=4096, pool_cells=8192, unified=False,
                      bytes_per_token=10, reserved_bytes=81920, n_batch=2048, cache_ram_bytes=0)
    a = req("a#0", [("a", 100)], out=10)
    s.add_request(a, 0.0)
    seen, now = [], 0.0
    for k in range(6):
        if k == 3:  # b's prompt joins a's decode: a prompt step again
            s.add_request(req("b#0", [("b", 50)], out=10), now)
        plan = s.schedule(now)
        seen.append(plan.batch.after_prompt)
        now += 0.01
        s.complete(plan, now)
    # prompt, decode 0, decode 1, a's decode beside b's prompt, decode 0, decode 1
    assert seen == [-1, 0, 1, -1, 0, 1]


def test_fast_forward_waits_out_the_settling_steps(tmp_path) -> None:
    """A run at both fidelities gives the same times with an after-prompt excess: the
    fast one prices the settling steps one by one, then stretches."""
    from kvsim.api import simulate
    from kvsim.latency.artifact import CalibrationArtifact, TimingPoint, save_artifact
    from kvsim.scenario import resolve_scenario
    from kvsim.workload.schema import Session, Turn

    fit = _model((0.006, 0.002)).fit
    art = CalibrationArtifact(source="engine", device="test", model="m", fits={"f16": fit},
                              points=(TimingPoint(kind="decode", cache_type="f16", batch=1,
                                                  context=1, steps=1, measured_s=0.0015),))
    path = save_artifact(art, tmp_path / "a.json")
    sessions = [Session(session_id=f"s{i}", turns=(
        Turn(start_s=0.3 * i, input_tokens=50, output_tokens=200),)) for i in range(3)]
    runs = {}
    for fidelity in ("fast", "step"):
        sc = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b",
                               "engine": {"preset": "llama.cpp", "allocator": "slots",
                                          "parallel": 4, "context_tokens": 16384},
                               "workload": {"preset": "family-2"},
                               "latency": {"kind": "calibrated", "path": str(path)},
                               "sim": {"fidelity": fidelity}})
        runs[fidelity] = simulate(sc, sessions=sessions).requests.set_index("request_id")
    for col in ("first_token_s", "finish_s"):
        assert runs["fast"][col].to_numpy() == pytest.approx(runs["step"][col].to_numpy(),
                                                             rel=1e-9)
    # s0 decodes alone: its first two decode steps pay 6 + 2 ms over the steady 1.5 ms
    s0 = runs["step"].loc["s0#0"]
    assert s0.finish_s - s0.first_token_s > 199 * 0.0015 + 0.008 - 1e-9
