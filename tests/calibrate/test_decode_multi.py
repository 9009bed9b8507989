"""The calibrated model's multi-sequence decode step: a decode step of two or more
sequences pays ``decode_multi`` once (kvsim.latency.artifact.step_features).

Points generated with that cost must give it back; the measured points pinned below are
a llama-server CPU calibration of 2026-12-06 whose two-slot steps cost 2.8x a one-slot
step where a straight line in the sequences priced them 30 % short
(docs/design/timing-noise.md, "Two slots cost more than twice one").
"""

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.calibrate.fit import fit_points
from kvsim.latency.artifact import FEATURES, CalibrationArtifact, TimingPoint, save_artifact
from kvsim.latency.base import BatchShape
from kvsim.latency.calibrated import CalibratedLatencyModel

C = {"step": 4e-4, "prefill_seq": 5e-3, "prefill_token": 2e-4, "decode_seq": 2.5e-4,
     "decode_multi": 1.2e-3, "decode_kv": 1.3e-6}
STEPS = 63


def _decode_s(batch: int, ctx: int) -> float:
    kv = batch * (ctx + np.arange(STEPS, dtype=float))
    per_step = C["step"] + C["decode_seq"] * batch + C["decode_multi"] * (batch >= 2)
    return float((per_step + C["decode_kv"] * kv).sum())


def _points(batches: tuple[int, ...] = (1, 2, 4)) -> list[TimingPoint]:
    pts = [TimingPoint(kind="prefill", cache_type="f16", batch=1, context=0, tokens=p,
                       measured_s=C["step"] + C["prefill_seq"] + C["prefill_token"] * p)
           for p in (16, 64, 256, 512)]
    pts += [TimingPoint(kind="decode", cache_type="f16", batch=b, context=c, steps=STEPS,
                        measured_s=_decode_s(b, c))
            for b in batches for c in (1, 256, 512)]
    return pts


def test_fit_gives_back_the_multi_sequence_cost() -> None:
    fit = fit_points(_points())["f16"]
    assert fit.mape < 1e-9
    for name, value in C.items():
        assert fit.coefficients_s[name] == pytest.approx(value, rel=1e-6)
    assert (fit.valid["decode_multi"].min, fit.valid["decode_multi"].max) == (0.0, 1.0)


@pytest.mark.parametrize("contexts", [(300,), (300, 500), (100, 150, 200, 250)])
def test_a_step_pays_it_once_from_two_sequences_and_stretches_agree(contexts) -> None:
    m = CalibratedLatencyModel(fit_points(_points())["f16"])
    n = len(contexts)
    want = (C["step"] + C["decode_seq"] * n + C["decode_multi"] * (n >= 2)
            + C["decode_kv"] * sum(contexts))
    assert m.step_time_s(BatchShape(decode_context=contexts)) == pytest.approx(want, rel=1e-6)
    fast = m.decode_steps_s(np.array(contexts), 40)
    slow = [m.step_time_s(BatchShape(decode_context=tuple(c + j for c in contexts)))
            for j in range(40)]
    np.testing.assert_allclose(fast, slow, rtol=1e-12)


def test_a_grid_of_one_sequence_measures_no_multi_cost() -> None:
    """Decode points of one sequence say nothing about two: the feature's range is 0,
    a two-sequence step is priced without it and counted as outside the range."""
    fit = fit_points(_points(batches=(1,)))["f16"]
    assert fit.valid["decode_multi"].max == 0.0
    m = CalibratedLatencyModel(fit)
    m.step_time_s(BatchShape(decode_context=(300, 500)))
    assert m.clamped_steps == 1


def test_artifact_written_before_the_feature_loads_without_it(tmp_path: Path) -> None:
    art = CalibrationArtifact(source="engine", device="test", model="m",
                              points=tuple(_points()), fits=fit_points(_points()))
    doc = json.loads(save_artifact(art, tmp_path / "new.json").read_text())
    for fit in doc["fits"].values():
        del fit["coefficients_s"]["decode_multi"], fit["valid"]["decode_multi"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = CalibratedLatencyModel.from_path(tmp_path / "old.json")
    assert old.fit.coefficients_s["decode_multi"] == 0.0
    c = old.fit.coefficients_s
    want = c["step"] + c["decode_seq"] * 2 + c["decode_kv"] * 1060
    assert old.step_time_s(BatchShape(decode_context=(500, 560))) == pytest.approx(want)


MEASURED_MS = {(1, 1): 0.707, (1, 256): 1.068, (1, 512): 1.342, (2, 1): 2.105,
               (2, 256): 2.778, (2, 512): 3.332, (4, 1): 2.640, (4, 256): 4.098,
               (4, 512): 5.622}
"""Median decode step (ms) per (sequences, context) of six pooled llama-server CPU rounds
(tests/e2e/test_llama_server_slots.py's grid, 2026-12-06): two slots 3x one at context 1,
four only 25 % above two."""


def test_measured_two_slot_steps_are_met_with_the_multi_cost() -> None:
    pts = [TimingPoint(kind="decode", cache_type="f16", batch=b, context=c, steps=STEPS,
                       measured_s=ms / 1e3 * STEPS) for (b, c), ms in MEASURED_MS.items()]
    coef = fit_points(pts)["f16"].coefficients_s
    coef_line = _line_fit(pts)

    def step_ms(c: dict[str, float], b: int, ctx: int) -> float:
        x = {"step": 1.0, "decode_seq": b, "decode_multi": float(b >= 2), "decode_kv": b * ctx}
        return 1e3 * sum(c.get(k, 0.0) * v for k, v in x.items())

    assert coef["decode_multi"] > 1e-3
    # each point's middle step (context + 31) against its median step
    errors = {k: step_ms(coef, k[0], k[1] + 31) / ms - 1 for k, ms in MEASURED_MS.items()}
    line = {k: step_ms(coef_line, k[0], k[1] + 31) / ms - 1 for k, ms in MEASURED_MS.items()}
    assert max(abs(e) for e in errors.values()) < 0.12
    assert line[(2, 1)] < -0.25 and abs(errors[(2, 1)]) < 0.05


def _line_fit(pts: list[TimingPoint]) -> dict[str, float]:
    """The fit without the multi-sequence feature (its column left out)."""
    from kvsim.calibrate.fit import _solve
    from kvsim.latency.artifact import point_features

    keep = [i for i, n in enumerate(FEATURES) if n != "decode_multi"]
    x = np.array([point_features(p) for p in pts])[:, keep]
    coef, _ = _solve(x, np.array([p.measured_s for p in pts]))
    return {FEATURES[i]: float(v) for i, v in zip(keep, coef, strict=True)}
