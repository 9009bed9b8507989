"""llama.cpp's compute buffer grows with the context by its attention masks.

Facts (kvsim/model/compute_buffer.py): one mask per KV cache of n_kv x n_ubatch elements,
F16 with flash attention, F32 without (plus the F32 KQ scores, n_head x n_ubatch x n_kv);
n_kv is one stream's cells.  Measured with the llama-server that scripts/
build_llama_server.sh builds (CPU, kvsim's tiny GGUF, one slot, "CPU compute buffer size"):
  -fa on  -ub 512: -c 4096 10.51 MiB ... -c 131072 134.51 MiB
  -fa on  -ub 256: -c 4096  5.26 MiB,    -c 16384   11.26 MiB
  -fa off -ub 512: -c 4096 43.01 MiB,    -c 32768  323.01 MiB
"""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.budget import memory_budget
from kvsim.engines.memory import MIB
from kvsim.engines.resolve import engine_for_gpu
from kvsim.model.compute_buffer import llama_cpp_compute_bytes

GPU = load_gpu("rtx-4090")
LLAMA8 = load_model("llama-3.1-8b")
# the fixed part for Llama-3.1-8B at -ub 512 (ESTIMATE, unchanged):
#   logits 512 x 128,256 x 4 = 262,668,288; hidden 512 x 4,096 x 16 = 33,554,432
LLAMA8_FIXED = 296_222_720


def _llama_cpp(model, **kw):
    return engine_for_gpu({"preset": "llama.cpp", **kw}, GPU, model)


@pytest.mark.parametrize("ctx, mib_at", [(4096, 10.51), (131072, 134.51)])
def test_growth_matches_the_measured_flash_attention_buffer(ctx, mib_at):
    # the tiny GGUF (tests/e2e): 4 heads; measured 134.51 - 10.51 = 124 MiB over
    # 131,072 - 4,096 = 126,976 cells = 1,024 B a cell = 512 x 2 (the F16 mask)
    tiny = LLAMA8.model_copy(update={"num_attention_heads": 4})
    grow = llama_cpp_compute_bytes(tiny, 512, ctx, True) - llama_cpp_compute_bytes(
        tiny, 512, 4096, True)
    assert grow == round((mib_at - 10.51) * MIB) == (ctx - 4096) * 1024


def test_growth_scales_with_the_micro_batch_and_without_flash_attention():
    tiny = LLAMA8.model_copy(update={"num_attention_heads": 4})
    # -ub 256: 11.26 - 5.26 = 6 MiB over 12,288 cells = 512 B a cell = 256 x 2
    assert llama_cpp_compute_bytes(tiny, 256, 16384, True) - llama_cpp_compute_bytes(
        tiny, 256, 4096, True) == 6 * MIB
    # -fa off: 323.01 - 43.01 = 280 MiB over 28,672 cells = 10,240 B a cell
    #          = 512 x (4 heads x 4 B scores + 4 B F32 mask)
    assert llama_cpp_compute_bytes(tiny, 512, 32768, False) - llama_cpp_compute_bytes(
        tiny, 512, 4096, False) == 280 * MIB


@pytest.mark.parametrize("ctx, compute", [
    # -c 4096:   296,222,720 + 512 x 4,096 x 2 (4,194,304)       = 300,417,024 (286.50 MiB)
    (4096, 300_417_024),
    # -c 131072: 296,222,720 + 512 x 131,072 x 2 (134,217,728)   = 430,440,448 (410.50 MiB)
    (131072, 430_440_448),
])
def test_llama_8b_buffer_grows_with_the_context(ctx, compute):
    b = memory_budget(GPU, LLAMA8, "q4_k_m", _llama_cpp(LLAMA8, ctx_size=ctx))
    assert b.activation_bytes == compute
    assert f"compute buffer size = {compute / MIB:.2f} MiB" in "\n".join(b.log_lines)


def test_one_stream_per_slot_masks_one_slots_cells():
    # -c 16384 -np 4 without -kvu: n_ctx_seq 4,096 cells per stream, as -c 4096 unified
    b = memory_budget(GPU, LLAMA8, "q4_k_m", _llama_cpp(
        LLAMA8, ctx_size=16384, parallel=4, allocator="slots"))
    assert (b.slot_tokens, b.activation_bytes) == (4096, 300_417_024)


def test_without_flash_attention_scores_and_an_f32_mask():
    # -c 4096 -fa off: 296,222,720 + scores 32 x 512 x 4,096 x 4 (268,435,456)
    #                  + mask 512 x 4,096 x 4 (8,388,608)             = 573,046,784
    b = memory_budget(GPU, LLAMA8, "q4_k_m", _llama_cpp(
        LLAMA8, ctx_size=4096, flash_attn=False))
    assert b.activation_bytes == 573_046_784


def test_iswa_model_has_a_full_and_a_sliding_mask():
    # gpt-oss-20b -c 65536, 4 slots unified, -ub 512:
    #   fixed  512 x 201,088 x 4 + 512 x 2,880 x 16 = 411,828,224 + 23,592,960 = 435,421,184
    #   full mask 512 x 65,536 x 2                                       =  67,108,864
    #   SWA cells min(65,536, 128 x 4 + 512) = 1,024 (a multiple of 256): 512 x 1,024 x 2
    #                                                                    =   1,048,576
    #   435,421,184 + 67,108,864 + 1,048,576 = 503,578,624 (480.25 MiB; was 415.25)
    m = load_model("gpt-oss-20b")
    b = memory_budget(GPU, m, "mxfp4", _llama_cpp(m, ctx_size=65536))
    assert b.extra["swa_cells"] == (1024,)
    assert b.activation_bytes == 503_578_624
    # one stream per slot: 16,384 full cells a stream, SWA min(16,384, 128 + 512) = 640
    #   -> padded to 768; 435,421,184 + 512 x (16,384 + 768) x 2 (17,563,648) = 452,984,832
    s = memory_budget(GPU, m, "mxfp4", _llama_cpp(m, ctx_size=65536, allocator="slots"))
    assert s.extra["swa_cells"] == (4 * 768,)
    assert s.activation_bytes == 452_984_832


def test_a_pure_recurrent_model_has_no_mask():
    # Mamba-2: no attention layers, so no KQ mask and no scores at any context
    m = load_model("mamba-2-2.7b")
    assert llama_cpp_compute_bytes(m, 512, 131072, True) == llama_cpp_compute_bytes(
        m, 512, 4096, False) == 512 * m.vocab_size * 4 + 512 * m.hidden_size * 16
