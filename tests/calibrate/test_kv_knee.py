"""The calibrated model's KV knee: decode KV beyond ``kv_knee_tokens`` costs more per token.

Points are generated from known coefficients with a knee, so a fit must find it and
recover them; the measured points pinned below are a llama-server CPU calibration whose
four-slot point a straight line missed by 20 %.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.calibrate.fit import _solve, fit_points, knee_candidates
from kvsim.latency.artifact import (
    FEATURES,
    CalibrationArtifact,
    TimingPoint,
    point_features,
    save_artifact,
)
from kvsim.latency.base import BatchShape
from kvsim.latency.calibrated import CalibratedLatencyModel

C = {"step": 6e-4, "prefill_seq": 5e-3, "prefill_token": 2.6e-4, "decode_seq": 2.5e-4,
     "decode_kv": 6e-7, "decode_kv_spill": 1.5e-6}
STEPS = 63


def _decode_s(batch: int, ctx: int, knee: int) -> float:
    kv = batch * (ctx + np.arange(STEPS, dtype=float))
    return float((C["step"] + C["decode_seq"] * batch + C["decode_kv"] * kv
                  + C["decode_kv_spill"] * np.maximum(kv - knee, 0.0)).sum())


def _points(knee: int) -> list[TimingPoint]:
    pts = [TimingPoint(kind="prefill", cache_type="f16", batch=1, context=0, tokens=p,
                       measured_s=C["step"] + C["prefill_seq"] + C["prefill_token"] * p)
           for p in (16, 64, 256, 512)]
    pts += [TimingPoint(kind="decode", cache_type="f16", batch=b, context=c, steps=STEPS,
                        measured_s=_decode_s(b, c, knee))
            for b in (1, 2, 4) for c in (1, 256, 512)]
    return pts


def test_candidates_are_the_decode_points_own_sizes_inside_their_range() -> None:
    cands = knee_candidates(_points(1024))
    assert 1024 in cands and 2048 in cands  # 4 × 256 and 4 × 512 at their first step
    assert min(cands) > 1 and max(cands) < 4 * (512 + STEPS - 1)
    assert knee_candidates([p for p in _points(1024) if p.kind == "prefill"]) == []


def test_fit_finds_the_knee_and_recovers_the_coefficients() -> None:
    fit = fit_points(_points(1024))["f16"]
    assert fit.kv_knee_tokens == 1024 and fit.mape < 1e-9
    for k, v in C.items():
        assert fit.coefficients_s[k] == pytest.approx(v, rel=1e-6)
    assert fit.valid["decode_kv_spill"].max == 4 * (512 + STEPS - 1) - 1024


def test_points_a_straight_line_fits_get_no_knee() -> None:
    fit = fit_points(_points(10**9))["f16"]  # the knee beyond every step: no spill
    assert fit.kv_knee_tokens == 0 and fit.coefficients_s["decode_kv_spill"] == 0.0
    assert fit.mape < 1e-9


def test_a_knee_between_candidates_is_approached() -> None:
    pts = _points(900)
    fit = fit_points(pts)["f16"]
    assert 800 <= fit.kv_knee_tokens <= 1000 and fit.max_ape < 0.02
    t = np.array([p.measured_s for p in pts])
    x = np.array([point_features(p) for p in pts])
    assert (np.abs(x @ _line_coef(pts) - t) / t).max() > 5 * fit.max_ape


FIXTURE = Path(__file__).parent / "fixtures" / "llama_server_cpu_points.json"


def _measured() -> tuple[list[TimingPoint], int]:
    """The timing points of one llama-server CPU calibration (the fixture's ``about``)."""
    doc = json.loads(FIXTURE.read_text())
    return [TimingPoint(**p) for p in doc["points"]], doc["small_chunk_tokens"]


def _decode_ms(fit_coef: np.ndarray, knee: int, small: int, pt: TimingPoint) -> float:
    return float(point_features(pt, small, knee) @ fit_coef) / pt.steps * 1e3


def test_measured_four_slot_point_is_met_with_a_knee() -> None:
    """Four slots at 512 tokens measured 5.09 ms a step; the straight line through the
    calibration's points gives 4.05, the fit with its knee (880 tokens) 5.05."""
    pts, small = _measured()
    fit = fit_points(pts, small)["f16"]
    # NOTE: 880 here; a bounded search may land a token or two away on another platform
    assert 870 <= fit.kv_knee_tokens <= 890
    assert fit.mape == pytest.approx(0.041, abs=0.001)
    assert fit.max_ape == pytest.approx(0.112, abs=0.002)
    four = next(p for p in pts if p.kind == "decode" and (p.batch, p.context) == (4, 512))
    assert four.measured_s / four.steps * 1e3 == pytest.approx(5.09, abs=0.005)
    coef = np.array([fit.coefficients_s[n] for n in FEATURES])
    assert _decode_ms(coef, fit.kv_knee_tokens, small, four) == pytest.approx(5.05, abs=0.01)
    t = np.array([p.measured_s for p in pts])
    line = _solve(np.array([point_features(p, small) for p in pts]), t)[0]
    assert _decode_ms(line, 0, small, four) == pytest.approx(4.05, abs=0.005)


def test_noise_alone_earns_no_knee() -> None:
    """Points of a straight line with 4 % noise: a knee would lower the error a little,
    as any extra parameter does, but not by more than noise (the F test)."""
    rng = np.random.default_rng(7)
    pts = [p.model_copy(update={"measured_s": p.measured_s * float(rng.lognormal(0, 0.04))})
           for p in _points(10**9)]
    assert fit_points(pts)["f16"].kv_knee_tokens == 0
    noisy_knee = [p.model_copy(update={"measured_s": p.measured_s * float(rng.lognormal(0, 0.02))})
                  for p in _points(1024)]
    assert 700 <= fit_points(noisy_knee)["f16"].kv_knee_tokens <= 1300


def _line_coef(pts: list[TimingPoint]) -> np.ndarray:
    """The straight-line fit of ``pts`` (every decode step's KV at one cost): the fit
    without a knee."""
    t = np.array([p.measured_s for p in pts])
    return _solve(np.array([point_features(p) for p in pts]), t)[0]


def test_decode_stretch_agrees_with_step_time_across_knee_and_maximum() -> None:
    m = CalibratedLatencyModel(fit_points(_points(1024))["f16"])
    ctx = np.array([100, 400, 500, 560])  # crosses the knee, then the measured maximum
    fast = m.decode_steps_s(ctx, 80)
    slow = [m.step_time_s(BatchShape(decode_context=tuple(int(c) + j for c in ctx)))
            for j in range(80)]
    np.testing.assert_allclose(fast, slow, rtol=1e-12)
    assert m.clamped_steps == 2 * int((ctx[:, None] + np.arange(80) > 574).any(0).sum())
    kv = 100 + 400 + 500 + 560
    want = (C["step"] + C["decode_seq"] * 4 + C["decode_kv"] * kv
            + C["decode_kv_spill"] * (kv - 1024))
    assert fast[0] == pytest.approx(want, rel=1e-6)


def test_artifact_written_before_the_knee_loads_without_spill(tmp_path: Path) -> None:
    art = CalibrationArtifact(source="engine", device="test", model="m",
                              points=tuple(_points(1024)), fits=fit_points(_points(1024)))
    doc = json.loads(save_artifact(art, tmp_path / "new.json").read_text())
    for fit in doc["fits"].values():
        del fit["coefficients_s"]["decode_kv_spill"], fit["valid"]["decode_kv_spill"]
        del fit["kv_knee_tokens"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = CalibratedLatencyModel.from_path(tmp_path / "old.json")
    assert old.fit.kv_knee_tokens == 0 and old.fit.coefficients_s["decode_kv_spill"] == 0.0
    c = old.fit.coefficients_s
    want = c["step"] + c["decode_seq"] * 2 + c["decode_kv"] * 1060
    assert old.step_time_s(BatchShape(decode_context=(500, 560))) == pytest.approx(want)
