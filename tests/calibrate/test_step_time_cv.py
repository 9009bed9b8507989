"""`calibrate engine` measures a server's timing noise (settings.step_time_cv) from its
repeats, and the number it prints is one a scenario takes as ``latency.jitter_cv``."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvsim.calibrate.engine import EngineGrid, calibrate_engine
from kvsim.calibrate.engine_noise import prompt_step_cv, run_speed_cv, step_time_cv
from kvsim.calibrate.engine_samples import DecodeSample, EngineSamples, PrefillSample
from kvsim.calibrate.wire import TokenSpace
from kvsim.latency.artifact import FEATURES, FeatureRange, LatencyFit
from kvsim.scenario import load_scenario

from .fake_llama import FakeLlama

COEF = {"step": 1e-3, "prefill_seq": 0.0, "prefill_token": 0.0, "prefill_attn": 0.0,
        "prefill_attn_small": 0.0, "decode_seq": 2e-4, "decode_kv": 1e-6}
FIT = LatencyFit(cache_type="f16", coefficients_s=COEF, mape=0.0, max_ape=0.0, points=1,
                 valid={n: FeatureRange(min=0.0, max=1.0) for n in FEATURES[1:]},
                 max_context=100, max_batch=2)
GRID = EngineGrid(prompt_tokens=(8,), contexts=(0, 64), batches=(1,), decode_tokens=30,
                  idle_s=0.0, repeats=2, space=TokenSpace(low=300, high=900))


def _noisy(rng: np.random.Generator, cv: float, n: int) -> np.ndarray:
    sigma = np.sqrt(np.log1p(cv * cv))
    return rng.lognormal(-sigma**2 / 2, sigma, n)


def _decodes(speeds: list[float], cv: float, per_round: int, seed: int) -> EngineSamples:
    """Decode samples of rounds that ran at ``speeds`` (``per_round`` sequences each),
    step noise of CV ``cv`` and a fit error of their own per point."""
    rng = np.random.default_rng(seed)
    decode = {}
    for b, c, fit_error in ((1, 10, 1.0), (2, 40, 1.3)):
        vals = []
        for rnd, speed in enumerate(speeds):
            for _ in range(per_round):
                ctx = c + np.arange(104)
                fitted = 1e-3 + b * 2e-4 + b * 1e-6 * ctx
                gaps = fitted * fit_error * speed * _noisy(rng, cv, len(ctx))
                vals.append(DecodeSample(0.0, len(ctx), tuple(gaps.tolist()), rnd))
        decode[(b, c)] = vals
    return EngineSamples(props={}, decode=decode, rounds=len(speeds))


def test_cv_of_the_gaps_leaves_out_the_fit_error_and_the_rounds_speed() -> None:
    samples = _decodes([1.0, 1.6], 0.12, 20, seed=7)  # the second round ran 60 % slower
    assert step_time_cv(samples, FIT) == pytest.approx(0.12, rel=0.06)


def _drifting(speeds: list[float]) -> EngineSamples:
    return _decodes(speeds, 0.15, 5, seed=11)


def test_run_speed_cv_is_the_rounds_drift_not_the_steps_noise() -> None:
    speeds = [1.0, 1.2, 0.85, 1.1, 0.95, 1.05]
    want = float(np.std(speeds, ddof=1) / np.mean(speeds))  # 0.119
    assert run_speed_cv(_drifting(speeds), FIT) == pytest.approx(want, rel=0.05)
    assert run_speed_cv(_drifting([1.0] * 6), FIT) < 0.01  # the step noise is not drift
    assert run_speed_cv(_drifting([1.0, 1.3]), FIT) is None  # two rounds say too little


def _prompts(rng: np.random.Generator, typical_s: dict[int, tuple[float, float]],
             rounds: int = 30) -> EngineSamples:
    """Prefill samples: per prompt size, ``(typical TTFT, CV)``; the second half of the
    rounds runs 40 % slower and each point carries a fit error of its own."""
    prefill = {}
    for k, (typical, cv) in typical_s.items():
        noise = _noisy(rng, cv, rounds)
        prefill[(0, k)] = [PrefillSample(typical * (1 + k / 1e4) * (1.4 if rnd >= rounds // 2
                                                                   else 1.0) * noise[rnd],
                                         0, k, rnd) for rnd in range(rounds)]
    return EngineSamples(props={}, prefill=prefill, rounds=rounds)


def test_prompt_cv_leaves_out_the_fit_error_and_the_rounds_speed() -> None:
    samples = _prompts(np.random.default_rng(3), {128: (0.04, 0.08), 512: (0.16, 0.08),
                                                  1280: (0.5, 0.08)})
    assert prompt_step_cv(samples) == pytest.approx(0.08, rel=0.15)


def test_prompt_cv_is_weighted_by_time() -> None:
    """Short prompts' times are mostly the request's own handling, whose hiccups are
    no step's: a 10 ms point at CV 0.5 beside 0.5 s points at CV 0.08 moves the CV by
    what its time weighs: sqrt((0.01·0.5² + 2·0.5·0.08²) / 1.01) = 0.095, where
    unweighted it would be sqrt((0.5² + 2·0.08²) / 3) = 0.30."""
    samples = _prompts(np.random.default_rng(5), {16: (0.01, 0.5), 768: (0.5, 0.08),
                                                  1280: (0.5, 0.08)}, rounds=60)
    assert prompt_step_cv(samples) == pytest.approx(0.095, rel=0.15)
    one = EngineSamples(props={}, prefill={(0, 64): [PrefillSample(0.02, 0, 64)]})
    assert prompt_step_cv(one) is None


def test_no_gaps_past_the_warm_up_measure_no_cv() -> None:
    short = EngineSamples(props={}, decode={(1, 10): [DecodeSample(0.0, 4, (1e-3,) * 4)]})
    assert step_time_cv(short, FIT) is None


def test_the_artifact_holds_the_servers_cv_measured_over_http() -> None:
    with FakeLlama(slot_tokens=200, gap_cv=0.2) as srv:
        art = calibrate_engine(srv.url, GRID)
    assert art.settings["step_time_cv"] == pytest.approx(0.2, rel=0.25)
    with FakeLlama(slot_tokens=200) as srv:  # a server without noise: 0
        assert calibrate_engine(srv.url, GRID).settings["step_time_cv"] == pytest.approx(
            0.0, abs=1e-9)


def test_the_cli_prints_the_cv_a_scenario_takes(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    with FakeLlama(slot_tokens=200, gap_cv=0.1) as srv:
        r = subprocess.run([sys.executable, "-m", "kvsim", "calibrate", "engine", "--url",
                            srv.url, "--prompts", "8", "--contexts", "0,64", "--batches", "1",
                            "--decode-tokens", "30", "--repeats", "3", "--token-range",
                            "300:900", "-o", str(out)], capture_output=True, text=True,
                           timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    settings = json.loads(out.read_text())["settings"]
    cv, prompt = settings["step_time_cv"], settings["prompt_step_cv"]
    line = next(x for x in r.stdout.splitlines() if x.startswith("step-time CV"))
    assert line == (f"step-time CV {cv:.3f}: set latency.jitter_cv: {cv:.3f} and "
                    f"latency.jitter_prompt_cv: {prompt:.3f} to replay this timing noise "
                    "(docs/scenarios.md, Timing noise)")
    sc = load_scenario("quickstart", [f"latency.jitter_cv={cv:.3f}"])
    assert sc.latency.jitter_cv == pytest.approx(cv, abs=5e-4)
    run = settings["run_speed_cv"]  # three rounds: their drift is measured and printed
    assert f"run-to-run speed CV {run:.3f} over 3 rounds: set latency.jitter_run_cv: " \
        f"{run:.3f} to replay" in r.stdout


def test_a_cv_above_what_a_scenario_takes_is_said_so() -> None:
    # a busy machine stalls the server now and then: the e2e run saw a CV of 1.061, which
    # latency.jitter_cv (< 1) refuses; the line must not tell the user to set it
    from kvsim.cli.calibrate import _jitter_line

    line = _jitter_line(1.061)
    assert line.startswith("step-time CV 1.061: at or above 1, more than latency.jitter_cv "
                           "takes")
    assert "set latency.jitter_cv: 1.061" not in line
    assert load_scenario("quickstart", ["latency.jitter_cv=0.99"]).latency.jitter_cv == 0.99
    assert _jitter_line(0.25).startswith("step-time CV 0.250: set latency.jitter_cv: 0.250")
    line = _jitter_line(1.061, 0.12)
    assert line.endswith("(latency.jitter_cv: 0.99, latency.jitter_prompt_cv: 0.120)")
    assert _jitter_line(0.3, 1.2).startswith(
        "step-time CV 0.300: set latency.jitter_cv: 0.300 and latency.jitter_prompt_cv: 0.99 "
        "(prompt steps measured 1.200) to replay")


def test_the_rounds_drift_is_printed_as_the_key_a_scenario_takes() -> None:
    from kvsim.cli.calibrate import _run_line

    line = _run_line(0.115, 6)
    assert line == ("run-to-run speed CV 0.115 over 6 rounds: set latency.jitter_run_cv: "
                    "0.115 to replay how far this machine's speed drifts between runs "
                    "(docs/scenarios.md, Timing noise)")
    assert load_scenario("quickstart", ["latency.jitter_run_cv=0.115"]).latency.jitter_run_cv \
        == 0.115
    assert "latency.jitter_run_cv: 0.99 " in _run_line(1.4, 3)
