"""vLLM / SGLang over several GPUs: tensor x pipeline ranks, one per GPU
(kvsim.engines._paged_ranks; docs/reference/engines.md §1.10)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines._paged_ranks import kv_head_fraction, pp_partitions
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu
from kvsim.errors import InputError
from kvsim.model.weights import model_weights

GIB = 2**30
R3090, R3060 = load_gpu("rtx-3090"), load_gpu("rtx-3060-12gb")
LLAMA = load_model("llama-3.1-8b")   # 32 layers, 8 KV heads of 128, untied head


def _budget(gpus, model=LLAMA, weights="bf16", preset="vllm", **knobs):
    cfg = engine_for_gpu({"preset": preset, "context_tokens": 32768, **knobs}, gpus[0],
                         model, weights=weights, more_gpus=tuple(gpus[1:]))
    return cfg, memory_budget(gpus[0], model, weights, cfg, more_gpus=tuple(gpus[1:]))


def test_pipeline_stages_take_vllms_layer_partition():
    # vLLM's docs example: a 61-layer model, PP2 [31, 30], PP4 [15, 15, 16, 15] — the
    # remainder goes to the stages before the last, from the second-to-last backwards
    assert pp_partitions(61, 2) == [31, 30]
    assert pp_partitions(61, 4) == [15, 15, 16, 15]
    assert pp_partitions(32, 3) == [11, 11, 10]   # remainder 2: stages -2 and -3
    assert pp_partitions(32, 1) == [32]


def test_kv_heads_split_over_ranks_and_replicate_below_one_each():
    assert kv_head_fraction(LLAMA, 2) == Fraction(1, 2)     # 4 of 8 heads per rank
    assert kv_head_fraction(LLAMA, 8) == Fraction(1, 8)
    assert kv_head_fraction(LLAMA, 16) == Fraction(1, 8)    # 1 head each, replicated
    qwen3b = load_model("qwen2.5-3b")                       # 2 KV heads
    assert kv_head_fraction(qwen3b, 4) == Fraction(1, 2)
    # an MLA latent is not split by heads: every rank holds all of it
    assert kv_head_fraction(load_model("deepseek-v2-lite"), 2) == 1


def test_tensor_parallel_two_3090s_each_hold_half_the_weights_and_kv():
    cfg, b = _budget((R3090, R3090))
    assert (cfg.tensor_parallel_size, cfg.pipeline_parallel_size) == (2, 1)
    assert b.split == "tensor" and b.fits and len(b.devices) == 2
    whole = model_weights(LLAMA, "bf16").total_bytes
    d0, d1 = b.devices
    assert abs(d0.weights_bytes - whole / 2) < 64 and d0.layers == 32   # every layer, halved
    # a 16-token block of 4 heads: 16 x 32 layers x 2 (K, V) x 4 x 128 x 2 bytes
    per_block = 16 * 32 * 2 * 4 * 128 * 2
    assert per_block == 2**20                 # half of the whole model's 2 MiB block
    share = int(0.92 * R3090.reported_memory_bytes)   # vLLM 0.24: util 0.92 of 23.58 GiB
    pool = (share - d0.weights_bytes - d0.compute_bytes - cfg.non_torch_bytes
            - cfg.cuda_graph_bytes)
    assert b.num_gpu_blocks == pool // per_block and b.kv_pool_tokens == 16 * (pool // per_block)
    assert d0.kv_bytes == d1.kv_bytes == b.num_gpu_blocks * per_block
    # the box holds every token's KV once, split over the ranks
    assert b.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2
    assert b.kv_reserved_bytes == 2 * d0.kv_bytes
    assert b.device_bytes == 2 * R3090.reported_memory_bytes
    # more than twice one card's pool: the second card also takes half the weights
    _, one = _budget((R3090,))
    assert b.kv_pool_tokens > 2 * one.kv_pool_tokens
    assert any("(rank 1, rtx-3090) Available KV cache memory" in line for line in b.log_lines)
    assert f"GPU KV cache size: {b.kv_pool_tokens:,} tokens" in b.log_lines


def test_the_smaller_card_sizes_every_ranks_pool():
    # 3090 + 3060 12 GB: each rank holds half the model; the 3060 has the least left
    # (1.16 GiB after its sampler pass: 19,040 tokens, a 16K context but not 32K)
    cfg, b = _budget((R3090, R3060), context_tokens=16384)
    assert b.fits
    d0, d1 = b.devices
    share = int(0.92 * R3060.reported_memory_bytes)
    pool = share - d1.weights_bytes - d1.compute_bytes - cfg.non_torch_bytes \
        - cfg.cuda_graph_bytes
    assert b.num_gpu_blocks == pool // 2**20
    assert d0.kv_bytes == d1.kv_bytes      # the 3090 allocates only the 3060's block count


def test_a_card_too_small_for_its_half_refuses_the_start_up_naming_it():
    # Qwen2.5-14B in bf16: 27.4 GiB, 13.7 GiB per rank, more than a 3060's 0.92 share
    _, b = _budget((R3090, R3060), model=load_model("qwen2.5-14b"))
    assert not b.fits
    assert b.failure.startswith("(rank 1, rtx-3060-12gb) No available memory for the "
                                "cache blocks")


def test_pipeline_stages_hold_their_layers_and_the_last_the_head():
    cfg, b = _budget((R3090, R3090), pipeline_parallel_size=2)
    assert (cfg.tensor_parallel_size, cfg.pipeline_parallel_size) == (1, 2)
    assert b.split == "pipeline" and [d.layers for d in b.devices] == [16, 16]
    ws = model_weights(LLAMA, "bf16")
    d0, d1 = b.devices
    assert d0.weights_bytes == 16 * ws.per_layer_bytes + ws.embedding_bytes
    assert d1.weights_bytes == 16 * ws.per_layer_bytes + ws.head_bytes
    assert (d0.holds_output, d1.holds_output) == (False, True)
    # the sampler's logits are the last stage's: its profiled peak is larger
    assert d1.compute_bytes > d0.compute_bytes


def test_a_tied_head_is_held_by_the_first_and_last_stage():
    qwen3b = load_model("qwen2.5-3b")          # tied embeddings, 36 layers
    ws = model_weights(qwen3b, "bf16")
    _, b = _budget((R3090, R3090), model=qwen3b, pipeline_parallel_size=2)
    d0, d1 = b.devices
    assert d0.weights_bytes == 18 * ws.per_layer_bytes + ws.embedding_bytes
    assert d1.weights_bytes == 18 * ws.per_layer_bytes + ws.embedding_bytes
    _, tp = _budget((R3090, R3090), model=qwen3b)
    assert abs(tp.devices[0].weights_bytes - ws.total_bytes / 2) < 64   # one copy, split


def test_replicated_kv_heads_cost_the_box_more_per_token():
    # Qwen2.5-3B has 2 KV heads: over 4 ranks each holds one, so the box stores 2x
    qwen3b = load_model("qwen2.5-3b")
    _, one = _budget((R3090,), model=qwen3b)
    _, b = _budget((R3090,) * 4, model=qwen3b)
    assert b.kv_bytes_per_token == 2 * one.kv_bytes_per_token


def test_sglang_reserves_more_of_each_card_per_rank():
    # §2.1: reserved MiB = 512 + 1.5 x 2048 + 2 x 24 + 1024 x tp x pp / 8 on a 24 GiB card
    one, _ = _budget((R3090,), preset="sglang")
    two, b = _budget((R3090, R3090), preset="sglang")
    mib = R3090.memory_bytes / 2**20
    assert one.gpu_memory_utilization == round((mib - (512 + 3072 + 48 + 128)) / mib, 3)
    assert two.gpu_memory_utilization == round((mib - (512 + 3072 + 48 + 256)) / mib, 3)
    assert b.split == "tensor" and b.fits


def test_parallel_sizes_must_cover_the_gpus():
    cfg = engine_for_gpu({"preset": "vllm", "tensor_parallel_size": 2}, R3090, LLAMA,
                         weights="bf16", more_gpus=(R3090,))
    with pytest.raises(InputError, match="tensor_parallel_size x pipeline_parallel_size"):
        memory_budget(R3090, LLAMA, "bf16", cfg, more_gpus=(R3090, R3090))


@pytest.mark.parametrize("preset,knobs,flags", [
    ("vllm", {}, " --tensor-parallel-size 4"),
    ("vllm", {"pipeline_parallel_size": 2},
     " --tensor-parallel-size 2 --pipeline-parallel-size 2"),
    ("sglang", {"pipeline_parallel_size": 4}, " --pp-size 4"),
])
def test_the_launch_command_names_the_ranks(preset, knobs, flags):
    from kvsim.plan.flags import engine_flags
    from kvsim.scenario import resolve_scenario

    s = resolve_scenario({"gpu": "4x rtx-3090", "model": "llama-3.1-8b", "weights": "bf16",
                          "engine": {"preset": preset, "context_tokens": 8192, **knobs},
                          "workload": {"preset": "family-4", "days": 0.1}})
    assert engine_flags(s).endswith(flags)
