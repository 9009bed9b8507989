"""Per-engine memory layouts against numbers the real engines print (engines.md)."""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.config.engine import resolve_engine
from kvsim.config.specs import ModelSpec
from kvsim.model.budget import (
    GIB,
    MIB,
    acceptable,
    engine_for_gpu,
    max_context_at,
    max_parallel_at,
    memory_budget,
    sglang_gpu_defaults,
)

GPU = load_gpu("rtx-4090")
TINY = ModelSpec(
    name="tiny", display_name="tiny", params_total=1e7, params_active=1e7, num_layers=8,
    hidden_size=128, num_attention_heads=2, num_kv_heads=2, head_dim=64, vocab_size=1000,
    max_context_tokens=8192, source="test",
    layer_groups=[dict(kind="full", layers=8, n_kv_heads=2, head_dim_k=64, head_dim_v=64)])


def llama(**kw):
    return resolve_engine({"preset": "llama.cpp", **kw})


@pytest.mark.parametrize("kv,mib", [("f16", 32), ("q8_0", 17), ("q4_0", 9)])
def test_llama_server_kv_buffer_for_8_layer_model(kv, mib):
    # a real llama-server printed 32.00 / 17.00 / 9.00 MiB at -c 8192 (issue 2)
    b = memory_budget(GPU, TINY, "f16", llama(context_tokens=8192, cache_type_k=kv,
                                              cache_type_v=kv))
    assert b.kv_reserved_bytes == mib * MIB
    assert f"KV buffer size = {mib}.00 MiB" in "\n".join(b.log_lines)


def test_non_unified_slots_split_context():
    # engines.md §3.1: 4096 context with 4 slots gives 1024 tokens per slot
    b = memory_budget(GPU, TINY, "f16", llama(context_tokens=4096, parallel=4,
                                              allocator="slots"))
    assert (b.slot_tokens, b.kv_pool_tokens) == (1024, 4096)
    u = memory_budget(GPU, TINY, "f16", llama(context_tokens=4096, parallel=4))
    assert (u.slot_tokens, u.kv_pool_tokens) == (4096, 4096)


def test_context_padded_to_256():
    b = memory_budget(GPU, TINY, "f16", llama(context_tokens=1000))
    assert b.kv_pool_tokens == 1024 and b.kv_reserved_bytes == 1024 * 4096


def test_llama_cpp_swa_cells():
    # §3.3: SWA cache = min(n_ctx_seq, n_swa * n_parallel(unified) + n_ubatch) padded to 256
    m = load_model("gemma-3-12b")
    b = memory_budget(GPU, m, "q4_k_m", llama(context_tokens=32768, parallel=4))
    swa = (1024 * 4 + 512)
    assert b.extra["swa_cells"] == (swa,)
    assert b.kv_reserved_bytes == 65536 * 32768 + 327680 * swa


def test_vllm_block_arithmetic_issue_10517():
    # engines.md §1.1: 3.81 GiB of KV -> 1952 blocks = 31,232 tokens -> 1.56x at 20k
    eng = resolve_engine({"preset": "vllm", "context_tokens": 20000,
                          "kv_cache_memory_bytes": int(3.8125 * GIB)})
    b = memory_budget(load_gpu("rtx-3090"), load_model("llama-3.1-8b"), "bf16", eng)
    assert b.num_gpu_blocks == 1952 and b.kv_pool_tokens == 31232
    assert "GPU KV cache size: 31,232 tokens" in b.log_lines
    assert "Maximum concurrency for 20,000 tokens per request: 1.56x" in b.log_lines


def test_vllm_fails_when_one_request_does_not_fit():
    eng = resolve_engine({"preset": "vllm", "context_tokens": 131072})
    b = memory_budget(load_gpu("rtx-3090"), load_model("llama-3.1-8b"), "bf16", eng)
    assert not b.fits and "max seq len (131072)" in b.failure


def test_vllm_pool_is_utilization_share_minus_the_rest():
    eng = resolve_engine({"preset": "vllm", "context_tokens": 8192, "activation_bytes": GIB})
    g, m = load_gpu("rtx-4090"), load_model("llama-3.1-8b")
    b = memory_budget(g, m, "bf16", eng)
    share = int(0.9 * g.memory_bytes)
    pool = share - b.weights_total_bytes - GIB - eng.non_torch_bytes
    assert b.kv_reserved_bytes == pool
    assert b.num_gpu_blocks == pool // (16 * 131072)
    assert b.total_bytes == b.driver_reserve_bytes + share + eng.cuda_graph_bytes


def test_sglang_default_fraction_24gib():
    # engines.md §2.1: 24564 MiB card -> reserved 3760 MiB -> 0.847
    assert sglang_gpu_defaults(24564 * MIB) == (0.847, 2048)
    assert engine_for_gpu("sglang", GPU).gpu_memory_utilization == pytest.approx(0.847, abs=1e-3)


def test_ollama_estimate_undercounts_q8_0():
    eng = resolve_engine({"preset": "ollama", "context_tokens": 8192, "parallel": 2,
                          "flash_attn": True, "cache_type_k": "q8_0", "cache_type_v": "q8_0"})
    b = memory_budget(GPU, load_model("llama-3.1-8b"), "q4_k_m", eng)
    # estimator: 1 byte/element; real q8_0: 34/32
    assert b.estimate.kv_bytes == 16384 * 32 * 8 * 256
    assert b.kv_reserved_bytes == 16384 * 69632
    assert b.kv_reserved_bytes * 16 == b.estimate.kv_bytes * 17


def test_ollama_spills_layers_when_weights_do_not_fit():
    eng = resolve_engine({"preset": "ollama", "context_tokens": 4096})
    b = memory_budget(load_gpu("rtx-3060-12gb"), load_model("qwen2.5-32b"), "q4_k_m", eng)
    assert 0 < b.gpu_layers < 64 and b.weights_cpu_bytes > 0
    assert b.estimate.gpu_layers == b.gpu_layers


def test_llama_cpp_auto_layers_leave_fit_target():
    b = memory_budget(load_gpu("rtx-3060-12gb"), load_model("qwen2.5-32b"), "q4_k_m",
                      llama(context_tokens=8192))
    assert b.gpu_layers < 64 and b.fits
    assert b.total_bytes <= b.device_bytes - 1024 * MIB


def test_quantized_k_needs_head_dim_multiple_of_block():
    from kvsim.errors import InputError
    with pytest.raises(InputError, match="multiple of 32"):
        memory_budget(GPU, load_model("phi-3.5-mini").model_copy(update={"layer_groups": (
            load_model("phi-3.5-mini").layer_groups[0].model_copy(update={"head_dim_k": 80}),)}),
            "q4_k_m", llama(cache_type_k="q8_0"))


def test_searches_find_the_boundary():
    m, eng = load_model("llama-3.1-8b"), llama(context_tokens=32768, parallel=4,
                                               allocator="slots")
    best = max_context_at(GPU, m, "q4_k_m", eng)
    ok = memory_budget(GPU, m, "q4_k_m", eng.model_copy(update={"context_tokens": best}))
    over = memory_budget(GPU, m, "q4_k_m", eng.model_copy(update={"context_tokens": best + 256}))
    assert acceptable(ok, 4) and not acceptable(over, 4)
    big = eng.model_copy(update={"context_tokens": 65536})
    p = max_parallel_at(GPU, m, "q4_k_m", big)
    assert p > 0
    assert acceptable(memory_budget(GPU, m, "q4_k_m", big.model_copy(update={"parallel": p})), p)
    # slots split -c, so more slots only add padding; at -c 65536 every split fits
    assert p == 65536 // 256
