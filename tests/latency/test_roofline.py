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


# Llama-3.1-8B q4_k_m on an RTX 4090, by hand:
#   layer  (8.03e9 - 2 x 128,256 x 4,096) / 32 = 218,103,964 params in llama-quantize's
#          Q4_K_M mix: all Q4_K (4.5 bpw, 0.5625 B) = 122,683,479.75 B, and attn_v (4,096 x
#          1,024 = 4,194,304) and ffn_down (a third of the 176,160,924 beyond Q/K/V/O,
#          58,720,308) Q6_K (6.5625 bpw, +2.0625) in the 16 "more bits" layers of 32:
#          (4,194,304 + 58,720,308) / 2 x 2.0625 / 8 = 8,110,086.70 -> 130,793,566 B
#          (WeightSplit.per_layer_bytes); output head Q6_K 525,336,576 x 0.8203125
#          = 430,940,160 B (WeightSplit.head_bytes)
#   read per step (the token embedding is a row lookup, not streamed):
#          32 x 130,793,566 + 430,940,160 = 4,616,334,272 B
#   sustained bandwidth 1008 GB/s (docs/reference/gpus.csv) x 0.85 (GpuSpec default;
# docs/reference/hardware-and-models.md          §1: sustained is 80-92 % of peak) = 856.8e9 B/s
#   tensor FLOP/s 165.2e12 (docs/reference/gpus.csv FP16 dense, FP32 accumulate) x 0.5 = 82.6e12
LAYER_Q4, HEAD_Q4 = 130_793_566, 430_940_160
WEIGHTS_READ = 4_616_334_272
GPU_BPS = 856.8e9
GPU_FLOPS = 82.6e12


def test_single_decode_is_weights_plus_kv_over_bandwidth() -> None:
    """Batch 1 decode at 999 tokens of context: memory-bound, so
    t = overhead + (weights read + 1000 tokens × 131072 B) / (bandwidth × efficiency)."""
    r = _roofline(step_overhead_s=0.004)
    assert WEIGHTS_READ == 32 * LAYER_Q4 + HEAD_Q4
    assert r.gpu_weight_bytes == WEIGHTS_READ
    # KV 1000 x 131,072 = 131,072,000 B; (4,616,334,272 + 131,072,000) / 856.8e9 = 5.5409 ms
    # (compute: (2 x 8.03e9 + 32 x 1000 x 16,384) / 82.6e12 = 0.20 ms, below it)
    expected = 0.004 + 4_747_406_272 / 856.8e9
    assert expected == pytest.approx(0.0095408570, rel=1e-8)
    assert r.step_time_s(BatchShape(decode_context=(999,))) == pytest.approx(expected, rel=1e-12)


def test_long_prefill_is_compute_bound_with_quadratic_attention() -> None:
    r = _roofline(step_overhead_s=0.0)
    # 2048 tokens from empty.  Linear FLOPs skip the token embedding (a row lookup) and
    # run the output head for the one sampled position only (roofline.py docstring:
    # llama.cpp inp_out_ids / vLLM logits_indices); embedding = head = 128,256 x 4,096
    # = 525,336,576 params:
    #   layers 2 x (8.03e9 - 2 x 525,336,576) = 13,958,653,696 per token
    #          x 2048 = 28,587,322,769,408; head 2 x 525,336,576 = 1,050,673,152 once;
    # attention 4 x 32 heads x 128 x 32 layers = 524,288 FLOPs per pair,
    #   2048 x 2049 / 2 = 2,098,176 pairs -> 1,100,048,498,688 FLOPs
    # total 29,688,421,941,248 / 82.6e12 = 0.35942 s (memory: (4,616,334,272 + 2048 x
    # 131,072) / 856.8e9 = 5.7 ms, below it)
    flops = 28_587_322_769_408 + 1_050_673_152 + 1_100_048_498_688
    assert flops == 29_688_421_941_248
    expected = flops / GPU_FLOPS
    assert expected == pytest.approx(0.35942399, rel=1e-7)
    assert r.step_time_s(BatchShape((2048,), (0,))) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gemma-3-12b", "qwen3-next-80b-a3b"])
def test_kv_bytes_match_geometry_and_decode_stretch_matches_steps(model: str) -> None:
    r = _roofline(model, kv="q8_0")  # all three are in the catalogue: no skip
    assert r.geometry.model_name == model
    ns = np.array([0, 1, 17, 1023, 4096, 70000])
    assert r.geometry.bytes_for_token_array(ns).tolist() == [r.geometry.bytes_for_tokens(int(n)) for n in ns]
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
    # tokens × q8_0 Llama-3.1-8B 2·32·8·128 × 34/32 B = 69,632 B/token (docs/reference/engines.md
    # §0: 68 KiB) = 4,457,005,056 B, streamed at 856.8e9 B/s:
    # 0.25 x 4,457,005,056 / 856.8e9 = 1,114,251,264 / 856.8e9 = 1.30048 ms
    expected_dequant = 1_114_251_264 / GPU_BPS
    assert expected_dequant == pytest.approx(1.30048e-3, rel=1e-6)
    assert math.isclose(deq - base, expected_dequant, rel_tol=1e-12)
    # 16 of 32 layers on the CPU: each half of the weights and of the KV streams at
    # its own memory's bandwidth (the output head stays on the CPU with partial offload).
    # f16 KV of 100 tokens = 13,107,200 B, half on each side (6,553,600 B):
    #   GPU 16 x 130,793,566 + 6,553,600 = 2,099,250,656 B at 856.8e9 B/s  =  2.4501 ms
    #   CPU 16 x 130,793,566 + 430,940,160 + 6,553,600 = 2,530,190,816 B at 89.6e9 B/s
    #       (desktop-64gb: 2 ch x 8 B x 5600 MT/s)                      = 28.2387 ms
    #   (CPU compute: 0.5 x (2 x 8.03e9 + 32 x 100 x 16,384) / 0.5e12 = 16.1 ms, below it)
    off = _roofline(gpu_layers=16).step_time_s(BatchShape(decode_context=(99,)))
    assert 2_099_250_656 == 16 * LAYER_Q4 + 6_553_600
    assert 2_530_190_816 == 16 * LAYER_Q4 + HEAD_Q4 + 6_553_600
    expected = 0.004 + 2_099_250_656 / GPU_BPS + 2_530_190_816 / 89.6e9
    assert expected == pytest.approx(0.03468884, rel=1e-7)
    assert off == pytest.approx(expected, rel=1e-12)


def test_constant_model() -> None:
    c = ConstantLatency(0.02, prefill_token_s=1e-4, decode_token_s=1e-3)
    assert c.step_time_s(BatchShape((100,), (0,), (5, 6))) == pytest.approx(0.02 + 0.01 + 0.002)
    assert c.decode_steps_s(np.array([1, 2, 3]), 4).tolist() == [0.023] * 4


def test_partial_offload_streams_the_head_where_the_budget_put_it() -> None:
    # qwen2.5-32b q4_k_m, 8k context, RTX 3060 12GB: llama.cpp --fit puts the output head
    # and 31 of 64 layers on the GPU (tests/model/test_budget.py); an explicit -ngl 31
    # leaves the head on the CPU.  The model is dense (params_active == params_total):
    # every byte is read per step.  In llama-quantize's Q4_K_M mix:
    #   head Q6_K 152,064 x 5,120 = 778,567,680 params x 0.8203125 B = 638,668,800 B
    #   layer (32.5e9 - 2 x 778,567,680) / 64 = 483,482,260 params, all Q4_K x 0.5625 B
    #   = 271,958,771.25 B, + Q6_K (+2.0625 bpw) attn_v (5,120 x 1,024 = 5,242,880) and
    #   ffn_down (a third of the 420,567,700 beyond Q/K/V/O, 140,189,233.3; rows 27,648 =
    #   108 x 256) in the 32 "more bits" layers of 64: (5,242,880 + 140,189,233.3) / 2
    #   x 2.0625 / 8 = 18,747,108.36 -> 290,705,879 B
    from kvsim.engines.budget import memory_budget
    from kvsim.latency.factory import make_latency_model
    from kvsim.scenario import resolve_scenario

    head, layer = 638_668_800, 290_705_879
    for ngl, gpu_bytes, cpu_bytes in ((None, head + 31 * layer, 33 * layer),
                                      (31, 31 * layer, head + 33 * layer)):
        engine = {"preset": "llama.cpp", "ctx_size": 8192,
                  **({} if ngl is None else {"gpu_layers": ngl})}
        sc = resolve_scenario({"gpu": "rtx-3060-12gb", "model": "qwen2.5-32b",
                               "weights": "q4_k_m", "workload": {}, "engine": engine})
        b = memory_budget(sc.gpu, sc.model, sc.weights, sc.engine)
        r = make_latency_model(sc, b)
        assert b.gpu_layers == 31
        assert (r.gpu_weight_bytes, r.cpu_weight_bytes) == (gpu_bytes, cpu_bytes), ngl


def test_moe_experts_in_ram_are_read_and_computed_on_the_cpu() -> None:
    # Qwen3-30B-A3B q8_0 on an RTX 4090 at -c 32768: --fit puts the experts of m layers
    # in RAM (tests/model/test_budget.py).  A token reads 8/128 of those experts
    # (641,300,661 B a layer) from host memory; the GPU keeps the rest.
    from kvsim.engines.budget import memory_budget
    from kvsim.latency.factory import make_latency_model
    from kvsim.scenario import resolve_scenario

    sc = resolve_scenario({"gpu": "rtx-4090", "model": "qwen3-30b-a3b", "weights": "q8_0",
                           "workload": {}, "engine": {"preset": "llama.cpp",
                                                      "ctx_size": 32768}})
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


def test_a_step_of_several_graphs_pays_each_graphs_overhead_and_weights() -> None:
    """llama.cpp runs decoding slots 0 and 2 on per-slot streams as two ubatches
    (kvsim.engines.llama_cpp.llama_ubatches): each reads every weight.  One decode at 999
    tokens is 9.5408570 ms (test above); as one graph two of them read the weights once:
    0.004 + (4,616,334,272 + 2 x 131,072,000) / 856.8e9 = 9.6938 ms; as two graphs
    2 x 9.5408570 = 19.0817 ms."""
    r = _roofline(step_overhead_s=0.004)
    one = BatchShape(decode_context=(999, 999))
    two = BatchShape(decode_context=(999, 999), ubatches=(BatchShape(decode_context=(999,)),
                                                          BatchShape(decode_context=(999,))))
    assert r.step_time_s(one) == pytest.approx(0.004 + 4_878_478_272 / GPU_BPS, rel=1e-12)
    assert r.step_time_s(two) == pytest.approx(2 * 0.0095408570, rel=1e-8)


def test_a_prompt_split_over_graphs_samples_once_at_its_end() -> None:
    """A decode beside a 2048-token prompt on per-slot streams: graph 1 is the decode and
    the prompt's first token, graph 2 the prompt's other 2047 tokens, which end the prompt
    and sample its first answer token (the output head runs there, not in graph 1).
      graph 1, memory-bound: 0.004 + (4,616,334,272 + 1000 x 131,072 + 1 x 131,072) B
               / 856.8e9 = 9.5410100 ms
      graph 2, compute-bound: layers 2047 x 13,958,653,696 = 28,573,364,115,712, head
               1,050,673,152, attention 524,288 x (2047 x 1 + 2047 x 2048 / 2)
               = 524,288 x 2,098,175 = 1,100,047,974,400: 29,674,462,763,264 / 82.6e12
               = 359.255 ms; + 4 ms overhead"""
    r = _roofline(step_overhead_s=0.004)
    step = BatchShape((2048,), (0,), (999,), ubatches=(BatchShape((1,), (0,), (999,)),
                                                       BatchShape((2047,), (1,))))
    g1 = 0.004 + (4_616_334_272 + 1000 * 131_072 + 131_072) / GPU_BPS
    assert g1 == pytest.approx(0.0095410100, rel=1e-8)
    flops = 28_573_364_115_712 + 1_050_673_152 + 1_100_047_974_400
    assert flops == 29_674_462_763_264
    assert r.step_time_s(step) == pytest.approx(g1 + 0.004 + flops / GPU_FLOPS, rel=1e-12)


def test_the_step_overhead_follows_the_engines_graph_capture() -> None:
    """llama.cpp replays only one-token steps as CUDA graphs; vLLM captures up to 512
    tokens: a two-sequence decode step pays the launched overhead on the first only,
    and the numpy, list and scalar paths agree."""
    from kvsim.latency.roofline import GpuRates

    rates = GpuRates(82.6e12, 82.6e12, 856.8e9, 856.8e9, 0.001, overhead_batch_s=0.003)
    one, two = BatchShape(decode_context=(999,)), BatchShape(decode_context=(999, 999))
    cpp = _roofline(rates=rates)
    vllm = _roofline(rates=rates, graph_max_tokens=512)
    # the same work, overheads 1 ms (graph) and 3 ms (launched)
    assert cpp.step_time_s(two) - vllm.step_time_s(two) == pytest.approx(0.002, rel=1e-9)
    assert cpp.step_time_s(one) == vllm.step_time_s(one)
    assert cpp.step_time_s(one) - cpp.overhead(1) == pytest.approx(
        vllm.step_time_s(one) - 0.001, rel=1e-12)
    for r in (cpp, vllm):
        for ctx in ([999], [999, 999]):
            steps = r.decode_steps_s(np.array(ctx), 3)
            assert list(steps) == r.decode_steps_list(ctx, 3)
            assert steps[0] == r.step_time_s(BatchShape(decode_context=tuple(ctx)))


def test_a_decode_step_adds_compute_to_memory_where_the_rates_say_so() -> None:
    """The backend model prices a decode-only step as compute + memory (matrix-vector
    kernels near their ridge point); a prefill step stays the larger of the two; the
    numpy, list and scalar decode paths agree."""
    from kvsim.latency.roofline import GpuRates

    kw = dict(linear_flops_per_s=82.6e12, attention_flops_per_s=82.6e12,
              weight_bytes_per_s=856.8e9, kv_bytes_per_s=856.8e9, overhead_s=0.0)
    overlap, adds = _roofline(rates=GpuRates(**kw)), _roofline(rates=GpuRates(**kw,
                                                                      decode_adds=True))
    dec = BatchShape(decode_context=(999,))
    # the first test's step: memory 4,747,406,272 B / 856.8e9 = 5.54086 ms; compute
    # layers 2 x (8.03e9 - 2 x 525,336,576) = 13,958,653,696, head 2 x 525,336,576
    # = 1,050,673,152, attention 32 x 1000 pairs x 16,384 = 524,288,000:
    #   15,533,614,848 FLOPs / 82.6e12 = 0.188058 ms
    memory, compute = 4_747_406_272 / 856.8e9, 15_533_614_848 / 82.6e12
    assert overlap.step_time_s(dec) == pytest.approx(memory, rel=1e-12)
    assert adds.step_time_s(dec) == pytest.approx(memory + compute, rel=1e-12)
    pre = BatchShape(prefill_tokens=(512,), prefill_context=(0,))
    assert adds.step_time_s(pre) == overlap.step_time_s(pre)
    for ctx in ([999], [10, 500, 999]):
        steps = adds.decode_steps_s(np.array(ctx), 4)
        assert list(steps) == adds.decode_steps_list(ctx, 4)
        assert steps[0] == adds.step_time_s(BatchShape(decode_context=tuple(ctx)))


def test_steps_of_few_tokens_run_matrix_vector_kernels_where_the_rates_say_so() -> None:
    """GpuRates.small_flops_per_s: a step of 2 to ``small_tokens`` tokens, a prompt
    chunk or a decode of several sequences, multiplies all but one column's FLOPs at that
    rate and its time adds to the weight read, with no tile re-reads (llama.cpp's
    matrix-vector kernels up to 8 columns); one token more takes the tiled path; the
    decode paths agree."""
    from kvsim.latency.roofline import GpuRates

    kw = dict(linear_flops_per_s=82.6e12, attention_flops_per_s=82.6e12,
              weight_bytes_per_s=856.8e9, kv_bytes_per_s=856.8e9, overhead_s=0.0,
              decode_adds=True, reread_s_per_byte_token=1e-15)
    tiled = _roofline(rates=GpuRates(**kw))
    mv = _roofline(rates=GpuRates(**kw, small_flops_per_s=20e12, small_tokens=8))
    eight = BatchShape(prefill_tokens=(8,), prefill_context=(0,))
    lin, att, w, kv = mv.gpu_parts(eight)
    # the first column's work hides in the weight read, as a one-token step's does
    assert mv.step_time_s(eight) == pytest.approx(
        lin * 7 / 8 / 20e12 + att / 82.6e12 + w / 856.8e9 + kv / 856.8e9, rel=1e-12)
    assert tiled.step_time_s(eight) == pytest.approx(
        max(lin / 82.6e12 + att / 82.6e12 + 1e-15 * 8 * w, w / 856.8e9 + kv / 856.8e9),
        rel=1e-12)
    nine = BatchShape(prefill_tokens=(9,), prefill_context=(0,))
    assert mv.step_time_s(nine) == tiled.step_time_s(nine)
    # ~5 ms of matrix-vector work on top of the ~5.5 ms weight read at 8 tokens
    assert mv.step_time_s(eight) - tiled.step_time_s(eight) == pytest.approx(
        lin * 7 / 8 / 20e12 + att / 82.6e12, rel=1e-9)
    for ctx in ([999], [10, 500, 999], list(range(100, 1000, 100))):
        steps = mv.decode_steps_s(np.array(ctx), 4)
        assert list(steps) == mv.decode_steps_list(ctx, 4)
        assert steps[0] == mv.step_time_s(BatchShape(decode_context=tuple(ctx)))
        small = 1 < len(ctx) <= 8          # one token: its work hides in the weight read
        assert (steps[0] > tiled.step_time_s(BatchShape(decode_context=tuple(ctx)))) == small


def test_a_tiled_step_pays_its_per_tile_work_once() -> None:
    """GpuRates.tile_tokens: a step on the tiled path (more than ``small_tokens``
    tokens) prices its linear FLOPs as if it had that many tokens more per 128-token
    tile (TILE_TOKENS_MAX); the matrix-vector steps and a one-token decode do not; the
    decode paths agree."""
    from kvsim.latency.roofline import GpuRates

    kw = dict(linear_flops_per_s=82.6e12, attention_flops_per_s=82.6e12,
              weight_bytes_per_s=856.8e9, kv_bytes_per_s=856.8e9, overhead_s=0.0,
              decode_adds=True, small_flops_per_s=20e12, small_tokens=8)
    plain, tiled = _roofline(rates=GpuRates(**kw)), _roofline(rates=GpuRates(**kw,
                                                                       tile_tokens=64.0))
    for n, tiles in ((16, 1), (128, 1), (129, 2), (512, 4)):
        b = BatchShape(prefill_tokens=(n,), prefill_context=(0,))
        lin, att, w, kv = tiled.gpu_parts(b)
        assert tiled.step_time_s(b) == pytest.approx(
            max(lin / 82.6e12 * (1 + 64 * tiles / n) + att / 82.6e12,
                w / 856.8e9 + kv / 856.8e9), rel=1e-12)
    for ctx in ([999], [10, 500, 999], list(range(100, 1700, 100))):
        steps = tiled.decode_steps_s(np.array(ctx), 3)
        assert list(steps) == tiled.decode_steps_list(ctx, 3)
        assert steps[0] == tiled.step_time_s(BatchShape(decode_context=tuple(ctx)))
        dec = BatchShape(decode_context=tuple(ctx))
        assert (tiled.step_time_s(dec) > plain.step_time_s(dec)) == (len(ctx) > 8)


def test_the_linear_terms_of_each_regime() -> None:
    """kvsim.latency.rates.linear_terms: (rate, factor, matrix-vector) by the docstring's
    formulas — one token and the plain roofline untouched, 2-8 tokens at the vector rate
    less the first column, above that the matmul rate with a tile's set-up per 128
    tokens — and times_add says which steps add compute to memory."""
    from kvsim.latency.rates import linear_terms, times_add
    from kvsim.latency.roofline import GpuRates

    plain = GpuRates(8e13, 8e13, 9e11, 9e11, 0.0)
    both = GpuRates(8e13, 8e13, 9e11, 9e11, 0.0, decode_adds=True, small_flops_per_s=2e13,
                    small_tokens=8, tile_tokens=30.0)
    for t in (1, 2, 9, 512):
        assert linear_terms(plain, t) == (8e13, 1.0, False)
        assert not times_add(plain, t, False) and not times_add(plain, t, True)
    assert linear_terms(both, 1) == (8e13, 1.0, False)
    assert [linear_terms(both, t) for t in (2, 8)] == [(2e13, 0.5, True), (2e13, 7 / 8, True)]
    assert [linear_terms(both, t)[1] for t in (9, 128, 129, 512)] == \
        [1 + 30 / 9, 1 + 30 / 128, 1 + 60 / 129, 1 + 120 / 512]
    assert [times_add(both, t, False) for t in (1, 2, 8, 9)] == [False, True, True, False]
    assert times_add(both, 9, True)
