"""A calibration prompt longer than the server's ``n_ubatch`` ran as several graphs; its
point says so (``TimingPoint.ubatch_tokens``), the fit adds its graphs' features, and the
calibrated model — which prices a step the engine splits graph by graph — gives the
point back its measured time (docs/design/calibration.md, "several graphs")."""

import numpy as np
import pytest

from kvsim.calibrate.fit import fit_points
from kvsim.engines.llama_cpp import llama_ubatches
from kvsim.latency.artifact import FEATURES, TimingPoint, point_features, step_features
from kvsim.latency.base import BatchShape
from kvsim.latency.calibrated import CalibratedLatencyModel

TRUE = np.array([1e-3, 4e-3, 2e-4, 1e-8, 3e-8, 2e-4, 6e-4, 1e-7, 0.0])  # FEATURES order
SMALL = 64
UBATCH = 512


def _graphs(tokens: int, context: int) -> list[BatchShape]:
    """The graphs llama.cpp runs one prompt as (one slot, pieces of n_ubatch)."""
    out, done = [], 0
    for part in llama_ubatches([(0, tokens)], UBATCH, False):
        n = part[0][1]
        out.append(BatchShape((n,), (context + done,)))
        done += n
    return out


def _true_s(graphs: list[BatchShape]) -> float:
    return sum(float(step_features(np.array(g.prefill_tokens), np.array(g.prefill_context),
                                   np.array(g.decode_context), SMALL) @ TRUE) for g in graphs)


def _points(ubatch_tokens: int) -> list[TimingPoint]:
    pts = [TimingPoint(kind="prefill", cache_type="f16", batch=1, context=c, tokens=p,
                       measured_s=_true_s(_graphs(p, c)), ubatch_tokens=ubatch_tokens)
           for c in (0, 256, 512) for p in (16, 40, 64, 128, 256, 512, 768, 1280)]
    for b in (1, 2, 4):
        for c in (100, 1000):
            kv = b * (c + np.arange(30))
            t = 30 * (TRUE[0] + b * TRUE[5] + (b >= 2) * TRUE[6]) + TRUE[7] * kv.sum()
            pts.append(TimingPoint(kind="decode", cache_type="f16", batch=b, context=c,
                                   steps=30, measured_s=float(t)))
    return pts


def test_a_split_point_adds_its_graphs() -> None:
    pt = TimingPoint(kind="prefill", cache_type="f16", batch=1, context=0, tokens=1280,
                     measured_s=1.0, ubatch_tokens=512)
    f = point_features(pt, SMALL)
    # graphs of 512, 512 and 256 tokens: three constants and set-ups; the attention pairs
    # are the whole prompt's (512·256 + 512·768 + 256·1152 = 1280·640)
    assert f.tolist() == [3.0, 3.0, 1280.0, 1280 * 640.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    whole = point_features(pt.model_copy(update={"ubatch_tokens": 0}), SMALL)
    assert whole.tolist() == [1.0, 1.0, 1280.0, 1280 * 640.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # a prompt that fits one ubatch is one graph either way
    short = pt.model_copy(update={"tokens": 512})
    assert point_features(short, SMALL).tolist()[:2] == [1.0, 1.0]


def test_the_model_gives_a_split_point_its_measured_time() -> None:
    fit = fit_points(_points(UBATCH), SMALL)["f16"]
    assert [fit.coefficients_s[n] for n in FEATURES] == pytest.approx(TRUE.tolist(), rel=1e-6,
                                                                     abs=1e-12)
    model = CalibratedLatencyModel(fit)
    for tokens, context in ((1280, 0), (768, 512), (530, 256)):  # 530: a tail of 18
        graphs = _graphs(tokens, context)
        step = BatchShape((tokens,), (context,), ubatches=tuple(graphs))
        assert model.step_time_s(step) == pytest.approx(_true_s(graphs), rel=1e-9)


def test_fitted_as_one_graph_the_split_points_are_priced_off() -> None:
    """What the fit did before the points said how the server split them."""
    model = CalibratedLatencyModel(fit_points(_points(0), SMALL)["f16"])
    graphs = _graphs(1280, 0)
    priced = model.step_time_s(BatchShape((1280,), (0,), ubatches=tuple(graphs)))
    assert abs(priced / _true_s(graphs) - 1) > 0.01


@pytest.mark.parametrize(("batch", "tokens"), [(1, 1280), (2, 700), (4, 530), (3, 400)])
def test_a_points_graphs_are_llama_cpps_split(batch: int, tokens: int) -> None:
    """The point's graphs are the ubatches llama.cpp cuts ``batch`` equal prompts on
    slots 0..batch-1 into."""
    pt = TimingPoint(kind="prefill", cache_type="f16", batch=batch, context=64,
                     tokens=tokens, measured_s=1.0, ubatch_tokens=UBATCH)
    want = np.zeros(len(FEATURES))
    done = [0] * batch
    for part in llama_ubatches([(i, tokens) for i in range(batch)], UBATCH, False):
        ctx = [64 + done[i] for i, _ in part]
        want += step_features(np.array([n for _, n in part], dtype=float),
                              np.array(ctx, dtype=float), np.empty(0), SMALL)
        for i, n in part:
            done[i] += n
    assert point_features(pt, SMALL).tolist() == pytest.approx(want.tolist(), rel=1e-12)
