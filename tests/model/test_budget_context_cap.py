"""max_context_at searches up to what the engine can use: llama.cpp -c is all slots'
total (each slot capped at the training context), Ollama num_ctx one slot's."""

from kvsim.config.catalog import load_gpu, load_model
from kvsim.config.specs import ModelSpec
from kvsim.engines.budget import max_context_at, memory_budget
from kvsim.engines.resolve import resolve_engine
from kvsim.plan.parallel import largest_context_words

TINY = ModelSpec(
    name="tiny", display_name="tiny", params_total=1e7, params_active=1e7, num_layers=8,
    hidden_size=128, num_attention_heads=2, num_kv_heads=2, head_dim=64, vocab_size=1000,
    max_context_tokens=8192, source="test",
    layer_groups=[{"kind": "full", "layers": 8, "n_kv_heads": 2, "head_dim_k": 64,
                   "head_dim_v": 64}])


def test_tiny_model_is_capped_at_parallel_times_its_maximum_on_llama_cpp():
    # TINY: 8 layers x 2 (K, V) x 2 heads x 64 x 2 B = 4,096 B per token; 4 slots of its
    # 8,192 maximum = 32,768 cells = 128 MiB, far under 85 % of 24 GiB, so the cap binds:
    # llama.cpp -c = 4 x 8,192 = 32,768 (each slot capped at 8,192), whichever allocator
    gpu = load_gpu("rtx-4090")
    for alloc in ("unified", "slots"):
        eng = resolve_engine({"preset": "llama.cpp", "ctx_size": 4096, "parallel": 4,
                              "allocator": alloc})
        assert max_context_at(gpu, TINY, "f16", eng) == 32_768
    # Ollama's num_ctx is per slot (the runner gets num_ctx x 4): capped at 8,192 itself
    olla = resolve_engine({"preset": "ollama", "context_tokens": 4096, "parallel": 4})
    assert max_context_at(gpu, TINY, "f16", olla) == 8_192


def test_unified_pool_of_8_slots_on_a_5090_goes_past_the_model_maximum():
    # the audit's case: fit --gpu rtx-5090 --model llama-3.1-8b --context 262144
    # --parallel 8 --kv q8_0 said "FITS — peak 69.2%" and then "largest context 131072"
    #   q8_0 KV: 32 layers x 8 kv heads x 128 x 2 (K, V) x 34/32 B = 69,632 B per token
    #   + the F16 mask of the one unified stream, 512 x 2 = 1,024 B per cell -> 70,656 B
    #   fixed: 400 MiB CUDA context 419,430,400 + weights 4,616,334,272 (32 q4_k_m layers
    #          of 130,793,566 B and the Q6_K head 430,940,160 B, the token embedding on the
    #          CPU: tests/model/test_budget.py LLAMA8_Q4_FIXED) + compute buffer
    #          296,222,720 = 5,331,987,392
    #   85 % of the 32 GiB that CUDA reports less 2 % (kvsim.config.device_memory):
    #   0.85 x 33,672,543,600 = 28,621,662,060
    #   (28,621,662,060 - 5,331,987,392) / 70,656 = 329,620.6 cells
    #   -c padded to 256: 1,287 x 256 = 329,472 (41,184 per session), under the cap
    #   8 x 131,072 = 1,048,576
    gpu, m = load_gpu("rtx-5090"), load_model("llama-3.1-8b")
    eng = resolve_engine({"preset": "llama.cpp", "ctx_size": 262144, "parallel": 8,
                          "cache_type_k": "q8_0", "cache_type_v": "q8_0",
                          "flash_attn": True})
    best = max_context_at(gpu, m, "q4_k_m", eng)
    assert best == 329_472
    at = memory_budget(gpu, m, "q4_k_m", eng.model_copy(update={"ctx_size": best}))
    # 5,331,987,392 + 329,472 x 70,656 = 28,611,161,024 <= 28,621,662,060
    assert at.total_bytes == 28_611_161_024
    over = memory_budget(gpu, m, "q4_k_m", eng.model_copy(update={"ctx_size": 329_728}))
    # + 256 x 70,656 = 18,087,936 -> 28,629,248,960 > the line
    assert over.total_bytes == 28_629_248_960
    assert largest_context_words(at, best, m.max_context_tokens) == \
        "-c 329,472 = 41,184 per session x 8"


def test_largest_context_words_per_engine():
    gpu = load_gpu("rtx-4090")
    b = memory_budget(gpu, TINY, "f16", resolve_engine(
        {"preset": "llama.cpp", "ctx_size": 32768, "parallel": 4}))
    assert largest_context_words(b, 32_768, 8192) == \
        "-c 32,768 = 8,192 per session x 4 (the model's maximum)"
    o = memory_budget(gpu, TINY, "f16", resolve_engine(
        {"preset": "ollama", "context_tokens": 4096, "parallel": 4}))
    assert largest_context_words(o, 4096, 8192) == "num_ctx 4,096 per session"
    assert largest_context_words(o, 8192, 8192) == \
        "num_ctx 8,192 per session (the model's maximum)"
    assert largest_context_words(b, 32_768) == "-c 32,768 = 8,192 per session x 4"
