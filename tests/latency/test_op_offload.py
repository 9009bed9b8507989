"""llama.cpp op offload (kvsim.latency.offload): hand-derived step times on a toy box.

Toy model, GPU and host, chosen so every number is round:

- model: 4 layers, 8 heads × 128, 2 KV heads, params 4.5e9 (dense), vocab 1,000 ×
  hidden 1,024: token embedding and output head 1,024,000 params each → linear FLOPs
  2 × (4.5e9 − 2,048,000) = 8,995,904,000 per token (the embedding is a lookup) plus the
  head's 2,048,000 per sampled sequence (a decode token: 8,997,952,000 in all); attention 4 · 8 · 128 = 4,096 FLOPs per query-key pair per layer; f16 KV
  4 layers × 2 heads × (128 + 128) × 2 B = 4,096 B per token;
- weights (q8-like, 8 bpw): 1e9 B per layer, output head 0.5e9 B (on the GPU), token
  embedding 0.25e9 B (never streamed);
- GPU: 200e12 tensor FLOP/s × 0.5 = 100e12 FLOP/s, 1e12 B/s × 1.0;
- host: 100e9 B/s, 1e12 FLOP/s; link: 20e9 B/s for the weight upload;
- 2 of 4 layers on the GPU: GPU weights 2 × 1e9 + 0.5e9 = 2.5e9 B, host 2e9 B;
  step overhead 1 ms; n_ubatch 512, minimum offload batch 32.
"""

import numpy as np
import pytest

from kvsim.config.specs import GpuSpec, HostSpec, LayerGroup, ModelSpec
from kvsim.latency.base import BatchShape
from kvsim.latency.offload import OpOffload, op_offload_for, ubatch_split
from kvsim.latency.rates import experts_used_fraction
from kvsim.latency.roofline import RooflineLatency
from kvsim.model.geometry import kv_geometry
from kvsim.model.weights import WeightSplit

GPU = GpuSpec(name="toy-gpu", display_name="toy", vendor="x", segment="x", memory_bytes=2**34,
              memory_bandwidth_bytes_per_s=1e12, fp16_tensor_flops=400e12,
              fp16_fp32acc_tensor_flops=200e12, bandwidth_efficiency=1.0,
              compute_efficiency=0.5, source="test")
HOST = HostSpec(name="toy-host", display_name="toy", memory_bytes=2**36,
                memory_bandwidth_bytes_per_s=100e9, cpu_flops=1e12, source="test")
LINK = OpOffload(link_bytes_per_s=20e9, ubatch_tokens=512, min_batch_tokens=32)


def _model(active: float = 4.5e9, experts: tuple[int, int] | None = None) -> ModelSpec:
    moe = {} if experts is None else {"num_experts": experts[0],
                                      "num_experts_active": experts[1]}
    return ModelSpec(name="toy", display_name="toy", params_total=4.5e9, params_active=active,
                     num_layers=4, hidden_size=1024, num_attention_heads=8, num_kv_heads=2,
                     head_dim=128, vocab_size=1000, max_context_tokens=65536,
                     layer_groups=(LayerGroup(kind="full", layers=4, n_kv_heads=2,
                                              head_dim_k=128, head_dim_v=128),),
                     source="test", **moe)


def _toy(gpu_layers: int = 2, op_offload: OpOffload | None = LINK, model: ModelSpec | None = None,
         expert_bytes: int = 0, **kw) -> RooflineLatency:
    m = model or _model()
    w = WeightSplit(format="q8_0", bits_per_weight=8.0, total_bytes=4_750_000_000,
                    per_layer_bytes=1_000_000_000, non_repeating_bytes=750_000_000,
                    embedding_bytes=250_000_000, num_layers=4,
                    expert_bytes_per_layer=expert_bytes)
    return RooflineLatency(gpu=GPU, host=HOST, model=m, geometry=kv_geometry(m), weights=w,
                           gpu_layers=gpu_layers, step_overhead_s=0.001, head_on_gpu=True,
                           op_offload=op_offload, **kw)


def test_toy_weights_split_as_described() -> None:
    r = _toy()
    assert (r.gpu_weight_bytes, r.cpu_weight_bytes) == (2.5e9, 2e9)
    assert (r.host_dense_bytes, r.host_expert_bytes, r.host_head_bytes) == (2e9, 0, 0)
    assert r.geometry.bytes_for_tokens(1024) == 4_194_304


def test_prefill_above_the_minimum_copies_host_weights_per_ubatch() -> None:
    """1,024 prompt tokens from an empty context = 2 ubatches of 512, each offloaded:
    FLOPs 1,024 × 8,995,904,000 + 2,048,000 (the head, one sampled position)
          + 4 layers × (1,024 × 1,025 / 2) pairs × 4,096
          = 9,211,805,696,000 + 2,048,000 + 8,598,323,200 = 9,220,406,067,200, half per
          ubatch → 4,610,203,033,600 / 100e12 = 46.102030336 ms (compute-bound: the GPU
          reads 2.5e9 + 2e9 weights + 4,194,304 B KV = 4.504 ms);
    copy  host weights 2e9 B + the host layers' half of the KV 2,097,152 B
          = 2,002,097,152 B / 20e9 B/s = 100.1048576 ms, not overlapped;
    step  1 ms + 2 × (46.102030336 + 100.1048576) ms = 293.413775872 ms."""
    r = _toy()
    expected = 0.001 + 2 * (4_610_203_033_600 / 100e12 + 2_002_097_152 / 20e9)
    assert expected == pytest.approx(0.293413775872, rel=1e-12)
    got = r.step_time_s(BatchShape((1024,), (0,)))
    assert got == pytest.approx(expected, rel=1e-12)
    # without op offload the host layers' half of the FLOPs runs at 1e12 FLOP/s: 4.6 s
    cpu = _toy(op_offload=None).step_time_s(BatchShape((1024,), (0,)))
    assert cpu == pytest.approx(0.001 + 4_610_203_033_600 / 100e12
                                + 4_610_203_033_600 / 1e12, rel=1e-12)
    assert cpu / got > 15


def test_decode_below_the_minimum_is_cpu_bandwidth_bound() -> None:
    """One sequence reading 1,000 tokens: FLOPs 8,997,952,000 + 4 × 1,000 × 4,096
    = 9,014,336,000; GPU half  max(4.507168e-5 s, (2.5e9 + 2,048,000) / 1e12 = 2.502048 ms);
    host half max(4.507168 ms, (2e9 + 2,048,000) / 100e9 = 20.02048 ms);
    step 1 + 2.502048 + 20.02048 ms = 23.522528 ms — op offload changes nothing."""
    step = BatchShape(decode_context=(999,))
    expected = 0.001 + 2_502_048_000 / 1e12 + 2_002_048_000 / 100e9
    assert expected == pytest.approx(0.023522528, rel=1e-12)
    assert _toy().step_time_s(step) == pytest.approx(expected, rel=1e-12)
    assert _toy().step_time_s(step) == _toy(op_offload=None).step_time_s(step)


def test_thirty_two_sequences_offload_thirty_one_do_not() -> None:
    """32 sequences at 100 tokens each: 3,200 KV tokens (13,107,200 B), FLOPs
    32 × 8,997,952,000 + 4 × 3,200 × 4,096 = 287,986,892,800.  Offloaded: the GPU reads
    4.5e9 + 13,107,200 B (4.5131072 ms > 2.879868928 ms of compute) after copying
    2e9 + 6,553,600 B (100.32768 ms): 1 + 4.5131072 + 100.32768 = 105.8407872 ms.
    31 sequences stay below the minimum: FLOPs 31 × 8,997,952,000 + 4 × 3,100 × 4,096
    = 278,936,512,000 + 50,790,400 = 278,987,302,400, the host half compute-bound at
    139.4936512 ms, the GPU half 2.5e9 + 6,348,800 B = 2.5063488 ms:
    1 + 2.5063488 + 139.4936512 = 143.0 ms."""
    r = _toy()
    off = r.step_time_s(BatchShape(decode_context=(99,) * 32))
    assert off == pytest.approx(0.001 + 4_513_107_200 / 1e12 + 2_006_553_600 / 20e9, rel=1e-12)
    assert off == pytest.approx(0.1058407872, rel=1e-12)
    below = r.step_time_s(BatchShape(decode_context=(99,) * 31))
    assert below == pytest.approx(0.001 + 2_506_348_800 / 1e12 + 139_493_651_200 / 1e12,
                                  rel=1e-12)
    assert below == pytest.approx(0.143, rel=1e-12)


@pytest.mark.parametrize("n", [1, 31, 32, 40])
def test_decode_stretches_agree_with_single_steps(n: int) -> None:
    r = _toy()
    ctx = np.arange(100, 100 + n)
    fast = r.decode_steps_s(ctx, 5)
    quick = r.decode_steps_list(tuple(int(c) for c in ctx), 5)
    slow = [r.step_time_s(BatchShape(decode_context=tuple(int(c) + j for c in ctx)))
            for j in range(5)]
    assert quick == fast.tolist()
    np.testing.assert_allclose(fast, slow, rtol=1e-12)


def test_a_short_last_ubatch_runs_on_the_cpu() -> None:
    """543 tokens = one offloaded ubatch of 512 and 31 tokens on the CPU path; 544 =
    512 + 32, both offloaded."""
    assert ubatch_split(543, 512) == ((512, 1), (31, 1))
    assert ubatch_split(2048, 512) == ((512, 4),)
    assert ubatch_split(20, 512) == ((20, 1),)
    r = _toy()
    t543 = r.step_time_s(BatchShape((543,), (0,)))
    t544 = r.step_time_s(BatchShape((544,), (0,)))
    # the 31-token ubatch pays the host layers' CPU compute (~140 ms) instead of a
    # 100 ms weight copy plus ~3 ms of GPU compute
    assert t543 - t544 > 0.03


def test_moe_experts_in_ram_copy_only_the_routed_share() -> None:
    """MoE toy: 4 experts, 1 active, 0.8e9 B of experts per layer, every layer on the
    GPU but the experts of 2 layers in RAM; params_active 2.25e9 (half).  GPU weights:
    dense 4 × (1e9 − 0.8e9) + 0.5e9 head = 1.3e9 B read whole, the other 2 layers'
    experts 1.6e9 B of which one token reads 1/4: 1.3e9 + 0.4e9 = 1.7e9 B.  With the
    minimum at 2 tokens (GGML_OP_OFFLOAD_MIN_BATCH=2), a decode of 2 sequences at 100
    tokens routes to 1 − 0.75² = 43.75 % of the experts: copies 0.4375 × 1.6e9 = 0.7e9 B
    from RAM (35 ms); the GPU then reads 1.3e9 + 0.7e9 of its own, the 0.7e9 copied and
    819,200 B of KV = 2,700,819,200 B (2.7008192 ms; compute ~0.09 ms):
    step 1 + 2.7008192 + 35 ms = 38.7008192 ms."""
    assert experts_used_fraction(2, 0.25) == 0.4375
    assert experts_used_fraction(5, 0.0) == 0.0
    low_min = OpOffload(link_bytes_per_s=20e9, ubatch_tokens=512, min_batch_tokens=2)
    r = _toy(gpu_layers=4, op_offload=low_min, model=_model(2.25e9, (4, 1)),
             expert_bytes=800_000_000, cpu_expert_layers=2)
    assert r.gpu_weight_bytes == pytest.approx(1.7e9, rel=1e-15)
    assert r.weight_bytes(2) == pytest.approx((2.0e9, 0.7e9), rel=1e-15)
    assert (r.host_dense_bytes, r.host_expert_bytes) == (0, 1_600_000_000)
    got = r.step_time_s(BatchShape(decode_context=(99, 99)))
    assert got == pytest.approx(0.001 + 2_700_819_200 / 1e12 + 0.7e9 / 20e9, rel=1e-12)
    assert got == pytest.approx(0.0387008192, rel=1e-12)


def test_which_engines_and_links_offload() -> None:
    from kvsim.scenario import resolve_scenario

    def offload(**raw):
        sc = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-70b", "workload": {},
                               **raw})
        return op_offload_for(sc)

    llama = offload(engine={"preset": "llama.cpp", "context_tokens": 8192})
    # pcie4-x16: 25e9 B/s pinned × 0.55 pageable (mmap keeps host weights pageable)
    assert llama == OpOffload(link_bytes_per_s=25e9 * 0.55, ubatch_tokens=512,
                              min_batch_tokens=32)
    assert offload(engine={"preset": "ollama"}) is not None
    assert offload(engine={"preset": "vllm", "context_tokens": 8192}) is None
    assert offload(engine={"preset": "llama.cpp", "context_tokens": 8192},
                   link="unified") is None
    # all layers on the GPU: nothing to copy, no offload
    assert _toy(gpu_layers=4).op_offload is None
    # the engine's knobs: --no-op-offload, --no-mmap (pinned: the full 25e9 B/s), the
    # GGML_OP_OFFLOAD_MIN_BATCH environment variable
    ctx = {"preset": "llama.cpp", "context_tokens": 8192}
    assert offload(engine={**ctx, "op_offload": False}) is None
    assert offload(engine={**ctx, "use_mmap": False, "op_offload_min_batch": 64}) == OpOffload(
        link_bytes_per_s=25e9, ubatch_tokens=512, min_batch_tokens=64)


def test_quickstart_70b_on_a_4090_is_plausible() -> None:
    """The audit case: Llama-3.1-70B q4_k_m on an RTX 4090, 38 of 80 layers on the
    GPU.  A 2,048-token prompt step copies the ~21.5 GB of host layers 4 times at
    13.75 GB/s (~6.3 s) and computes on the GPU (~2.1 s at the CUDA fit's rates, its
    k-quant prompt at Q4_0's factor as today's MMQ runs it; ~3.6 s under the spec-sheet
    roofline, ``latency.rates=peak``): about 8 s, where the CPU
    path took over 300 s; a one-sequence decode step stays bound by the host's memory
    bandwidth (21.5e9 B / 89.6e9 B/s ≈ 0.24 s)."""
    from kvsim.api import scenario_budget
    from kvsim.latency.factory import make_latency_model
    from kvsim.scenario import load_scenario

    sc = load_scenario("quickstart", ["gpu=rtx-4090", "model=llama-3.1-70b"])
    budget = scenario_budget(sc)
    lat = make_latency_model(sc, budget)
    assert budget.gpu_layers == 38 and lat.op_offload is not None
    prefill = lat.step_time_s(BatchShape((2048,), (0,)))
    copy_s = 4 * lat.host_dense_bytes / lat.op_offload.link_bytes_per_s
    assert 6.1 < copy_s < 6.5
    assert 7.8 < prefill < 11.0 and 1.7 < prefill - copy_s < 4.0
    decode = lat.step_time_s(BatchShape(decode_context=(1000,)))
    assert lat.cpu_weight_bytes / 89.6e9 < decode < 0.3


def test_an_offloaded_ubatch_pays_the_tiled_paths_per_tile_work() -> None:
    """An op-offloaded 512-token ubatch runs the GPU's tiled matmuls like any other
    prompt step: its linear FLOPs take GpuRates.tile_tokens' share (4 tiles of 128:
    1 + 64 x 4 / 512 = 1.5), the copy and the weight read do not."""
    from kvsim.latency.roofline import GpuRates

    rates = dict(linear_flops_per_s=100e12, attention_flops_per_s=100e12,
                 weight_bytes_per_s=1e12, kv_bytes_per_s=1e12, overhead_s=0.001)
    plain = _toy(rates=GpuRates(**rates))
    tiled = _toy(rates=GpuRates(**rates, tile_tokens=64.0))
    step = BatchShape((1024,), (0,))
    lin = 1024 * 8_995_904_000 + 2_048_000
    assert tiled.step_time_s(step) - plain.step_time_s(step) == pytest.approx(
        0.5 * lin / 100e12, rel=1e-9)
