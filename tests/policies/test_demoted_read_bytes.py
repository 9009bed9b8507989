"""Tokens a policy demoted (KIVI, recoverable eviction) are read at their quantized bytes
(docs/reference/kv-policies.md §2.1(b,c)): the step's KV read shrinks, the dequantization is charged
on the quantized bytes, and fast and step fidelity agree."""

from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from kvsim.config.catalog import load_gpu, load_host, load_model
from kvsim.core.step import StepPlan
from kvsim.latency.base import BatchShape
from kvsim.latency.roofline import RooflineLatency
from kvsim.model.geometry import kv_geometry
from kvsim.model.weights import model_weights
from kvsim.policies.blocks import QUANT
from tests.policies.helpers import doc_session, run, scenario


def _rtx4090(**kw) -> RooflineLatency:
    m = load_model("llama-3.1-8b")
    return RooflineLatency(gpu=load_gpu("rtx-4090"), host=load_host("desktop-64gb"), model=m,
                           geometry=kv_geometry(m, "f16", "f16"),
                           weights=model_weights(m, "q4_k_m"), **kw)


def test_roofline_reads_demoted_tokens_at_their_quantized_bytes() -> None:
    # Llama-3.1-8B q4_k_m on an RTX 4090 (by hand in tests/latency/test_roofline.py):
    # 4,616,334,272 B of weights a step, 856.8e9 B/s sustained, 4 ms overhead.  One
    # sequence decoding at 999 tokens of context reads 1000 f16 tokens x 131,072 B =
    # 131,072,000 B.  512 of them are KIVI-2 (G = 32): 2/8 + 4/32 = 3/8 B per value
    # against f16's 2, ratio 3/16: each reads 24,576 B and saves 131,072 x 13/16 =
    # 106,496 B, so 512 x 106,496 = 54,525,952 B saved:
    #   KV read 131,072,000 - 54,525,952 = 76,546,048 B (memory-bound, as the f16 step)
    #   t = 0.004 + (4,616,334,272 + 76,546,048) / 856.8e9 = 9.477218 ms (f16: 9.540857)
    r = _rtx4090(step_overhead_s=0.004)
    assert r.kv_read_token_bytes == 131_072 and r.dequant == 0.0  # f16 engine cache
    saved = 512 * 131_072 * 13 / 16
    assert saved == 54_525_952
    demoted = BatchShape(decode_context=(999,), kv_read_saved_bytes=saved)
    expected = 0.004 + 4_692_880_320 / 856.8e9
    assert expected == pytest.approx(9.477218e-3, rel=1e-7)
    assert r.step_time_s(demoted) == pytest.approx(expected, rel=1e-12)
    assert r.step_time_s(BatchShape(decode_context=(999,))) == pytest.approx(
        0.004 + 4_747_406_272 / 856.8e9, rel=1e-12)


@pytest.mark.parametrize("gpu_layers", [None, 16])
def test_decode_stretch_with_saved_bytes_matches_the_steps(gpu_layers) -> None:
    """Fast-forward's step times (numpy and scalar Python) take the same saved bytes
    off every step's read as step_time_s, GPU-only and with half the layers (and so
    half the saved bytes) on the CPU."""
    r = _rtx4090(gpu_layers=gpu_layers)
    ctx, saved = (3000, 700, 129), 2_000 * 106_496.0
    fast = r.decode_steps_s(np.array(ctx, dtype=np.int64), 20, saved)
    assert r.decode_steps_list(ctx, 20, saved) == fast.tolist()
    slow = [r.step_time_s(BatchShape(decode_context=tuple(c + j for c in ctx),
                                     kv_read_saved_bytes=saved)) for j in range(20)]
    np.testing.assert_allclose(fast, slow, rtol=1e-12)
    assert (fast < r.decode_steps_s(np.array(ctx, dtype=np.int64), 20)).all()


def test_kivi_plan_reads_less_and_pays_dequant_on_the_quantized_bytes() -> None:
    # Quickstart: Llama-3.1-8B on an RTX 4060 Ti 16GB under the spec-sheet roofline
    # (latency.rates=peak, so the arithmetic is by hand), 288 GB/s x 0.85 = 244.8e9 B/s,
    # f16 KV 131,072 B/token.  Tokens 0..1024 of slot 0 (2048 tokens) are KIVI-2:
    #   saved read   1024 x 131,072 x 13/16 = 109,051,904 B
    #   quantized    1024 x 131,072 x  3/16 =  25,165,824 B, dequantized at
    #                0.25 (kv_dequant_factor) x 25,165,824 / 244.8e9 = 25.7004 us
    # A memory-bound decode step of that slot is the f16 step minus 109,051,904 B at
    # 244.8e9 B/s (445.473 us), plus the 25.7004 us stall.
    from kvsim.api import scenario_budget
    from kvsim.core.build import PoolSizing, make_scheduler
    from kvsim.latency.factory import make_latency_model
    from kvsim.policies.build import wire_policies

    sc = scenario("policies=[{kind: kivi, bits: 2}]", "latency.rates=peak")
    b = scenario_budget(sc)
    lat = make_latency_model(sc, b)
    assert lat.gpu_fraction == 1.0 and lat.gpu_bytes_per_s == pytest.approx(244.8e9)
    sizing = PoolSizing.from_budget(b)
    rt = make_scheduler(sc.engine, sizing, link=sc.link, host=sc.host,
                        wiring=wire_policies(sc, sizing, lat)).policy
    assert rt.read_saved_per_token == Fraction(131_072 * 13, 16)
    slot = rt.slots[0]
    slot.cache, slot.n_tokens = [("s", 0, 2048)], 2048
    rt.slot_session[0] = "s"
    assert rt.ledger("s").mark("s", 0, 1024, QUANT, 2) == 1024
    req = SimpleNamespace(request_id="s-0", slot_id=0)
    f16 = StepPlan((SimpleNamespace(req=req),), BatchShape(decode_context=(2048,)))
    out = rt.after_schedule(f16, 0.0)
    assert out.batch.kv_read_saved_bytes == 109_051_904
    assert out.batch.decode_context == (2048,)
    assert out.extra_s == pytest.approx(6_291_456 / 244.8e9, rel=1e-12)
    assert rt.steady_extra_s(out) == out.extra_s  # steady: fast-forward may jump it
    dt = lat.step_time_s(out.batch) + out.extra_s
    assert lat.step_time_s(f16.batch) - dt == pytest.approx(
        (109_051_904 - 6_291_456) / 244.8e9, rel=1e-9)
    # a request in no slot reads at f16
    idle = StepPlan((SimpleNamespace(req=SimpleNamespace(request_id="x", slot_id=-1)),),
                    BatchShape(decode_context=(2048,)))
    assert rt.after_schedule(idle, 0.0).batch.kv_read_saved_bytes == 0.0


def test_kivi2_decodes_long_prompts_faster_than_f16() -> None:
    """The audit's direction: with fused dequant (factor 0) KIVI-2's inter-token latency
    on 3,400-token prompts is below f16's, and with the default 0.25 it still is
    (3/16 of the bytes x 1.25 < 1); fast and step fidelity agree on it."""
    def itl(*sets: str) -> float:
        _, res = run(*sets, sessions=[doc_session()])
        return float(res.requests["itl_mean_s"].mean())

    kivi = "policies=[{kind: kivi, bits: 2}]"
    f16 = itl()
    fused = itl(kivi, "latency.kv_dequant_factor=0")
    default = itl(kivi)
    assert fused < default < f16
    step = itl(kivi, "latency.kv_dequant_factor=0", "sim.fidelity=step")
    assert step == pytest.approx(fused, rel=1e-9)
