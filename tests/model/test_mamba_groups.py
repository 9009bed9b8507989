"""Hybrid recurrent models (Gated DeltaNet, Mamba-2) against the start-up logs that name them.

The figures are rows of ../shared/measurements/engine-memory-logs.csv: vllm-011 (vLLM 0.24.0,
Qwen3.6-35B-A3B NVFP4 on an RTX 5090: "Available KV cache memory: 5.98 GiB", "GPU KV cache
size: 567,978 tokens", "Maximum concurrency for 131,072 tokens per request: 4.33x") and
vllm-007 (Qwen3.8-27B FP8, tensor parallel 2 on two RTX 3090s: "GPU KV cache size: 302,921
tokens", 2.31x at 131,072, a pool of 4.99 GiB per card by the author's reading).  Both with
fp8 KV and prefix caching on.
"""

import json

import pytest
from pydantic import ValidationError

from kvsim.config.catalog import load_gpu, load_model
from kvsim.config.specs import LayerGroup
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu
from kvsim.model.geometry import kv_geometry
from kvsim.model.hybrid import mamba_page_bytes
from kvsim.model.importers import model_from_hf_config

GIB = 2**30


def _vllm(gpu: str, model: str, weights: str, tp: int = 1, **knobs):
    g, m = load_gpu(gpu), load_model(model)
    more = (g,) * (tp - 1)
    e = engine_for_gpu({"preset": "vllm", "context_tokens": 131072, "cache_type_k": "fp8",
                        "cache_type_v": "fp8", "max_num_batched_tokens": 8192,
                        "tensor_parallel_size": tp, **knobs}, g, m, weights, more_gpus=more)
    return memory_budget(g, m, weights, e, more_gpus=more)


def test_qwen36_35b_a3b_pool_tokens_as_vllm_0_24_logs_them():
    # One DeltaNet layer's state as vLLM holds it: the SSM state 32 x 128 x 128 = 524,288
    # values in f32 (mamba_ssm_dtype) = 2,097,152 B + the convolution window (4 - 1) x
    # (2 x 16 x 128 + 32 x 128) = 24,576 values in bf16 = 49,152 B -> 2,146,304 B.  An
    # attention layer holds 2 KV heads x (256 + 256) x 1 B (fp8) = 1,024 B per token, so the
    # block grows to 16 x ceil(2,146,304 / (16 x 1,024)) = 2,096 tokens (a 2,146,304 B page).
    # 10 full + 30 DeltaNet layers: 4 groups of 10 layers, a block of 21,463,040 B;
    # 5.98 GiB = 6,420,917,207 B holds 299 blocks.  A 131,072-token request holds
    # ceil(131,072 / 2,096) = 63 attention blocks + 2 per Mamba group x 3 = 69:
    # 299 / 69 = 4.33x, and vLLM logs 131,072 x 299 // 69 = 567,978 tokens.
    m = load_model("qwen3.6-35b-a3b")
    assert mamba_page_bytes(m) == 2_146_304
    b = _vllm("rtx-5090", "qwen3.6-35b-a3b", "nvfp4", max_num_seqs=1,
              kv_cache_memory_bytes=int(5.98 * GIB))
    assert (b.block_tokens, b.num_gpu_blocks, b.blocks_per_request) == (2096, 299, 69)
    assert b.kv_pool_tokens == 567_978
    assert round(b.max_concurrency, 2) == 4.33
    assert b.kv_reserved_bytes == 299 * 10 * 2_146_304
    assert b.fits


def test_qwen38_27b_pool_tokens_over_two_ranks():
    # Per rank (TP 2): 2 of 4 KV heads x 512 x 1 B = 1,024 B per token and layer; the
    # DeltaNet state 24 of 48 heads x 128 x 128 x 4 B = 1,572,864 + (4 - 1) x 5,120 x 2 B =
    # 30,720 -> 1,603,584 B, so blocks of 16 x ceil(1,603,584 / 16,384) = 1,568 tokens;
    # 16 full + 48 DeltaNet layers = 4 groups of 16.  4.99 GiB = 5,357,971,701 B per rank
    # holds 5,357,971,701 // (1,568 x 1,024 x 16) = 208 blocks; a request holds
    # ceil(131,072 / 1,568) = 84 + 3 x 2 = 90: 131,072 x 208 // 90 = 302,921 tokens, 2.31x.
    b = _vllm("rtx-3090", "qwen3.8-27b", "fp8", tp=2, max_num_seqs=2,
              gpu_memory_utilization=0.92, kv_cache_memory_bytes=int(4.99 * GIB))
    assert (b.block_tokens, b.num_gpu_blocks, b.blocks_per_request) == (1568, 208, 90)
    assert b.kv_pool_tokens == 302_921
    assert round(b.max_concurrency, 2) == 2.31


def test_without_prefix_caching_a_mamba_group_holds_one_block():
    # the same pool: 63 + 3 x 1 = 66 blocks a request -> 131,072 x 299 // 66 = 593,795
    b = _vllm("rtx-5090", "qwen3.6-35b-a3b", "nvfp4", max_num_seqs=1,
              enable_prefix_caching=False, kv_cache_memory_bytes=int(5.98 * GIB))
    assert (b.blocks_per_request, b.kv_pool_tokens) == (66, 593_795)


def test_deltanet_kv_and_state_under_llama_cpp():
    # Qwen3.6-27B: 16 full-attention layers x 4 KV heads x (256 + 256) x 2 B = 65,536 B per
    # token at f16; 48 DeltaNet layers of 48 x 128 x 128 + 3 x (2 x 16 x 128 + 48 x 128)
    # = 817,152 values in f32 = 156,893,184 B per sequence
    g = kv_geometry(load_model("qwen3.6-27b"))
    assert (g.kv_bytes_per_token, g.recurrent_bytes_per_seq) == (65_536, 156_893_184)


def test_nemotron_h_mlp_layers_hold_nothing():
    # Nemotron-3-Nano-30B-A3B, 52 layers "MEMEM*E...": 6 GQA layers x 2 KV heads x
    # (128 + 128) x 2 B = 6,144 B per token (the card's "6 KiB/token"); 23 Mamba-2 layers
    # of 64 x 64 x 128 = 524,288 SSM values + (4 - 1) x (4,096 + 2 x 8 x 128) = 18,432
    # window values, f32 in llama.cpp: 23 x 542,720 x 4 = 49,930,240 B per sequence; the
    # 23 MoE layers add nothing
    m = load_model("nemotron-3-nano-30b-a3b")
    assert [(g.kind, g.layers) for g in m.layer_groups] == [("full", 6), ("recurrent", 23),
                                                             ("ffn", 23)]
    g = kv_geometry(m)
    assert (g.kv_bytes_per_token, g.recurrent_bytes_per_seq) == (6_144, 49_930_240)
    assert g.bytes_for_tokens(65536) == 6_144 * 65536 + 49_930_240


def test_nemotron_h_config_json_imports_to_the_catalogue_geometry(tmp_path):
    cfg = {"model_type": "nemotron_h", "vocab_size": 131072, "hidden_size": 2688,
           "num_hidden_layers": 52, "max_position_embeddings": 262144,
           "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
           "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
           "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128,
           "conv_kernel": 4, "n_groups": 8, "n_routed_experts": 128, "num_experts_per_tok": 6}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    got = model_from_hf_config(p)
    want = load_model("nemotron-3-nano-30b-a3b")
    assert [g.model_dump() for g in got.layer_groups] == [g.model_dump()
                                                         for g in want.layer_groups]
    assert got.layer_groups[0].layer_indices == (5, 12, 19, 26, 33, 42)


def test_a_window_larger_than_the_state_is_refused():
    with pytest.raises(ValidationError, match="conv_state_elements: 11 — at most state_"):
        LayerGroup(kind="recurrent", layers=1, state_elements=10, conv_state_elements=11)
