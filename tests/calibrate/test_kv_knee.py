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


# A llama-server CPU calibration (tests/e2e build, tiny GGUF, -np 4, 4 rounds pooled,
# 2026-12-05): per-step decode time in ms by (slots, start context), 63 steps each.
MEASURED_MS = {(1, 1): 1.003, (1, 256): 1.180, (1, 512): 1.446,
               (2, 1): 1.195, (2, 256): 1.510, (2, 512): 2.433,
               (4, 1): 2.062, (4, 256): 2.692, (4, 512): 5.090}


def test_measured_four_slot_point_is_met_with_a_knee() -> None:
    pts = [TimingPoint(kind="decode", cache_type="f16", batch=b, context=c, steps=STEPS,
                       measured_s=ms * STEPS / 1e3) for (b, c), ms in MEASURED_MS.items()]
    fit = fit_points(pts)["f16"]
    m = CalibratedLatencyModel(fit)
    four = np.mean(m.decode_steps_s(np.full(4, 512.0), STEPS)) * 1e3
    assert fit.kv_knee_tokens > 0
    assert four == pytest.approx(MEASURED_MS[(4, 512)], rel=0.05)
    # the same points without the knee's column: the four-slot point is 20 % short
    line = CalibratedLatencyModel(fit.model_copy(update={
        "kv_knee_tokens": 0,
        "coefficients_s": dict(zip(FEATURES, map(float, _line_coef(pts)), strict=True))}))
    assert np.mean(line.decode_steps_s(np.full(4, 512.0), STEPS)) * 1e3 \
        < 0.85 * MEASURED_MS[(4, 512)]


def _line_coef(pts: list[TimingPoint]) -> np.ndarray:
    """The straight-line fit of ``pts`` (every decode step's KV at one cost): the fit
    without a knee."""
    t = np.array([p.measured_s for p in pts])
    return _solve(pts, t, 0, 0)[0]


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
