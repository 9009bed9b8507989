"""Per-engine memory layouts against numbers the real engines print (docs/reference/engines.md)."""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.config.specs import ModelSpec
from kvsim.engines.budget import max_context_at, max_parallel_at, memory_budget
from kvsim.engines.memory import GIB, MIB
from kvsim.engines.resolve import engine_for_gpu, resolve_engine
from kvsim.engines.sglang import sglang_gpu_defaults

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
    # a real llama-server printed 32.00 / 17.00 / 9.00 MiB at -c 8192
    b = memory_budget(GPU, TINY, "f16", llama(ctx_size=8192, cache_type_k=kv,
                                              cache_type_v=kv))
    assert b.kv_reserved_bytes == mib * MIB
    assert f"KV buffer size = {mib}.00 MiB" in "\n".join(b.log_lines)


def test_non_unified_slots_split_context():
    # docs/reference/engines.md §3.1: 4096 context with 4 slots gives 1024 tokens per slot
    b = memory_budget(GPU, TINY, "f16", llama(ctx_size=4096, parallel=4,
                                              allocator="slots"))
    assert (b.slot_tokens, b.kv_pool_tokens) == (1024, 4096)
    u = memory_budget(GPU, TINY, "f16", llama(ctx_size=4096, parallel=4))
    assert (u.slot_tokens, u.kv_pool_tokens) == (4096, 4096)


def test_context_padded_to_256():
    b = memory_budget(GPU, TINY, "f16", llama(ctx_size=1000))
    assert b.kv_pool_tokens == 1024 and b.kv_reserved_bytes == 1024 * 4096


def test_llama_cpp_swa_cells():
    # §3.3: SWA cache = min(n_ctx_seq, n_swa * n_parallel(unified) + n_ubatch) padded to 256
    m = load_model("gemma-3-12b")
    b = memory_budget(GPU, m, "q4_k_m", llama(ctx_size=32768, parallel=4))
    swa = (1024 * 4 + 512)
    assert b.extra["swa_cells"] == (swa,)
    assert b.kv_reserved_bytes == 65536 * 32768 + 327680 * swa


def test_vllm_block_arithmetic_issue_10517():
    # docs/reference/engines.md §1.1: 3.81 GiB of KV -> 1952 blocks = 31,232 tokens -> 1.56x at 20k
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


# vLLM (the newest release, 0.24.0: util 0.92, CUDA graphs inside the share) on an RTX 4090
# (driver-reported total 24080 MiB = 25,249,710,080 B, llamacpp-004 in
# ../shared/measurements/engine-memory-logs.csv; kvsim.config.device_memory), Llama-3.1-8B
# bf16, profiled activation pinned to 1 GiB; docs/reference/engines.md §1.1 /
# hardware_profiles/engines/vllm.yaml:
#   share      int(0.92 x 25,249,710,080)                                  = 23,229,733,273
#   non-torch  0.35 GiB = 375,809,638.4 -> 375,809,638 (issue #10517 example)
#   CUDA graph 0.65 GiB = 697,932,185.6 -> 697,932,186, inside the share from 0.21.0
#   weights    docs/reference/models.csv 8.03e9 params x 2 B                   = 16,060,000,000
#   pool       23,229,733,273 - 16,060,000,000 - 1,073,741,824 - 375,809,638 - 697,932,186
#                                                                =  5,022,249,625
#   blocks     16 tokens x 131,072 B (docs/reference/models.csv f16 KV) = 2,097,152 B per block
#              floor(5,022,249,625 / 2,097,152) = floor(2394.8) = 2394 -> 38,304 tokens
#   KV         whole blocks (vLLM allocates num_gpu_blocks pages, docs/reference/engines.md §1.1):
#              2394 x 2,097,152 = 5,020,581,888; the pool's last 1,667,737 B stay free
#   total      400 MiB driver 419,430,400 (the CUDA context, inside vLLM's non-torch 0.35 GiB,
#              so no non-torch row beyond it) + weights 16,060,000,000 + activation
#              1,073,741,824 + CUDA graph 697,932,186 + KV 5,020,581,888 = 23,271,686,298
VLLM_4090_POOL = 5_022_249_625
VLLM_4090_KV = 5_020_581_888


def _vllm_4090_bf16():
    eng = resolve_engine({"preset": "vllm", "context_tokens": 8192, "activation_bytes": GIB})
    assert (eng.non_torch_bytes, eng.cuda_graph_bytes) == (375_809_638, 697_932_186)
    return memory_budget(load_gpu("rtx-4090"), load_model("llama-3.1-8b"), "bf16", eng)


def test_vllm_pool_is_utilization_share_minus_the_rest():
    b = _vllm_4090_bf16()
    assert b.extra["share_bytes"] == 23_229_733_273
    assert b.activation_bytes == GIB
    assert b.num_gpu_blocks == 2394 and b.kv_pool_tokens == 2394 * 16 == 38_304
    # the pool holds 2394 blocks and less than one more (the hand pool above); the KV
    # reserved is those whole blocks
    assert b.extra["kv_pool_bytes"] == VLLM_4090_POOL
    assert b.kv_reserved_bytes == 2394 * 2_097_152 == VLLM_4090_KV
    assert b.total_bytes == 23_271_686_298
    assert b.fits


def test_vllm_pool_bytes_use_the_reference_weight_bytes():
    """models.csv: 8.03e9 parameters x 2 B (weight_gb_bf16 16.06); the profile once held
    8029999999.999999 and lost a byte a layer."""
    b = _vllm_4090_bf16()
    assert b.weights_total_bytes == 16_060_000_000
    assert b.extra["kv_pool_bytes"] == VLLM_4090_POOL


def test_sglang_default_fraction_24gib():
    # docs/reference/engines.md §2.1: 24564 MiB card -> reserved 3760 MiB -> 0.847
    assert sglang_gpu_defaults(24564 * MIB) == (0.847, 2048)
    assert engine_for_gpu("sglang", GPU).gpu_memory_utilization == pytest.approx(0.847, abs=1e-3)


def test_ollama_estimate_undercounts_q8_0():
    # the era-A estimator (docs/reference/engines.md §4.2) places layers up to v0.11.4
    eng = resolve_engine({"preset": "ollama", "context_tokens": 8192, "parallel": 2,
                          "flash_attn": True, "cache_type_k": "q8_0", "cache_type_v": "q8_0",
                          "ollama_version": "0.11.4"})
    b = memory_budget(GPU, load_model("llama-3.1-8b"), "q4_k_m", eng)
    # estimator: 1 byte/element; real q8_0: 34/32
    assert b.estimate.kv_bytes == 16384 * 32 * 8 * 256
    assert b.kv_reserved_bytes == 16384 * 69632
    assert b.kv_reserved_bytes * 16 == b.estimate.kv_bytes * 17


# Qwen2.5-32B (docs/reference/models.csv: 32.5e9 params, 64 layers, hidden 5120, vocab 152064, 40 q
# / 8 kv heads, head dim 128, untied embeddings) in q4_k_m as llama-quantize lays it out
# (kvsim.model.gguf_mix: Q4_K 4.5 bpw, Q6_K 6.5625 bpw) on an RTX 3060 12GB
# (12 GiB = 12,884,901,888 B), by hand:
#   embedding = output head = 152064 x 5120 = 778,567,680 params
#     token embedding Q4_K: x 4.5 / 8     = 437,944,320 B (stays on the CPU)
#     output head Q6_K:     x 6.5625 / 8  = 638,668,800 B (on the GPU last)
#   per layer  (32.5e9 - 2 x 778,567,680) / 64 = 483,482,260 params:
#     Q, K, O 5120 x (40 + 8 + 40) x 128 = 57,671,680 at Q4_K 4.5 bpw   =  32,440,320 B
#     V and ffn_down Q6_K in 32 of 64 layers (use_more_bits), Q4_K in the rest: 5.53125 bpw
#     V 5120 x 8 x 128 = 5,242,880 x 5.53125 / 8                        =   3,624,960 B
#     FFN 483,482,260 - 62,914,560 = 420,567,700: gate/up 2/3 at 4.5, down 1/3 at 5.53125
#       = 4.84375 bpw -> 420,567,700 x 4.84375 / 8                    = 254,640,599.6 B
#     -> 290,705,879.6 -> 290,705,879 B
#   f16 KV     2 x 64 x 8 x 128 x 2 = 262,144 B/token (docs/reference/models.csv) = 4,096
# B/token/layer
Q32_VRAM = 12_627_203_850  # a 12 GB card as CUDA reports it: 12 GiB less 2 %
Q32_LAYERS = 64
Q32_LAYER_W = 290_705_879
Q32_EMBED_W = 437_944_320
Q32_HEAD_W = 638_668_800
Q32_KV_TOKEN_LAYER = 262_144 // 64


def test_ollama_ignores_a_quantized_kv_type_without_flash_attention():
    # docs/reference/engines.md §4.1: OLLAMA_KV_CACHE_TYPE only applies with flash attention,
    # otherwise the cache is silently f16: llama-3.1-8b f16 KV is 131,072 B/token
    # (docs/reference/models.csv)
    eng = resolve_engine({"preset": "ollama", "context_tokens": 8192, "parallel": 2,
                          "flash_attn": False, "cache_type_k": "q8_0", "cache_type_v": "q8_0"})
    assert (eng.cache_type_k, eng.cache_type_v, eng.ignored_cache_type) == ("f16", "f16", "q8_0")
    b = memory_budget(GPU, load_model("llama-3.1-8b"), "q4_k_m", eng)
    assert b.kv_reserved_bytes == 16384 * 131_072
    assert any("OLLAMA_KV_CACHE_TYPE=q8_0 ignored" in n for n in b.notes)
    # llama-server refuses the same setting instead (tests/config/test_engine_errors.py)
    # a plan point re-validates the dump with flash attention and q8_0: nothing ignored
    on = type(eng).model_validate({**eng.model_dump(), "flash_attn": True,
                                   "cache_type_k": "q8_0", "cache_type_v": "q8_0"})
    assert (on.cache_type_v, on.ignored_cache_type) == ("q8_0", None)
    b = memory_budget(GPU, load_model("llama-3.1-8b"), "q4_k_m", on)
    assert not any("ignored" in n for n in b.notes)


def test_ollama_spills_layers_when_weights_do_not_fit():
    # docs/reference/engines.md §4.2 era-A estimator, num_ctx 4096, 1 slot, f16 (2 B/elem), FA off:
    #   kv_total  4096 x (128+128) x 8 x 2 x 64          = 1,073,741,824 (16,777,216/layer)
    #   graphs    GraphSize's qwen2 case (e 5120, h 40, vocab 152,064, c 4096, b 512):
    #             full    max(4b(e+v), 4b(1+2e+c+c h))   =   364,906,496
    #             partial 4b(e+v) + e v 105/128          =   960,581,632 (the larger)
    #   reserve   0 (OLLAMA_GPU_OVERHEAD) + 457 MiB + partial = 1,439,780,864
    #   per layer 290,705,879 + 16,777,216               =   307,483,095
    # llm/memory.go charges the GPU 457 MiB and one layer "as a buffer" first, then takes
    # layer k+1 while the card (12,627,203,850 B as CUDA reports it) > 457 MiB + (k+1)
    # layers + the larger graph + one more layer:
    #   35 layers: reserve + 36 x per_layer = 12,509,172,284 < the card; the 36th would need
    #   reserve + 37 x per_layer = 12,816,655,379 > the card.  memory.required.partial is the
    #   GPU's charge, reserve + 36 layers (the buffer and 35; not fully loaded: the partial
    #   graph); .full adds the 29 layers and the head that overflowed.  The CPU keeps 29
    #   layers, the embedding and the head.
    kv_layer = 4096 * (128 + 128) * 8 * 2
    e, v, c, b = 5120, 152_064, 4096, 512
    full = max(4 * b * (e + v), 4 * b * (1 + 2 * e + c + c * 40))
    partial = 4 * b * (e + v) + e * v * 105 // 128
    reserve = 457 * MIB + partial
    per_layer = Q32_LAYER_W + kv_layer
    assert (kv_layer, full, partial) == (16_777_216, 364_906_496, 960_581_632)
    assert (reserve, per_layer) == (1_439_780_864, 307_483_095)
    assert reserve + 36 * per_layer < Q32_VRAM < reserve + 37 * per_layer
    eng = resolve_engine({"preset": "ollama", "context_tokens": 4096,
                          "ollama_version": "0.11.4"})  # era A: the estimator places layers
    b = memory_budget(load_gpu("rtx-3060-12gb"), load_model("qwen2.5-32b"), "q4_k_m", eng)
    assert b.gpu_layers == 35 and b.estimate.gpu_layers == 35
    assert b.estimate.total_bytes == reserve + 36 * per_layer == 12_509_172_284
    assert (b.estimate.graph_partial_bytes, b.estimate.graph_full_bytes) == (partial, full)
    assert b.estimate.full_bytes == b.estimate.total_bytes + 29 * per_layer + Q32_HEAD_W
    assert b.estimate.kv_bytes == 64 * kv_layer      # memory.required.kv: the whole model's
    assert b.weights_cpu_bytes == 29 * Q32_LAYER_W + Q32_EMBED_W + Q32_HEAD_W
    # num_gpu 38 starts the runner with -ngl 38 whatever the estimate counted
    more = memory_budget(load_gpu("rtx-3060-12gb"), load_model("qwen2.5-32b"), "q4_k_m",
                         eng.model_copy(update={"gpu_layers": 38}))
    assert (more.gpu_layers, more.estimate.gpu_layers) == (38, 35)


def _llama_fit_case(gpu_layers=None):
    eng = llama(ctx_size=8192, **({} if gpu_layers is None else
                                        {"gpu_layers": gpu_layers}))
    return memory_budget(load_gpu("rtx-3060-12gb"), load_model("qwen2.5-32b"), "q4_k_m", eng)


# llama-server -c 8192 (unified, 4 slots, f16, -fa on), --fit target 1 GiB
# (docs/reference/engines.md §3.6):   target     12,884,901,888 - 1,073,741,824                 =
# 11,811,160,064   fixed      400 MiB CUDA context 419,430,400 + compute buffer
#              512 x 152064 x 4 + 512 x 5120 x 16 = 353,370,112
#              + the F16 attention mask, n_kv x n_ubatch (unified: n_kv = -c)
#              8192 x 512 x 2 = 8,388,608                          =    781,189,120
#   per layer  290,705,879 weights + 8192 x 4,096 KV (33,554,432) =   324,260,311
#   head-less  (11,811,160,064 - 781,189,120) / 324,260,311 = 34.02 -> at most 34 layers
#   output layer first (§3.6 "filling layers from the back (output layer first)";
#   llama.cpp i_gpu_start = n_layer + 1 - ngl puts layer n_layer = output on the GPU first):
#              (11,811,160,064 - 781,189,120 - 638,668,800) / 324,260,311 = 32.05 -> 32
LLAMA_FIT_TARGET = Q32_VRAM - 1024 * MIB
LLAMA_FIXED = 400 * MIB + 512 * 152064 * 4 + 512 * 5120 * 16 + 8192 * 512 * 2
LLAMA_PER_LAYER = Q32_LAYER_W + 8192 * Q32_KV_TOKEN_LAYER


def test_llama_cpp_auto_layers_leave_fit_target():
    assert (LLAMA_FIT_TARGET, LLAMA_FIXED, LLAMA_PER_LAYER) == (
        11_553_462_026, 781_189_120, 324_260_311)
    b = _llama_fit_case()
    assert b.fits and b.total_bytes <= LLAMA_FIT_TARGET
    # hand bounds: 31 layers fit even with the output head on the GPU (32 with it do
    # not); without the head 33 fit and 34 never fit: 31 (head first) or 33 (head last)
    assert LLAMA_FIXED + Q32_HEAD_W + 31 * LLAMA_PER_LAYER <= LLAMA_FIT_TARGET
    assert LLAMA_FIXED + 33 * LLAMA_PER_LAYER <= LLAMA_FIT_TARGET
    assert LLAMA_FIXED + 34 * LLAMA_PER_LAYER > LLAMA_FIT_TARGET
    assert b.gpu_layers in (31, 33)
    assert b.kv_reserved_bytes == b.gpu_layers * 8192 * Q32_KV_TOKEN_LAYER
    # the most that fit: one more layer after the output head breaks the 1 GiB target
    assert LLAMA_FIXED + Q32_HEAD_W + (b.gpu_layers + 1) * LLAMA_PER_LAYER > LLAMA_FIT_TARGET
    # an explicit -ngl 33 places the output layer last: 33 layers, the head on the CPU
    explicit = _llama_fit_case(33)
    assert explicit.weights_gpu_bytes == 33 * Q32_LAYER_W
    assert explicit.total_bytes == LLAMA_FIXED + 33 * LLAMA_PER_LAYER


def test_llama_cpp_fit_offloads_output_layer_first():
    b = _llama_fit_case()
    assert b.gpu_layers == 31
    assert b.weights_gpu_bytes == Q32_HEAD_W + 31 * Q32_LAYER_W
    assert b.total_bytes == LLAMA_FIXED + Q32_HEAD_W + 31 * LLAMA_PER_LAYER == 11_471_927_561


def test_quantized_k_needs_head_dim_multiple_of_block():
    from kvsim.errors import InputError
    with pytest.raises(InputError, match="multiple of 32"):
        memory_budget(GPU, load_model("phi-3.5-mini").model_copy(update={"layer_groups": (
            load_model("phi-3.5-mini").layer_groups[0].model_copy(update={"head_dim_k": 80}),)}),
            "q4_k_m", llama(cache_type_k="q8_0"))


# llama-server, Llama-3.1-8B q4_k_m with all 32 layers on the GPU, flash attention on:
#   embedding = head = 128,256 x 4,096 = 525,336,576 params (untied)
#   per layer (8.03e9 - 2 x 525,336,576) / 32 = 218,103,964 params, q4_k_m as
#   llama-quantize lays it out (kvsim.model.gguf_mix):
#     Q, K, O 4096 x (32 + 8 + 32) x 128 = 37,748,736 at Q4_K 4.5 bpw    =  21,233,664 B
#     V and ffn_down Q6_K 6.5625 bpw in 16 of 32 layers (use_more_bits), Q4_K 4.5 in
#     the rest: 5.53125 bpw; V 4096 x 8 x 128 = 4,194,304 x 5.53125 / 8 =   2,899,968 B
#     FFN 218,103,964 - 41,943,040 = 176,160,924: gate/up 2/3 at 4.5, down 1/3 at
#       5.53125 = 4.84375 bpw -> x 4.84375 / 8                         = 106,659,934.5 B
#     layer 130,793,566.5 -> 130,793,566 B
#   head Q6_K 525,336,576 x 6.5625 / 8                                  =   430,940,160 B
#   weights on GPU (the token embedding, Q4_K, stays on the CPU)
#              32 x 130,793,566 + 430,940,160                       = 4,616,334,272
#   compute buffer (compute_buffer.py ESTIMATE, -ub 512, FA on: no KQ term)
#              512 x 128,256 x 4 + 512 x 4,096 x 16 = 262,668,288 + 33,554,432 = 296,222,720
#              + the F16 mask n_kv x 512 x 2 = 1,024 B per cell of one stream
#              (kvsim.model.compute_buffer): with the context, below
#   fixed      400 MiB CUDA context 419,430,400 + 4,616,334,272 + 296,222,720 = 5,331,987,392
LLAMA8_Q4_FIXED = 5_331_987_392


def test_searches_find_the_boundary():
    # RTX 4090 (24,080 MiB as CUDA reports it), 4 non-unified slots, f16 KV 131,072
    # B/token (docs/reference/models.csv); 85 % line:
    #   0.85 x 25,249,710,080 = 21,462,253,568 B
    #   each cell of n_ctx: 131,072 KV + the mask's 1,024 B per cell of one slot's
    #   stream / 4 slots = 131,328 B
    #   room (21,462,253,568 - 5,331,987,392) / 131,328 = 122,824.3 cells
    #   -c is split into 4 slots padded to 256, so n_ctx moves in steps of 4 x 256 = 1024:
    #   floor(122,824.3 / 1024) x 1024 = 119 x 1024 = 121,856 (4 x 30,464)
    m, eng = load_model("llama-3.1-8b"), llama(ctx_size=32768, parallel=4,
                                               allocator="slots")
    assert max_context_at(GPU, m, "q4_k_m", eng) == 121_856
    ok = memory_budget(GPU, m, "q4_k_m", eng.model_copy(update={"ctx_size": 121_856}))
    over = memory_budget(GPU, m, "q4_k_m", eng.model_copy(update={"ctx_size": 122_880}))
    assert (ok.kv_pool_tokens, ok.slot_tokens, ok.gpu_layers) == (121_856, 30_464, 32)
    # 5,331,987,392 + 121,856 x 131,328 = 21,335,092,160 <= 21,462,253,568
    assert ok.total_bytes == LLAMA8_Q4_FIXED + 121_856 * 131_328 == 21_335_092_160
    # 5,331,987,392 + 122,880 x 131,328 = 21,469,572,032 >  21,462,253,568
    assert over.kv_pool_tokens == 122_880
    assert over.total_bytes == LLAMA8_Q4_FIXED + 122_880 * 131_328 == 21_469_572_032
    big = eng.model_copy(update={"ctx_size": 65536})
    p = max_parallel_at(GPU, m, "q4_k_m", big)
    # slots split -c, so more slots only add padding; at -c 65536 every split fits, and the
    # search stops at one 256-token pad unit per slot: 65,536 / 256 = 256 slots
    assert p == 65536 // 256 == 256
    at_p = memory_budget(GPU, m, "q4_k_m", big.model_copy(update={"parallel": p}))
    # 256 slots of 256 cells = 65,536 cells: 5,331,987,392 + 65,536 x 131,072
    # + one slot's mask 256 x 512 x 2 = 262,144 -> 13,922,184,128
    assert (at_p.slot_tokens, at_p.kv_pool_tokens) == (256, 65_536)
    assert at_p.total_bytes == 13_922_184_128 and at_p.fits and at_p.gpu_layers == 32


def test_unified_memory_budgets_against_the_default_gpu_limit():
    # docs/reference/hardware-and-models.md §4: Apple GPU-wired memory is about 65-75 % of RAM by
    # default (70 % planned); Strix Halo's carve-out is up to 96 GB; discrete cards keep
    # what the driver reports (kvsim.config.device_memory: a 4090 24,080 MiB).  M2 Ultra
    # 192 GiB x 0.70 = 144,310,901,145 B (134.4 GiB).
    m2, halo = load_gpu("apple-m2-ultra"), load_gpu("strix-halo")
    assert m2.memory_bytes == 192 * GIB and m2.usable_memory_bytes == 144_310_901_145
    assert halo.usable_memory_bytes == 96 * GIB
    assert (GPU.memory_bytes, GPU.usable_memory_bytes) == (24 * GIB, 24_080 * MIB)
    # llama-3.1-70b bf16 (131.5 GiB of weights) with 32k of f16 KV (320 KiB/token x 32768
    # = 10 GiB): within 192 GiB, above the default GPU limit, so --fit leaves layers to
    # the CPU cores
    eng, m70 = llama(ctx_size=32768), load_model("llama-3.1-70b")
    b = memory_budget(m2, m70, "bf16", eng)
    assert b.device_bytes == 144_310_901_145 and b.weights_total_bytes > 131 * GIB
    assert b.gpu_layers < b.num_layers and b.total_bytes <= b.device_bytes - 1024 * MIB
    whole = memory_budget(m2.model_copy(update={"gpu_memory_limit_bytes": None}), m70,
                          "bf16", eng)
    assert whole.device_bytes == 192 * GIB and whole.gpu_layers == whole.num_layers


def test_an_unset_context_is_the_engines_own_default():
    # docs/reference/engines.md §1.1: max_model_len defaults to the model's maximum; §3.1:
    # llama-server
    # -c 0 = the training context, which --fit may shrink (§3.6); Ollama its num_ctx
    # (§4.1): from v0.15.5 by VRAM, 24 GiB = 25,769,803,776 B >= 23 GiB (24,696,061,952)
    # and < 47 GiB -> 32768 (<= the model's 131,072); 4096 up to v0.15.4
    m = load_model("llama-3.1-8b")  # max context 131,072 (docs/reference/models.csv)
    vllm, llama_cpp = engine_for_gpu("vllm", GPU, m), engine_for_gpu("llama.cpp", GPU, m)
    assert vllm.context_tokens == 131_072
    # -c = the training context over the preset's 4 slots: 131,072 / 4 per session
    assert (llama_cpp.ctx_size, llama_cpp.context_tokens, llama_cpp.fit_context) == \
        (131_072, 32_768, True)
    assert engine_for_gpu("ollama", GPU, m).context_tokens == 32_768
    assert engine_for_gpu({"preset": "ollama", "ollama_version": "0.15.4"}, GPU,
                          m).context_tokens == 4096
    set_ = engine_for_gpu({"preset": "llama.cpp", "context_tokens": 8192}, GPU, m)
    assert (set_.context_tokens, set_.ctx_size, set_.fit_context) == (8192, 32768, False)
    assert engine_for_gpu("vllm", GPU).context_tokens == 32_768  # no model: the preset's


@pytest.mark.parametrize("gpu, shrunk", [("rtx-4090", False), ("rtx-4060-ti-16gb", True)])
def test_llama_cpp_fit_shrinks_an_unset_context_to_what_fits(gpu, shrunk):
    # llama-3.1-8b q4_k_m, f16 KV 131,072 B/token (docs/reference/models.csv), flash attention on
    # (the compute buffer grows only by the F16 mask, 512 x 2 = 1,024 B per cell of the
    # unified pool): the whole 131,072-token context fits a 24 GiB card with 1 GiB
    # left; on 16 GiB --fit keeps all 32 layers and shrinks -c to the largest multiple
    # of 256 that leaves the 1 GiB target free (§3.6) of what CUDA reports (the card
    # less 2 %, kvsim.config.device_memory); each cell costs 132,096 B
    # fixed part (weights, compute buffer, CUDA context) = LLAMA8_Q4_FIXED 5,331,987,392:
    #   4090: 5,331,987,392 + 131,072 x 132,096 = 22,646,074,304 <= 24,175,968,256
    #         (24,080 MiB less 1 GiB)
    #   4060 Ti 16 GB: room 16,836,271,800 - 1,073,741,824 = 15,762,529,976;
    #           (15,762,529,976 - 5,331,987,392) / 132,096 = 78,961.8 tokens
    #           -> largest multiple of 256: 308 x 256 = 78,848
    #           (309 x 256 = 79,104 -> 15,781,309,376 > 15,762,529,976)
    g, m = load_gpu(gpu), load_model("llama-3.1-8b")
    b = memory_budget(g, m, "q4_k_m", engine_for_gpu("llama.cpp", g, m))
    assert b.gpu_layers == 32
    if not shrunk:
        assert b.kv_pool_tokens == 131_072
        assert b.total_bytes == LLAMA8_Q4_FIXED + 131_072 * 132_096 == 22_646_074_304
        return
    assert b.kv_pool_tokens == 78_848
    # KV 78,848 x 131,072 = 10,334,765,056; 5,331,987,392 + 78,848 x 132,096 = 15,747,492,800
    assert b.kv_reserved_bytes == 78_848 * 131_072 == 10_334_765_056
    assert b.total_bytes == 15_747_492_800
    assert any("--fit shrank the context" in n for n in b.notes)


def test_ollama_cannot_shift_deepseek2_models():
    # docs/reference/engines.md §4.5: context shift on a full slot, except DeepSeek2-family (MLA)
    # models
    assert engine_for_gpu("ollama", GPU, load_model("llama-3.1-8b")).context_shift
    assert not engine_for_gpu("ollama", GPU, load_model("deepseek-v2-lite")).context_shift
    assert not engine_for_gpu({"preset": "ollama", "context_shift": True}, GPU,
                              load_model("deepseek-v2-lite")).context_shift


def test_llama_cpp_fit_puts_moe_experts_in_ram_before_layers():
    # docs/reference/engines.md §3.6: --fit puts MoE expert tensors in system RAM first.
    # Qwen3-30B-A3B (docs/reference/models.csv: 30.5B total, 3.3B active, 128 experts, 8 active, 48
    # layers, hidden 2048, 32 q / 4 kv heads x 128, vocab 151936) in q8_0 (8.5 bits):
    #   experts  128 x (30.5e9 - 3.3e9) / 120 = 29.01e9, but at most a layer's weights
    #            less its attention: (30.5e9 - 2 x 151936 x 2048) / 48 - 2048 x 128 x 72
    #            = 603.58e6 params -> 641,300,661 B per layer
    # RTX 4090, -c 32768: all on the GPU needs more than 23 GiB, so the experts of m
    # layers move to RAM, m the fewest that fit; attention and KV stay (KV all on GPU)
    g, m = GPU, load_model("qwen3-30b-a3b")
    expert = 641_300_661
    b = memory_budget(g, m, "q8_0", llama(ctx_size=32768))
    room = g.usable_memory_bytes - 1024 * MIB
    assert b.gpu_layers == 48 and b.cpu_expert_layers > 0 and b.kv_cpu_bytes == 0
    assert b.total_bytes <= room < b.total_bytes + expert  # one layer fewer would not fit
    embed = 151936 * 2048 * 8.5 / 8
    assert b.weights_cpu_bytes == int(embed) + b.cpu_expert_layers * expert
    assert not b.all_layers_on_gpu
    # a dense model spills whole layers as before
    assert memory_budget(g, load_model("llama-3.1-8b"), "q8_0",
                         llama(ctx_size=32768)).cpu_expert_layers == 0
