"""Weight bytes per format from documented bits per weight, and the per-layer split."""

import pytest

from kvsim.config.catalog import load_model
from kvsim.errors import InputError
from kvsim.model.weights import model_weights, weight_format


@pytest.mark.parametrize("fmt,bpw", [
    ("bf16", 16), ("fp8", 8), ("q8_0", 8.5), ("q6_k", 210 * 8 / 256), ("q5_k_m", 5.68),
    ("q4_k_m", 4.84), ("q4_0", 4.5), ("iq4_xs", 136 * 8 / 256), ("awq", 4 + 20 / 128),
    ("gptq", 4 + 20 / 128),
    # the formats engine-memory-logs.csv rows name: Q4_K_S 4.58 (llama.cpp tools/quantize
    # README, Llama-2-7B table); IQ4_NL ggml block_iq4_nl = f16 scale + 16 B = 18 B / 32;
    # NVFP4 = 16 E2M1 nibbles (8 B) + one E4M3 scale (1 B) per 16 values
    ("q4_k_s", 4.58), ("iq4_nl", 18 * 8 / 32), ("nvfp4", 9 * 8 / 16)])
def test_bits_per_weight(fmt, bpw):
    assert weight_format(fmt).bits_per_weight == pytest.approx(bpw)


def test_nvfp4_keeps_the_embedding_and_head_at_16_bits():
    # a ModelOpt NVFP4 checkpoint quantises the decoder's linear layers; embed_tokens and
    # lm_head stay bf16. Llama-3.1-8B: 6,979,326,848 layer parameters x 4.5 / 8 +
    # 2 x 525,336,576 (128256 x 4096) x 2 B = 3,925,871,352 + 2,101,346,304 = 6,027,217,656 B
    # (the split truncates each of 32 layers to whole bytes: 24 B less)
    w = model_weights(load_model("llama-3.1-8b"), "nvfp4")
    assert w.non_repeating_bytes == 2 * 525_336_576 * 2
    assert w.total_bytes == 6_027_217_656 - 24


def test_bf16_total_is_params_times_two():
    # docs/reference/models.csv weight_gb_bf16 = params_total * 2 bytes (GB = 1e9)
    w = model_weights(load_model("llama-3.1-8b"), "bf16")
    assert w.total_bytes == pytest.approx(16.06e9, rel=1e-6)


def test_q4_0_is_the_reference_column_plus_its_q6_k_head():
    # docs/reference/models.csv weight_gb_q4_4p5bpw = params * 4.5 / 8 = 7.62e9 x 0.5625
    # = 4,286,250,000 B; a Q4_0 file (llama-quantize) keeps the untied output head in Q6_K:
    # 152,064 x 3,584 = 544,997,376 params x (6.5625 - 4.5) / 8 = 140,507,136 B more
    # -> 4,426,757,136 (the layers' bytes are truncated once: 4 B less)
    w = model_weights(load_model("qwen2.5-7b"), "q4_0")
    assert w.head_bytes - w.embedding_bytes == 140_507_136
    assert w.total_bytes == 4_426_757_132
    assert w.total_bytes == pytest.approx(4.29e9 + 140_507_136, rel=2e-3)


def test_split_sums_and_partial_offload():
    w = model_weights(load_model("llama-3.1-8b"), "q4_k_m")
    assert w.per_layer_bytes * 32 + w.non_repeating_bytes == w.total_bytes
    assert w.gpu_bytes(0) == 0
    assert w.gpu_bytes(10) == 10 * w.per_layer_bytes
    # full offload: output head on the GPU, token embedding stays on the CPU (llama.cpp)
    assert w.gpu_bytes(32) + w.embedding_bytes == w.total_bytes
    assert w.gpu_bytes(32, embedding_on_gpu=True) == w.total_bytes


def test_unknown_format():
    with pytest.raises(InputError, match="closest"):
        weight_format("q4_k_x")
