"""vLLM's hybrid KV cache manager in the budget (kvsim.model.hybrid, docs/reference/engines.md
§1.7).

Numbers worked by hand from the model profiles: Gemma-3-12B has 8 full + 40 sliding
layers (window 1024) of 8 KV heads × 256 dims, 2 × 8 × 256 × 2 = 8192 bytes per
token and layer at f16; gpt-oss-20b 12 + 12 layers (window 128), 2048 bytes.
"""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.core.build import PoolSizing, make_scheduler
from kvsim.engines.budget import acceptable, memory_budget
from kvsim.engines.memory import GIB
from kvsim.engines.resolve import resolve_engine
from kvsim.errors import InputError
from kvsim.scenario import resolve_scenario

GPU = load_gpu("rtx-4090")


def _vllm(ctx: int, **kw):
    return resolve_engine({"preset": "vllm", "context_tokens": ctx,
                           "kv_cache_memory_bytes": 4 * GIB, **kw})


def test_gemma3_six_groups_of_eight_layers_share_one_pool() -> None:
    b = memory_budget(GPU, load_model("gemma-3-12b"), "fp8", _vllm(32768))
    # group size min(8, 40) = 8: 5 sliding groups (layer 0 is sliding) then 1 full
    assert b.kv_groups == (("sliding", 1024),) * 5 + (("full", 0),)
    # one block = 16 tokens x 8192 bytes x 8 layers = 1 MiB: 4 GiB hold 4096 blocks
    assert b.num_gpu_blocks == 4096
    # logged as if every group held every token: 4096 // 6 * 16
    assert b.kv_pool_tokens == 10912 and "GPU KV cache size: 10,912 tokens" in b.log_lines
    # one request: full ceil(32768/16) = 2048; sliding ceil((1023 + 2048)/16) + 1 = 193 each
    assert b.blocks_per_request == 2048 + 5 * 193
    assert "Maximum concurrency for 32,768 tokens per request: 1.36x" in b.log_lines
    assert b.fits and b.kv_needed_bytes == 3013 * 2**20
    assert acceptable(b, 1) and not acceptable(b, 2)  # 2 x 3013 > 4096 blocks


def test_gpt_oss_two_groups_of_twelve() -> None:
    b = memory_budget(GPU, load_model("gpt-oss-20b"), "mxfp4", _vllm(131072))
    assert b.kv_groups == (("sliding", 128), ("full", 0))
    assert b.num_gpu_blocks == 4 * GIB // (16 * 2048 * 12)  # 10922
    # full 8192 blocks + sliding ceil((127 + 2048)/16) + 1 = 137
    assert b.blocks_per_request == 8192 + 137 and b.fits


def test_uneven_layer_counts_are_padded_to_whole_groups() -> None:
    # Gemma-3-27B: 10 full + 52 sliding layers; group size 10 (52 >= 1.5 x 10), so the
    # sliding layers fill ceil(52/10) = 6 groups: 8 padding layers, 7 groups in all
    b = memory_budget(load_gpu("rtx-pro-6000-blackwell"), load_model("gemma-3-27b"), "bf16",
                      _vllm(32768))
    assert b.kv_groups == (("sliding", 1024),) * 6 + (("full", 0),)
    assert any("8 padding layers" in n for n in b.notes)


def test_too_long_for_the_pool_names_the_largest_length_that_fits() -> None:
    b = memory_budget(GPU, load_model("gemma-3-12b"), "fp8", _vllm(131072))
    # 8192 + 965 blocks > 4096; the largest L has ceil(L/16) <= 4096 - 965 = 3131
    assert not b.fits
    assert "estimated maximum model length is 50096" in b.failure
    assert b.extra["max_model_len_fit"] == 50096


def test_disabled_manager_holds_every_layer_at_full_length() -> None:
    b = memory_budget(GPU, load_model("gemma-3-12b"), "fp8",
                      _vllm(32768, disable_hybrid_kv_cache_manager=True))
    # 16 tokens x 8192 bytes x 48 layers = 6 MiB a block: 682 blocks = 10,912 tokens
    assert (b.kv_groups, b.num_gpu_blocks, b.kv_pool_tokens) == ((), 682, 10912)
    assert not b.fits and "max seq len (32768)" in b.failure
    assert any("held at full length" in n for n in b.notes)


def test_chunked_local_attention_stays_at_full_length() -> None:
    b = memory_budget(GPU, load_model("llama-4-scout-17b-16e"), "q4_k_m", _vllm(8192))
    assert b.kv_groups == () and any("chunked-local" in n for n in b.notes)


def _scenario(policies: list, **engine) -> dict:
    return {"gpu": "rtx-4090", "model": "gemma-3-12b", "weights": "fp8",
            "engine": {"preset": "vllm", "context_tokens": 8192, **engine},
            "workload": {}, "policies": policies}


def test_v0_swap_has_no_hybrid_manager() -> None:
    b = memory_budget(GPU, load_model("gemma-3-12b"), "fp8",
                      _vllm(8192, preemption_mode="swap", swap_space_bytes=GIB))
    assert b.kv_groups == () and any("V0 swap" in n for n in b.notes)
    with pytest.raises(InputError, match="disable_hybrid_kv_cache_manager"):
        _vllm(8192, preemption_mode="swap", swap_space_bytes=GIB,
              disable_hybrid_kv_cache_manager=False)


def test_a_host_kv_tier_turns_the_manager_off_and_an_explicit_request_is_refused() -> None:
    auto = resolve_scenario(_scenario([]))
    assert auto.engine.disable_hybrid_kv_cache_manager is None
    host = resolve_scenario(_scenario([{"kind": "host_kv_cache"}]))
    assert host.engine.disable_hybrid_kv_cache_manager is True
    with pytest.raises(InputError, match="engine.disable_hybrid_kv_cache_manager"):
        resolve_scenario(_scenario([{"kind": "host_kv_cache"}],
                                   disable_hybrid_kv_cache_manager=False))


def test_scheduler_refuses_a_pool_one_request_cannot_fill() -> None:
    eng = resolve_engine({"preset": "vllm", "context_tokens": 2048})
    groups = (("sliding", 64), ("full", 0))
    # full 128 + sliding ceil(min(63 + 2048, 2048)/16) + 1 = 129: 257 blocks needed
    ok = PoolSizing(kv_pool_tokens=0, slot_tokens=2048, kv_reserved_bytes=257 * 1000,
                    num_gpu_blocks=257, block_tokens=16, kv_groups=groups)
    assert make_scheduler(eng, ok).manager.kinds == groups
    short = PoolSizing(kv_pool_tokens=0, slot_tokens=2048, kv_reserved_bytes=256 * 1000,
                       num_gpu_blocks=256, block_tokens=16, kv_groups=groups)
    with pytest.raises(InputError, match="holds up to 257 blocks"):
        make_scheduler(eng, short)


def test_groups_are_refused_where_the_manager_is_off() -> None:
    groups = (("sliding", 64), ("full", 0))
    sizing = PoolSizing(kv_pool_tokens=0, slot_tokens=2048, kv_reserved_bytes=300 * 1000,
                        num_gpu_blocks=300, block_tokens=16, kv_groups=groups)
    swap = resolve_engine({"preset": "vllm", "context_tokens": 2048,
                           "preemption_mode": "swap", "swap_space_bytes": 10**9})
    off = resolve_engine({"preset": "vllm", "context_tokens": 2048,
                          "disable_hybrid_kv_cache_manager": True})
    for eng in (swap, off):
        with pytest.raises(InputError, match="hybrid manager is off"):
            make_scheduler(eng, sizing)
