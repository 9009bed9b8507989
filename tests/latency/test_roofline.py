"""Roofline latency: hand-computed decode time, exact KV bytes, numpy path == scalar path."""

import math

import numpy as np
import pytest

from kvsim.config.catalog import load_gpu, load_host, load_model
from kvsim.latency.base import BatchShape
from kvsim.latency.constant import ConstantLatency
from kvsim.latency.roofline import RooflineLatency
from kvsim.model.geometry import kv_geometry
from kvsim.model.weights import model_weights


def _roofline(model: str = "llama-3.1-8b", gpu: str = "rtx-4090", kv: str = "f16", **kw):
    m = load_model(model)
    return RooflineLatency(gpu=load_gpu(gpu), host=load_host("desktop-64gb"), model=m,
                           geometry=kv_geometry(m, kv, kv), weights=model_weights(m, "q4_k_m"),
                           **kw)


def test_single_decode_is_weights_plus_kv_over_bandwidth() -> None:
    """Batch 1 decode at 999 tokens of context: memory-bound, so
    t = overhead + (weights read + 1000 tokens × 131072 B) / (bandwidth × efficiency)."""
    r = _roofline(step_overhead_s=0.004)
    gpu = load_gpu("rtx-4090")
    w = model_weights(load_model("llama-3.1-8b"), "q4_k_m")
    weights_read = w.num_layers * w.per_layer_bytes + (w.non_repeating_bytes - w.embedding_bytes)
    expected = 0.004 + (weights_read + 1000 * 131072) / (
        gpu.memory_bandwidth_bytes_per_s * gpu.bandwidth_efficiency)
    assert r.step_time_s(BatchShape(decode_context=(999,))) == pytest.approx(expected, rel=1e-12)


def test_long_prefill_is_compute_bound_with_quadratic_attention() -> None:
    r = _roofline(step_overhead_s=0.0)
    m, gpu = load_model("llama-3.1-8b"), load_gpu("rtx-4090")
    n = 2048
    flops = 2 * m.params_active * n + 4 * m.num_attention_heads * m.head_dim * m.num_layers \
        * n * (n + 1) / 2
    expected = flops / (gpu.fp16_fp32acc_tensor_flops * gpu.compute_efficiency)
    assert r.step_time_s(BatchShape((n,), (0,))) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gemma-3-12b", "qwen3-next-80b-a3b"])
def test_kv_bytes_match_geometry_and_decode_stretch_matches_steps(model: str) -> None:
    r = _roofline(model, kv="q8_0")  # all three are in the catalogue: no skip
    assert r.geometry.model_name == model
    ns = np.array([0, 1, 17, 1023, 4096, 70000])
    assert r.kv_bytes(ns).tolist() == [r.geometry.bytes_for_tokens(int(n)) for n in ns]
    ctx = np.array([10, 500, 3000])
    fast = r.decode_steps_s(ctx, 64)
    slow = [r.step_time_s(BatchShape(decode_context=tuple(int(c) + j for c in ctx)))
            for j in range(64)]
    np.testing.assert_allclose(fast, slow, rtol=1e-12)


def test_quantized_kv_pays_dequant_and_offload_slows_decode() -> None:
    base = _roofline(kv="q8_0").step_time_s(BatchShape(decode_context=(8000,) * 8))
    deq = _roofline(kv="q8_0", kv_quantized=True).step_time_s(
        BatchShape(decode_context=(8000,) * 8))
    # Documented dequant cost (roofline.py docstring, DEFAULT_DEQUANT_FACTOR): 0.25 × the
    # KV read time, added outside the roofline max.  KV read: 8 sequences × (8000 + 1)
    # tokens × q8_0 Llama-3.1-8B 2·32·8·128 × 34/32 B = 69,632 B/token (engines.md §0:
    # 68 KiB), streamed at bandwidth × efficiency.
    gpu = load_gpu("rtx-4090")
    kv_read = 8 * 8001 * 69632
    expected_dequant = 0.25 * kv_read / (gpu.memory_bandwidth_bytes_per_s
                                         * gpu.bandwidth_efficiency)
    assert math.isclose(deq - base, expected_dequant, rel_tol=1e-12)
    # 16 of 32 layers on the CPU: each half of the weights and of the KV streams at
    # its own memory's bandwidth (the output head stays on the CPU with partial offload)
    off = _roofline(gpu_layers=16).step_time_s(BatchShape(decode_context=(99,)))
    host = load_host("desktop-64gb")
    w = model_weights(load_model("llama-3.1-8b"), "q4_k_m")
    head = w.non_repeating_bytes - w.embedding_bytes
    kv = 100 * 131072
    expected = 0.004 + (16 * w.per_layer_bytes + kv / 2) / (
        gpu.memory_bandwidth_bytes_per_s * gpu.bandwidth_efficiency) + (
        16 * w.per_layer_bytes + head + kv / 2) / host.memory_bandwidth_bytes_per_s
    assert off == pytest.approx(expected, rel=1e-12)


def test_constant_model() -> None:
    c = ConstantLatency(0.02, prefill_token_s=1e-4, decode_token_s=1e-3)
    assert c.step_time_s(BatchShape((100,), (0,), (5, 6))) == pytest.approx(0.02 + 0.01 + 0.002)
    assert c.decode_steps_s(np.array([1, 2, 3]), 4).tolist() == [0.023] * 4


def test_partial_offload_streams_the_head_where_the_budget_put_it() -> None:
    # qwen2.5-32b q4_k_m, 8k context, RTX 3060 12GB: llama.cpp --fit puts the output head
    # (471,033,446 B) and 32 of 64 layers (292,506,767 B each) on the GPU
    # (tests/model/test_budget.py); an explicit -ngl 32 leaves the head on the CPU.  The
    # model is dense (params_active == params_total): every byte is read per step.
    from kvsim.config.scenario import resolve_scenario
    from kvsim.latency.factory import make_latency_model
    from kvsim.model.budget import memory_budget

    head, layer = 471_033_446, 292_506_767
    for ngl, gpu_bytes, cpu_bytes in ((None, head + 32 * layer, 32 * layer),
                                      (32, 32 * layer, head + 32 * layer)):
        engine = {"preset": "llama.cpp", "context_tokens": 8192,
                  **({} if ngl is None else {"gpu_layers": ngl})}
        sc = resolve_scenario({"gpu": "rtx-3060-12gb", "model": "qwen2.5-32b",
                               "weights": "q4_k_m", "workload": {}, "engine": engine})
        b = memory_budget(sc.gpu, sc.model, sc.weights, sc.engine)
        r = make_latency_model(sc, b)
        assert b.gpu_layers == 32
        assert (r.gpu_weight_bytes, r.cpu_weight_bytes) == (gpu_bytes, cpu_bytes), ngl


def test_moe_experts_in_ram_are_read_and_computed_on_the_cpu() -> None:
    # Qwen3-30B-A3B q8_0 on an RTX 4090 at -c 32768: --fit puts the experts of m layers
    # in RAM (tests/model/test_budget.py).  A token reads 8/128 of those experts
    # (641,300,661 B a layer) from host memory; the GPU keeps the rest.
    from kvsim.config.scenario import resolve_scenario
    from kvsim.latency.factory import make_latency_model
    from kvsim.model.budget import memory_budget

    sc = resolve_scenario({"gpu": "rtx-4090", "model": "qwen3-30b-a3b", "weights": "q8_0",
                           "workload": {}, "engine": {"preset": "llama.cpp",
                                                      "context_tokens": 32768}})
    b = memory_budget(sc.gpu, sc.model, sc.weights, sc.engine)
    moe = make_latency_model(sc, b)
    all_gpu = make_latency_model(sc)
    assert b.cpu_expert_layers > 0 and moe.gpu_fraction == 1.0
    read = 8 / 128 * b.cpu_expert_layers * 641_300_661
    assert math.isclose(moe.cpu_weight_bytes, read, rel_tol=1e-12)
    assert math.isclose(all_gpu.gpu_weight_bytes - moe.gpu_weight_bytes, read, rel_tol=1e-9)
    step = BatchShape(decode_context=(4000,))
    assert moe.step_time_s(step) > all_gpu.step_time_s(step)
    # the stretch paths give the same floats as the scalar one
    assert moe.decode_steps_list((4000,), 3)[0] == moe.step_time_s(step)
    assert moe.decode_steps_s(np.array([4000]), 3)[0] == moe.step_time_s(step)
