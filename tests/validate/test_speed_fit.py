"""kvsim.validate.fit: the vectorised fit prices rows exactly as kvsim validate does, and
recovers constants that generated the data."""
import math

import numpy as np
import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.latency.backend import load_constants
from kvsim.validate import fit as F
from kvsim.validate.lodo import leave_one_device_out
from kvsim.validate.predict import Setup, predicted_tps
from kvsim.validate.records import Measurement

GPUS = ("rtx-4090", "rtx-3090", "rtx-4080", "apple-m2-max-38c", "apple-m1-max-32c",
        "tesla-v100-pcie-16gb")  # the last: an MoE q8_0 prompt takes the host expert loop
MODELS = ("llama-2-7b", "qwen3-30b-a3b")


def _rows(constants=None):
    rows = []
    for gi, g in enumerate(GPUS):
        gpu = load_gpu(g)
        backend = "Metal" if g.startswith("apple") else "CUDA"
        for mi, m in enumerate(MODELS):
            fmt = ("q4_0", "f16", "q8_0", "q4_k_m")[(gi + mi) % 4]
            for metric, shape in (("pp_tps", dict(n_prompt=512)), ("tg_tps", dict(n_gen=16)),
                                  ("tg_tps", dict(n_gen=8, depth=4096, batch=4)),
                                  # 4-token graphs: the matrix-vector kernels' regime
                                  ("pp_tps", dict(n_prompt=64, n_ubatch=4))):
                # q4_k_m on CUDA: MMQ's Q4_0 prefill factor, or the fitted k-quant one where
                # the build predates MMQ (cublas, every other row): all paths must agree
                cublas = fmt == "q4_k_m" and len(rows) % 2 == 0
                meas = Measurement(id=f"{g}/{m}/{metric}/{len(rows)}", gpu=g, backend=backend,
                                   model=m, weight_format=fmt, metric=metric, value=1.0,
                                   flash_attn=bool(mi % 2), cublas_prompts=cublas, **shape)
                rows.append(F.make_row(meas, Setup(gpu, load_model(m), fmt, backend,
                                                   bool(mi % 2), cublas_prompts=cublas)))
    return rows


def test_vectorised_errors_equal_the_validate_path():
    rows = _rows()
    k = load_constants()
    space = F.FitSpace(rows, k)
    fast = F._Rows(rows, space).log_errors(space.vector(k))
    slow = F.log_errors(rows, space.constants(space.vector(k)))
    assert np.allclose(fast, slow, rtol=0, atol=1e-9)
    # and the validate path (predicted_tps through the roofline) says the same
    kq = [i for i, r in enumerate(rows) if r.setup.weight_format == "q4_k_m"
          and r.setup.backend == "CUDA" and r.m.metric == "pp_tps"]
    assert {rows[i].setup.cublas_prompts for i in kq} == {True, False}
    for i in [5, *kq]:
        r = rows[i]
        tps = predicted_tps(r.m, r.setup, space.constants(space.vector(k)))
        assert math.log(tps / r.m.value) == pytest.approx(slow[i], abs=1e-9)


def test_fit_recovers_the_constants_that_made_the_data():
    rows = _rows()
    truth = load_constants()
    made = [F.Row(r.m.__class__(**{**r.m.__dict__, "value": r.tokens / F.row_seconds(r, truth)}),
                  r.setup, r.parts, r.tokens) for r in rows]
    got = F.fit_constants(made, prior=truth.model_copy(update={"backends": {
        b: c.model_copy(update={"bw_eff": c.bw_eff * 1.5}) for b, c in truth.backends.items()}}))
    err = np.abs(F.log_errors(made, got))
    assert err.max() < 0.02        # every synthetic row reproduced within 2 %


def test_row_weights_give_a_long_sweep_less_weight_per_row():
    rows = _rows()
    w = F.row_weights(rows[:3] + [rows[1]] * 3)
    assert w[0] > w[1] and np.mean(w * w) == pytest.approx(1.0)


def test_leave_one_device_out_predicts_each_device_without_it(monkeypatch):
    rows = _rows()
    seen = []
    real = F.fit_constants

    def spy(train, **kw):
        seen.append({r.device for r in train})
        return real(train, **kw)

    monkeypatch.setattr(F, "fit_constants", spy)
    out = leave_one_device_out(rows, load_constants())
    assert set(out) == {r.m.id for r in rows}
    assert [len(s) for s in seen] == [len(GPUS) - 1] * len(GPUS)
    assert all(len(s | {g}) == len(GPUS) for s, g in zip(seen, sorted(GPUS)))
