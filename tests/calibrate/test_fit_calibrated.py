"""Fit recovery and the calibrated latency model's range behaviour.

Points are generated from known coefficients by hand-derived step sums, so a perfect
fit must recover them (MAPE 0) and predictions must equal the hand formula.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.calibrate.fit import fit_points
from kvsim.errors import InputError
from kvsim.latency.artifact import CalibrationArtifact, TimingPoint, load_artifact, save_artifact
from kvsim.latency.base import BatchShape
from kvsim.latency.calibrated import CalibratedLatencyModel

C = {"step": 0.01, "prefill_seq": 3e-3, "prefill_token": 2e-4, "prefill_attn": 1e-8, "decode_seq": 1e-3, "decode_kv": 2e-6}


def _decode_s(batch: int, ctx: int, steps: int) -> float:
    # Σ_j [c0 + c_seq·B + c_kv·B·(ctx + j)]
    return sum(C["step"] + C["decode_seq"] * batch + C["decode_kv"] * batch * (ctx + j)
               for j in range(steps))


def _prefill_s(batch: int, ctx: int, tokens: int) -> float:
    return (C["step"] + C["prefill_seq"] * batch + C["prefill_token"] * batch * tokens
            + C["prefill_attn"] * batch * tokens * (ctx + tokens / 2))


def _points() -> list[TimingPoint]:
    pts = []
    for b in (1, 2, 4):
        for ctx in (256, 512, 2048):
            pts.append(TimingPoint(kind="decode", cache_type="f16", batch=b, context=ctx,
                                   steps=3, measured_s=_decode_s(b, ctx, 3)))
            for p in (64, 256):
                pts.append(TimingPoint(kind="prefill", cache_type="f16", batch=b,
                                       context=ctx - p, tokens=p,
                                       measured_s=_prefill_s(b, ctx - p, p)))
    return pts


def _artifact() -> CalibrationArtifact:
    pts = _points()
    return CalibrationArtifact(source="kernels", device="cpu test", model="test",
                               points=tuple(pts), fits=fit_points(pts))


def test_fit_recovers_known_coefficients() -> None:
    fit = _artifact().fits["f16"]
    assert fit.mape < 1e-9
    for k, v in C.items():
        assert fit.coefficients_s[k] == pytest.approx(v, rel=1e-6)
    assert (fit.max_context, fit.max_batch) == (2050, 4)
    assert fit.valid["prefill_token"].max == 4 * 256
    assert fit.valid["decode_kv"].max == 4 * 2050


def test_step_time_in_range_matches_hand_formula() -> None:
    m = CalibratedLatencyModel(_artifact().fits["f16"])
    batch = BatchShape(prefill_tokens=(100,), prefill_context=(300,), decode_context=(500, 700))
    want = (C["step"] + C["prefill_seq"] + C["prefill_token"] * 100 + C["prefill_attn"] * 100 * 350
            + C["decode_seq"] * 2 + C["decode_kv"] * 1200)
    assert m.step_time_s(batch) == pytest.approx(want, rel=1e-9)
    assert m.clamped_steps == 0


def test_decode_steps_agree_with_step_time() -> None:
    m = CalibratedLatencyModel(_artifact().fits["f16"])
    ctx = np.array([100, 2000, 1500])
    fast = m.decode_steps_s(ctx, 120)  # crosses the 2050-token measured maximum
    slow = [m.step_time_s(BatchShape(decode_context=tuple(int(c) + j for c in ctx)))
            for j in range(120)]
    np.testing.assert_allclose(fast, slow, rtol=1e-12)


def test_out_of_range_clamps_and_counts() -> None:
    m = CalibratedLatencyModel(_artifact().fits["f16"])
    at_max = m.step_time_s(BatchShape(decode_context=(2050,)))
    assert m.clamped_steps == 0
    assert m.step_time_s(BatchShape(decode_context=(100_000,))) == at_max
    assert m.clamped_steps == 1
    m.decode_steps_s(np.array([2049]), 5)  # steps j=2..4 exceed 2050
    assert m.clamped_steps == 1 + 3
    assert m.provenance.endswith("MAPE 0.0%, 4 steps clamped)")


def test_out_of_range_refuses_when_asked() -> None:
    m = CalibratedLatencyModel(_artifact().fits["f16"], out_of_range="refuse")
    with pytest.raises(InputError, match="outside the calibrated range"):
        m.step_time_s(BatchShape(decode_context=(4096,)))
    with pytest.raises(InputError, match="outside the calibrated range"):
        m.decode_steps_s(np.array([2000]), 100)


def test_artifact_round_trip_and_bad_files(tmp_path: Path) -> None:
    path = save_artifact(_artifact(), tmp_path / "cpu__test.json")
    m = CalibratedLatencyModel.from_path(path)
    assert m.provenance.startswith("calibrated(cpu__test.json, f16, MAPE 0.0%")
    # the summary says where the times were measured (the scenario's GPU is not checked)
    assert m.provenance.endswith(f", measured on {_artifact().device})")
    with pytest.raises(InputError, match="not measured"):
        CalibratedLatencyModel.from_path(path, cache_type="q4_0")
    (tmp_path / "old.json").write_text('{"format_version": 0}')
    with pytest.raises(InputError, match="format_version"):
        load_artifact(tmp_path / "old.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        load_artifact(tmp_path / "bad.json")


# per-pair costs as measured on llama-server's CPU build (61 tokens on 495 cached ~48 ms,
# 64 tokens ~27 ms): 3.6e-7 s per pair from 64 query rows up, 8.6e-7 s below
SHORT = {"step": 3.5e-3, "prefill_seq": 0.0, "prefill_token": 2.1e-4, "prefill_attn": 3.6e-7,
         "prefill_attn_small": 8.6e-7}


def _short_chunk_points() -> list[TimingPoint]:
    pts = []
    for ctx in (0, 256, 1024):
        for p in (16, 32, 64, 256):
            per_pair = SHORT["prefill_attn_small" if p < 64 else "prefill_attn"]
            t = SHORT["step"] + SHORT["prefill_token"] * p + per_pair * p * (ctx + p / 2)
            pts.append(TimingPoint(kind="prefill", cache_type="f16", batch=1, context=ctx,
                                   tokens=p, measured_s=t))
        pts.append(TimingPoint(kind="decode", cache_type="f16", batch=1, context=ctx, steps=3,
                               measured_s=_decode_s(1, ctx, 3)))
    return pts


def test_short_prefill_chunks_get_their_own_attention_cost() -> None:
    """ggml's CPU flash attention runs a per-row path below 64 query rows: a fit split at
    64 recovers both per-pair costs; one without the split misses short prompts."""
    pts = _short_chunk_points()
    fit = fit_points(pts, small_chunk_tokens=64)["f16"]
    assert fit.mape < 1e-9 and fit.small_chunk_tokens == 64
    for k in ("prefill_attn", "prefill_attn_small", "prefill_token"):
        assert fit.coefficients_s[k] == pytest.approx(SHORT[k], rel=1e-6)
    assert fit.valid["prefill_attn_small"].max == 32 * (1024 + 16)
    m = CalibratedLatencyModel(fit)
    for p, per_pair in ((61, SHORT["prefill_attn_small"]), (64, SHORT["prefill_attn"])):
        want = SHORT["step"] + SHORT["prefill_token"] * p + per_pair * p * (495 + p / 2)
        got = m.step_time_s(BatchShape(prefill_tokens=(p,), prefill_context=(495,)))
        assert got == pytest.approx(want, rel=1e-9)
    one = CalibratedLatencyModel(fit_points(pts)["f16"])
    want_61 = SHORT["step"] + SHORT["prefill_token"] * 61 \
        + SHORT["prefill_attn_small"] * 61 * (495 + 30.5)
    assert one.step_time_s(BatchShape(prefill_tokens=(61,), prefill_context=(495,))) \
        < 0.8 * want_61


def test_artifact_written_before_the_split_loads_with_one_attention_cost(tmp_path: Path
                                                                           ) -> None:
    art = _artifact()
    path = save_artifact(art, tmp_path / "new.json")
    doc = json.loads(path.read_text())
    for fit in doc["fits"].values():
        del fit["coefficients_s"]["prefill_attn_small"], fit["valid"]["prefill_attn_small"]
        del fit["small_chunk_tokens"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = CalibratedLatencyModel.from_path(tmp_path / "old.json")
    batch = BatchShape(prefill_tokens=(20,), prefill_context=(300,), decode_context=(400,))
    want = (C["step"] + C["prefill_seq"] + C["prefill_token"] * 20 + C["prefill_attn"] * 20 * 310
            + C["decode_seq"] + C["decode_kv"] * 400)
    assert old.step_time_s(batch) == pytest.approx(want, rel=1e-9) and old.clamped_steps == 0


def test_a_kernel_artifact_of_another_model_is_refused(tmp_path: Path, capsys) -> None:
    from kvsim.api import simulate
    from kvsim.cli import main
    from kvsim.scenario import load_scenario

    kernels = save_artifact(_artifact().model_copy(update={"model": "llama-3.2-1b"}),
                            tmp_path / "k.json")
    sets = ["latency.kind=calibrated", f"latency.path={kernels}", "workload.max_sessions=1"]
    with pytest.raises(InputError) as exc:  # quickstart's model is llama-3.1-8b
        simulate(load_scenario("quickstart", sets))
    assert exc.value.field == "latency.path" and exc.value.value == str(kernels)
    assert "measured llama-3.2-1b's layers" in exc.value.allowed
    assert "model is llama-3.1-8b" in exc.value.allowed
    with pytest.raises(SystemExit) as code:
        main(["simulate", "quickstart", *(a for s in sets for a in ("--set", s)),
              "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code.value.code == 2 and err.count("\n") == 1 and "latency.path" in err
    assert not (tmp_path / "out").exists()
    # the same artifact for its own model runs; an engine artifact names the server's
    # model file, not a catalogue model, and is not checked
    ok = simulate(load_scenario("quickstart", [*sets, "model=llama-3.2-1b"]))
    assert ok.summary["requests"] > 0
    engine = save_artifact(_artifact().model_copy(update={"source": "engine",
                                                          "model": "model.gguf"}),
                           tmp_path / "e.json")
    sets[1] = f"latency.path={engine}"
    assert simulate(load_scenario("quickstart", sets)).summary["requests"] == \
        ok.summary["requests"]
