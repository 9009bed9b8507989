"""Token embedding and output head: tied models (one tensor, duplicated on the GPU by
llama.cpp) and the formats that keep both at bf16 (AWQ, GPTQ, FP8).

Shared arithmetic (catalogue profiles from docs/reference/models.csv):

- Llama-3.1-8B: 8.03e9 params, untied, E = 128,256 x 4,096 = 525,336,576 params per
  vocab x hidden tensor; layers (8.03e9 - 2E) / 32 = 218,103,964 params each.
- Gemma-3-12B: 11.77e9 text params, tied (HF Gemma3TextConfig tie_word_embeddings
  True), E = 262,208 x 3,840 = 1,006,878,720; layers (11.77e9 - E) / 48 =
  224,231,693.33 params each.
"""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.config.specs import ModelSpec
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import resolve_engine
from kvsim.model.weights import WeightSplit, model_weights, tied_embeddings

GPU = load_gpu("rtx-4090")
E_LLAMA8, E_GEMMA12 = 525_336_576, 1_006_878_720


@pytest.mark.parametrize("fmt,per_layer,total", [
    # 218,103,964 x 4.15625 / 8 = 113,311,825.05 -> 113,311,825 B a layer;
    # x 32 = 3,625,978,400 + 2E x 2 B = 2,101,346,304 -> 5,727,324,704 (5.73 GB)
    ("awq", 113_311_825, 5_727_324_704),
    ("gptq", 113_311_825, 5_727_324_704),
    # 218,103,964 x 1 B = 218,103,964; x 32 = 6,979,326,848 + 2,101,346,304 = 9,080,673,152
    ("fp8", 218_103_964, 9_080_673_152),
])
def test_int4_and_fp8_keep_embedding_and_head_at_bf16(fmt, per_layer, total):
    w = model_weights(load_model("llama-3.1-8b"), fmt)
    assert (w.per_layer_bytes, w.embedding_bytes, w.head_bytes) == (
        per_layer, 2 * E_LLAMA8, 2 * E_LLAMA8)
    assert w.total_bytes == total


def test_a_gguf_file_keeps_its_head_in_q6_k_and_its_embedding_in_the_base_type():
    # llama-quantize Q4_K_M (kvsim.model.gguf_mix): token embedding Q4_K,
    # E x 4.5 / 8 = 295,501,824; output head Q6_K, E x 6.5625 / 8 = 430,940,160.
    # A layer (218,103,964 params): Q, K, O 16,777,216 + 4,194,304 + 16,777,216 and
    # gate/up 2/3 of the other 176,160,924 = 117,440,616 at Q4_K (4.5 bpw); V 4,194,304
    # and down 58,720,308 at Q6_K in 16 of the 32 layers (use_more_bits: 0-3, 6, 9, ...,
    # 27, 28-31), Q4_K in the rest: 5.53125 bpw on average.
    # 155,189,352 x 4.5 / 8 + 62,914,612 x 5.53125 / 8 = 130,793,566.45 -> 130,793,566;
    # x 32 + the two = 4,911,836,096 B = 4.57 GiB (llama-bench prints 4.58 GiB for this
    # file: docs/reference/measurements-prs)
    w = model_weights(load_model("llama-3.1-8b"), "q4_k_m")
    assert (w.embedding_bytes, w.head_bytes) == (295_501_824, 430_940_160)
    assert w.per_layer_bytes == 130_793_566
    assert w.total_bytes == 4_911_836_096


def test_a_tied_awq_model_keeps_its_one_embedding_at_bf16():
    # Qwen3-4B (tied, docs/reference/models.csv notes): E = 151,936 x 2,560 = 388,956,160 params
    # once, x 2 B = 777,912,320; layers (4.02e9 - E) / 36 = 100,862,328.89 x 4.15625 / 8 =
    # 52,401,131.81 -> 52,401,131; x 36 = 1,886,440,716 + 777,912,320 = 2,664,353,036
    w = model_weights(load_model("qwen3-4b"), "awq")
    assert w.tied and w.non_repeating_bytes == w.embedding_bytes == w.head_bytes == 777_912_320
    assert w.total_bytes == 2_664_353_036


def test_the_profiles_say_which_models_tie():
    tied = {"gemma-2-9b", "gemma-2-27b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b",
            "llama-3.2-1b", "llama-3.2-3b", "qwen3-4b", "mamba-2-2.7b"}
    for name in tied | {"llama-3.1-8b", "qwen3-8b", "gpt-oss-20b", "phi-3.5-mini"}:
        m = load_model(name)
        assert m.tied_embeddings is (name in tied), name


def test_notes_are_the_fallback_when_the_field_is_unset():
    base = load_model("llama-3.1-8b").model_dump()
    unset = ModelSpec(**{**base, "tied_embeddings": None, "notes": "tied embeddings"})
    field_wins = ModelSpec(**{**base, "tied_embeddings": False, "notes": "tied embeddings"})
    assert tied_embeddings(unset) and not tied_embeddings(field_wins)


# Gemma-3-12B q4_k_m (kvsim.model.gguf_mix): a layer of 224,231,693.33 params holds Q, O
# 3,840 x 4,096 and K, V 3,840 x 2,048 (47,185,920) and 177,045,773.33 of FFN; Q, K, O and
# 2/3 of the FFN at Q4_K (4.5 bpw), V and the FFN's down third Q6_K in 24 of 48 layers
# (5.53125 on average): 134,751,523.07 -> 134,751,523 B, x 48 = 6,468,073,104; the tied
# tensor Q6_K, E x 6.5625 / 8 = 825,955,200 (published Q4_K_M files: 7.3 GB)
G12_LAYERS, G12_E = 6_468_073_104, 825_955_200


def test_llama_cpp_duplicates_a_tied_head_on_the_gpu():
    # the brief's case: fit --gpu rtx-4090 --model gemma-3-12b --context 8192 --parallel 1
    eng = resolve_engine({"preset": "llama.cpp", "context_tokens": 8192, "parallel": 1})
    b = memory_budget(GPU, load_model("gemma-3-12b"), "q4_k_m", eng)
    assert b.gpu_layers == 48 and b.head_on_gpu
    # GPU: 48 layers + the output copy = 6,468,073,104 + 825,955,200 = 7,294,028,304;
    # host: the input embedding, 825,955,200; loaded 8,119,983,504 (file + the copy)
    assert b.weights_gpu_bytes == G12_LAYERS + G12_E == 7_294_028_304
    assert b.weights_cpu_bytes == G12_E
    assert b.weights_total_bytes == 8_119_983_504


def test_gemma_3_27b_head_is_counted():
    # E = 262,208 x 5,376 = 1,409,630,208 params, tied: Q6_K, x 6.5625 / 8 = 1,156,337,280
    # (27.0e9 - E) / 62 = 412,747,899.87 a layer: Q, O 5,376 x 4,096 each, K, V 5,376 x
    # 2,048 each (66,060,288), the other 346,687,611.87 FFN; Q4_K_M gives V and down
    # Q6_K in 30 of 62 layers: (Q + K + O + 2/3 FFN) x 4.5 / 8 + (V + 1/3 FFN) x
    # (30 x 6.5625 + 32 x 4.5) / 62 / 8 = 247,960,368.51 -> 247,960,368 x 62
    # = 15,373,542,816; + head = 16,529,880,096 on the GPU (published Q4_K_M files of
    # Gemma 3 27B: 16.5 GB)
    eng = resolve_engine({"preset": "llama.cpp", "context_tokens": 4096, "parallel": 1})
    b = memory_budget(GPU, load_model("gemma-3-27b"), "q4_k_m", eng)
    assert b.gpu_layers == 62 and b.weights_cpu_bytes == 1_156_337_280
    assert b.weights_gpu_bytes == 16_529_880_096


def test_paged_engines_hold_a_tied_tensor_once():
    # vLLM bf16: 224,231,693.33 x 2 = 448,463,386.67 -> 448,463,386 x 48 = 21,526,242,528
    # + E x 2 B = 2,013,757,440 -> 23,539,999,968 (11.77e9 x 2, less 32 B of truncation),
    # + the checkpoint's SigLIP encoder and projector, 421,290,864 x 2 B = 842,581,728
    # (tests/model/test_vision.py) -> 24,382,581,696
    m = load_model("gemma-3-12b")
    for preset in ("vllm", "sglang"):
        eng = resolve_engine({"preset": preset, "context_tokens": 4096})
        b = memory_budget(GPU, m, "bf16", eng)
        assert (b.weights_gpu_bytes, b.weights_total_bytes, b.weights_cpu_bytes) == (
            24_382_581_696, 24_382_581_696, 0)


def test_tied_split_by_hand():
    # 4 layers of 100 B, one 30 B tied tensor
    w = WeightSplit(format="x", bits_per_weight=8.0, total_bytes=430, per_layer_bytes=100,
                    non_repeating_bytes=30, embedding_bytes=30, num_layers=4, tied=True)
    assert w.head_bytes == 30
    # llama.cpp full offload: 400 + the head copy 30 on the GPU, the embedding 30 in RAM
    assert (w.gpu_bytes(4), w.cpu_bytes(4), w.loaded_bytes(4)) == (430, 30, 460)
    # -ngl 2 (head last): 200 on the GPU; 200 + the one tensor 30 in RAM
    assert (w.gpu_bytes(2), w.cpu_bytes(2)) == (200, 230)
    # --fit (head first): 200 + the copy 30 on the GPU; 230 in RAM
    assert (w.gpu_bytes(2, head_first=True), w.cpu_bytes(2, head_first=True)) == (230, 230)
    # paged: everything on the GPU, the tensor once
    assert (w.gpu_bytes(4, embedding_on_gpu=True), w.cpu_bytes(4, embedding_on_gpu=True)) \
        == (430, 0)
    untied = WeightSplit(format="x", bits_per_weight=8.0, total_bytes=460, per_layer_bytes=100,
                         non_repeating_bytes=60, embedding_bytes=30, num_layers=4)
    assert (untied.gpu_bytes(2), untied.cpu_bytes(2)) == (200, 260)
    assert untied.loaded_bytes(2) == untied.loaded_bytes(4, embedding_on_gpu=True) == 460
