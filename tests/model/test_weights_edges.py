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


def test_gguf_formats_keep_their_whole_file_rate():
    # q4_k_m 4.84 bpw over every tensor: E x 0.605 = 317,828,628.48 -> 317,828,628
    w = model_weights(load_model("llama-3.1-8b"), "q4_k_m")
    assert w.embedding_bytes == w.head_bytes == 317_828_628


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


# Gemma-3-12B q4_k_m (4.84 bpw = 0.605 B): a layer 224,231,693.33 x 0.605 =
# 135,660,174.47 -> 135,660,174 B, x 48 = 6,511,688,352; the tied tensor
# E x 0.605 = 609,161,625.6 -> 609,161,625
G12_LAYERS, G12_E = 6_511_688_352, 609_161_625


def test_llama_cpp_duplicates_a_tied_head_on_the_gpu():
    # the brief's case: fit --gpu rtx-4090 --model gemma-3-12b --context 8192 --parallel 1
    eng = resolve_engine({"preset": "llama.cpp", "context_tokens": 8192, "parallel": 1})
    b = memory_budget(GPU, load_model("gemma-3-12b"), "q4_k_m", eng)
    assert b.gpu_layers == 48 and b.head_on_gpu
    # GPU: 48 layers + the output copy = 6,511,688,352 + 609,161,625 = 7,120,849,977;
    # host: the input embedding, 609,161,625; loaded 7,730,011,602 (file + the copy)
    assert b.weights_gpu_bytes == G12_LAYERS + G12_E == 7_120_849_977
    assert b.weights_cpu_bytes == G12_E
    assert b.weights_total_bytes == 7_730_011_602


def test_gemma_3_27b_head_is_counted():
    # E = 262,208 x 5,376 = 1,409,630,208 x 0.605 = 852,826,275.84 -> 852,826,275
    # (27.0e9 - E) / 62 = 412,747,899.87 x 0.605 = 249,712,479.42 -> 249,712,479 x 62
    # = 15,482,173,698; + head = 16,334,999,973 on the GPU
    eng = resolve_engine({"preset": "llama.cpp", "context_tokens": 4096, "parallel": 1})
    b = memory_budget(GPU, load_model("gemma-3-27b"), "q4_k_m", eng)
    assert b.gpu_layers == 62 and b.weights_cpu_bytes == 852_826_275
    assert b.weights_gpu_bytes == 16_334_999_973


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
