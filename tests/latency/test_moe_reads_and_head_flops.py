"""MoE decode reads dense weights whole and the experts its tokens route to; the output
head is computed once per sampled sequence, the token embedding never (roofline.py)."""

from fractions import Fraction

import numpy as np
import pytest

from kvsim.config.catalog import load_gpu, load_host, load_model
from kvsim.latency.base import BatchShape
from kvsim.latency.roofline import RooflineLatency
from kvsim.model.geometry import kv_geometry
from kvsim.model.weights import model_weights


def _roofline(model: str, weights: str) -> RooflineLatency:
    m = load_model(model)
    return RooflineLatency(gpu=load_gpu("rtx-4090"), host=load_host("desktop-64gb"), model=m,
                           geometry=kv_geometry(m, "f16", "f16"),
                           weights=model_weights(m, weights), step_overhead_s=0.004)


# Qwen3-30B-A3B q4_k_m (docs/reference/models.csv: 30.5e9 total, 48 layers, hidden 2048,
# vocab 151,936, 32 x 128 query and 4 KV heads, 128 experts of width 768, 8 active), each
# tensor in llama-quantize's type: Q4_K 4.5 bpw = 0.5625 B, and Q6_K 6.5625 bpw (+2.0625)
# for the head and for attn_v and ffn_down in the 24 "more bits" layers of 48 (0-5, 8, 11,
# ..., 41, 42-47), half of them:
#   head 151,936 x 2048 = 311,164,928 params x 0.8203125 B = 255,252,480 B (the embedding,
#   Q4_K, is never read whole)
#   layer (30.5e9 - 622,329,856) / 48 = 622,451,461.3 params
#   attention Q, O 2048 x 4096 and K, V 2048 x 512 = 18,874,368 params; the count-based
#   experts (128 x 27.2e9 / 120 / 48 = 604.4 M) exceed the 603,577,093.3 left, so the
#   experts are 603,577,093.3 params: x 0.5625 = 339,512,115 B, + Q6_K on half the down
#   projections (a third of them, rows 768 = 3 x 256) 100,596,182.2 x 2.0625 / 8
#   = 25,934,953.2 -> 365,447,068 B a layer (4.84375 bpw)
#   dense: attention 18,874,368 x 0.5625 = 10,616,832 + half of V 524,288 x 2.0625 / 8
#   = 135,168 -> 10,752,000 B a layer
#   dense read: 48 x 10,752,000 + 255,252,480 = 771,348,480 B; experts 48 x 365,447,068
#   = 17,541,459,264 B
QWEN_DENSE, QWEN_EXPERTS = 771_348_480, 17_541_459_264


def test_qwen3_moe_decode_reads_dense_whole_and_the_routed_experts() -> None:
    r = _roofline("qwen3-30b-a3b", "q4_k_m")
    assert (r.gpu_dense_bytes, r.gpu_expert_bytes) == (QWEN_DENSE, QWEN_EXPERTS)
    # one token: 8/128 of the experts = 1,096,341,204 B -> 1,867,689,684 B
    assert r.weight_bytes(1)[0] == pytest.approx(1_867_689_684, rel=1e-15)
    # 8 tokens: 1 - (15/16)^8 = 1 - 2,562,890,625 / 4,294,967,296 of the experts
    used8 = 1 - Fraction(15, 16) ** 8
    assert used8 == Fraction(1_732_076_671, 4_294_967_296)
    read8 = QWEN_DENSE + float(QWEN_EXPERTS * used8)          # 7,845,477,402 B
    assert read8 == pytest.approx(7.845477402e9, rel=1e-9)
    assert r.weight_bytes(8)[0] == pytest.approx(read8, rel=1e-14)
    # a decode step of 8 at 999 + 1 tokens: KV 8 x 1000 x 98,304 B (2 x 48 x 4 x 128 x 2)
    # = 786,432,000 B; (7,845,477,402 + 786,432,000) / 856.8e9 + 4 ms = 14.0746 ms
    # (compute 8 x 2 x 3.3e9 / 82.6e12 = 0.64 ms, below it)
    t8 = r.step_time_s(BatchShape(decode_context=(999,) * 8))
    assert t8 == pytest.approx(0.004 + (read8 + 786_432_000) / 856.8e9, rel=1e-12)
    assert t8 == pytest.approx(0.0140746, rel=1e-5)
    # a 2048-token prompt routes to every expert: 1 - (15/16)^2048 = 1 to 1e-57
    assert r.weight_bytes(2048)[0] == pytest.approx(QWEN_DENSE + QWEN_EXPERTS, rel=1e-15)


def test_gpt_oss_20b_mxfp4_reads_its_bf16_head_and_attention_whole() -> None:
    # gpt-oss-20b mxfp4 (docs/reference/models.csv: 20.9e9, 24 layers, hidden 2880, vocab 201,088,
    # 64 x 64 query and 8 KV heads, 32 experts, 4 active); the non-experts bf16:
    #   head 201,088 x 2880 = 579,133,440 params x 2 B = 1,158,266,880 B
    #   attention 2880 x 64 x (128 + 16) = 26,542,080 params x 2 B = 53,084,160 B a layer,
    #   x 24 = 1,274,019,840 B
    #   experts (20.9e9 - 1,158,266,880) / 24 - 26,542,080 = 796,030,133.3 params x
    #   17/32 B -> 422,891,008 B a layer, x 24 = 10,149,384,192 B; a token reads 4/32:
    #   1,268,673,024 B
    #   one token: 1,158,266,880 + 1,274,019,840 + 1,268,673,024 = 3,700,959,744 B
    r = _roofline("gpt-oss-20b", "mxfp4")
    assert r.gpu_weight_bytes == 3_700_959_744
    assert (r.gpu_dense_bytes, r.gpu_expert_bytes) == (2_432_286_720, 10_149_384_192)


@pytest.mark.parametrize("model,weights", [("qwen3-30b-a3b", "q4_k_m"),
                                           ("gpt-oss-20b", "mxfp4")])
def test_moe_stretches_give_the_step_floats(model: str, weights: str) -> None:
    r = _roofline(model, weights)
    ctx = (500, 1200, 3000, 40, 7, 800, 90, 4000)
    fast = r.decode_steps_s(np.array(ctx), 6)
    quick = r.decode_steps_list(ctx, 6)
    slow = [r.step_time_s(BatchShape(decode_context=tuple(c + j for c in ctx)))
            for j in range(6)]
    if quick is not None:  # linear KV (qwen3): the three paths give the same floats
        assert quick == fast.tolist() == slow
    np.testing.assert_allclose(fast, slow, rtol=1e-12)


def test_head_flops_once_per_sequence_embedding_none() -> None:
    # Qwen3-30B-A3B (untied): 2 x (3.3e9 - 2 x 311,164,928) = 5,355,340,288 per token,
    # head 2 x 311,164,928 = 622,329,856 per sampled sequence
    r = _roofline("qwen3-30b-a3b", "q4_k_m")
    assert (r.linear_flops_per_token, r.head_flops_per_output) == (5_355_340_288,
                                                                   622_329_856)
    # Llama-3.2-3B (tied: one 128,256 x 3072 = 394,002,432 tensor in the 3.21e9):
    # 2 x (3.21e9 - 394,002,432) = 5,631,995,136 per token, head 788,004,864
    t = _roofline("llama-3.2-3b", "q4_k_m")
    assert (t.linear_flops_per_token, t.head_flops_per_output) == (5_631_995_136,
                                                                   788_004_864)
    # two 1024-token prompts from empty, one step: 2048 x 5,355,340,288
    # = 10,967,736,909,824 + 2 heads 1,244,659,712 + attention 48 layers x 2 x
    # (1024 x 1025 / 2) = 50,380,800 pairs x 4 x 32 x 128 = 825,439,027,200
    # = 11,794,420,596,736 FLOPs / 82.6e12 + 4 ms = 146.7896 ms (compute-bound: the
    # weights, 18.3 GB, take 21 ms); a head per prompt token would add 15.4 ms
    flops = 10_967_736_909_824 + 1_244_659_712 + 825_439_027_200
    assert flops == 11_794_420_596_736
    got = r.step_time_s(BatchShape((1024, 1024), (0, 0)))
    assert got == pytest.approx(0.004 + flops / 82.6e12, rel=1e-12)
    assert got == pytest.approx(0.1467896, rel=1e-6)
