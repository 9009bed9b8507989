"""kvsim.validate.fit's second stage: ``c_dp4a`` is fitted on the dp4a path's rows alone
(Pascal quantized weights on CUDA), with every other constant held, so those rows change
nothing else the fit finds; a fold without them leaves it unfitted."""
import math

import numpy as np
import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.errors import InputError
from kvsim.latency.backend import load_constants
from kvsim.validate import fit as F
from kvsim.validate.predict import Setup
from kvsim.validate.records import Measurement

SHAPES = (("pp_tps", {"n_prompt": 512}), ("tg_tps", {"n_gen": 16}),
          ("pp_tps", {"n_prompt": 512, "n_ubatch": 64}))


def _rows(gpus, formats, backend="CUDA"):
    rows = []
    for g in gpus:
        for fmt in formats:
            for metric, shape in SHAPES:
                m = Measurement(id=f"{g}/{fmt}/{metric}/{len(rows)}", gpu=g, backend=backend,
                                model="llama-2-7b", weight_format=fmt, metric=metric,
                                value=1.0, flash_attn=True, **shape)
                rows.append(F.make_row(m, Setup(load_gpu(g), load_model("llama-2-7b"), fmt,
                                                backend, True)))
    return rows


def _made_by(rows, k):
    """The rows with the values ``k`` predicts for them."""
    return [F.Row(r.m.__class__(**{**r.m.__dict__, "value": r.tokens / F.row_seconds(r, k)}),
                  r.setup, r.parts, r.tokens) for r in rows]


@pytest.fixture(scope="module")
def truth():
    return load_constants().with_backend("CUDA", c_dp4a=1.7)


@pytest.fixture(scope="module")
def main_rows(truth):
    return _made_by(_rows(("rtx-4090", "rtx-3090", "rtx-4080"), ("q4_0", "f16")), truth)


@pytest.fixture(scope="module")
def dp4a_rows(truth):
    rows = _rows(("tesla-p40", "gtx-1080-ti"), ("q4_0", "q4_k_m"))
    assert all(F.on_dp4a(r) for r in rows)
    return _made_by(rows, truth)


def test_dp4a_rows_change_no_other_constant(main_rows, dp4a_rows):
    alone = F.fit_constants(main_rows)
    both = F.fit_constants(main_rows + dp4a_rows)
    assert alone.backends["CUDA"].c_dp4a == 0.0      # unfitted: backend.dp4a_weight's default
    assert both.backends["CUDA"].c_dp4a > 0.0
    assert both.backends["CUDA"].model_copy(update={"c_dp4a": 0.0}) == alone.backends["CUDA"]
    assert (both.format_pp, both.format_bw, both.classes, both.memory_bw) == \
        (alone.format_pp, alone.format_bw, alone.classes, alone.memory_bw)


def test_the_second_stage_recovers_the_c_dp4a_that_made_the_rows(truth, main_rows,
                                                                 dp4a_rows):
    # leaning on the truth without its c_dp4a: the first stage lands on the rest of it
    got = F.fit_constants(main_rows + dp4a_rows, prior=truth.with_backend("CUDA", c_dp4a=0.0))
    assert got.backends["CUDA"].c_dp4a == pytest.approx(1.7, rel=0.03)
    assert np.abs(F.log_errors(dp4a_rows, got)).max() < 0.02


def test_a_cards_own_calibration_reproduces_its_dp4a_rows(dp4a_rows):
    """``kvsim calibrate bench`` on a P40: its rows reach the first stage at the shipped
    constants' c_dp4a (here a wrong one), then the second refits it; the card's own
    rows come out as measured."""
    p40 = [r for r in dp4a_rows if r.device == "tesla-p40"]
    wrong = load_constants().with_backend("CUDA", c_dp4a=3.0)
    before = np.abs(F.log_errors(p40, wrong)).max()
    got = F.fit_constants(p40, prior=wrong)
    assert before > 0.1 and np.abs(F.log_errors(p40, got)).max() < 0.02
    assert got.backends["CUDA"].c_dp4a > 0


def test_dp4a_rows_alone_need_constants_to_lean_on(dp4a_rows):
    with pytest.raises(InputError, match="dp4a"):
        F.fit_constants(dp4a_rows)


def test_the_vectorised_price_of_a_dp4a_row_matches_the_validate_path(truth, dp4a_rows):
    """A calibration's first stage prices dp4a rows at the prior's c_dp4a, in arrays."""
    space = F.FitSpace(dp4a_rows, truth)
    fast = F._Rows(dp4a_rows, space).log_errors(space.vector(truth))
    slow = F.log_errors(dp4a_rows, space.constants(space.vector(truth)))
    assert np.allclose(fast, slow, rtol=0, atol=1e-9)
    assert np.abs(slow).max() < 1e-9 and math.isfinite(float(fast.sum()))
