"""Cohere's Command-R family (scripts/gen_models_added.py): KV bytes per token worked out by
hand from each config copy (scripts/data/hf-configs/command-r*.json), the tied-embedding
default of Cohere's configs, and the names engines print for them."""

import json

import pytest

from kvsim.config.catalog import load_model
from kvsim.errors import InputError
from kvsim.model.geometry import kv_geometry
from kvsim.model.importers import model_from_hf_config
from kvsim.model.names import resolve_model
from kvsim.model.weights import model_weights

# 2 (K and V) x layers x KV heads x head_dim (hidden / heads = 128) x 2 bytes at f16
COMMAND_R_V01_KV = 2 * 40 * 64 * 128 * 2      # 1,310,720 B: MHA, 64 KV heads
COMMAND_R_PLUS_KV = 2 * 64 * 8 * 128 * 2      # 262,144 B: GQA 96/8


@pytest.mark.parametrize("slug, layers, heads, kv_heads, per_token", [
    ("command-r-v01", 40, 64, 64, COMMAND_R_V01_KV),
    ("command-r-plus", 64, 96, 8, COMMAND_R_PLUS_KV),
])
def test_kv_bytes_per_token_at_f16(slug, layers, heads, kv_heads, per_token):
    m = load_model(slug)
    assert (m.num_layers, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (
        layers, heads, kv_heads, 128)
    (g,) = m.layer_groups                      # every layer full attention, no window
    assert (g.kind, g.layers, g.n_kv_heads) == ("full", layers, kv_heads)
    geo = kv_geometry(m, "f16", "f16")
    assert geo.full_bytes_per_token == per_token
    assert geo.windowed_bytes_per_token == 0
    assert geo.bytes_for_tokens(8192) == 8192 * per_token


def test_byte_figures():
    assert COMMAND_R_V01_KV == 1_310_720 == 1.25 * 2**20
    assert COMMAND_R_PLUS_KV == 262_144


@pytest.mark.parametrize("slug, params", [("command-r-v01", 35e9), ("command-r-plus", 104e9)])
def test_profiles_load_tied_with_the_cards_counts_and_the_trained_context(slug, params):
    m = load_model(slug)
    assert (m.params_total, m.params_active) == (params, params)      # Cohere's model cards
    assert m.tied_embeddings is True
    # the config's model_max_length (the card's 128K, llama.cpp's context_length), not its
    # max_position_embeddings 8192
    assert (m.vocab_size, m.max_context_tokens) == (256000, 131072)
    assert "model_max_length" in m.notes
    # tied: one 256000-row embedding, so the f16 checkpoint is 2 B per counted parameter
    assert model_weights(m, "f16").total_bytes == pytest.approx(params * 2, rel=1e-6)


@pytest.mark.parametrize("model_type", ["cohere", "cohere2"])
def test_cohere_configs_tie_the_head_by_default(tmp_path, model_type):
    # HF CohereConfig / Cohere2Config default tie_word_embeddings=True; a config may leave it out
    cfg = {"model_type": model_type, "num_hidden_layers": 2, "hidden_size": 256,
           "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 1000,
           "intermediate_size": 512, "max_position_embeddings": 8192}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tied = model_from_hf_config(tmp_path / "config.json")
    assert tied.tied_embeddings is True
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    untied = model_from_hf_config(tmp_path / "config.json")
    assert untied.tied_embeddings is False
    assert untied.params_total - tied.params_total == 1000 * 256      # the head counted once


@pytest.mark.parametrize("text, slug, fmt", [
    ("command-r 35B Q4_K - Medium", "command-r-v01", "q4_k_m"),     # llama-bench model_type
    ("CohereForAI/c4ai-command-r-v01", "command-r-v01", None),
    ("c4ai-command-r-v01-Q4_K_M.gguf", "command-r-v01", "q4_k_m"),
    ("Command-R-v01", "command-r-v01", None),
    ("CohereForAI/c4ai-command-r-plus", "command-r-plus", None),
    ("command-r-plus", "command-r-plus", None),
])
def test_printed_names_resolve(text, slug, fmt):
    m = resolve_model(text)
    assert (m.slug, m.weight_format) == (slug, fmt), m.reason


def test_names_the_catalogue_does_not_hold_stay_unknown():
    # llama.cpp types only a 40-layer command-r (35B); Command R+ prints "command-r ?B"
    assert resolve_model("command-r ?B Q4_K - Medium").slug is None
    for text in ("CohereForAI/c4ai-command-r-08-2024", "CohereForAI/c4ai-command-r7b-12-2024"):
        m = resolve_model(text)
        assert m.slug is None and m.reason.startswith("unknown: "), m
    assert resolve_model("command-r").reason.startswith("ambiguous: ")


def test_a_command_r7b_config_has_a_global_layer_every_fourth(tmp_path):
    # HF Cohere2: a layer slides unless (i + 1) % sliding_window_pattern == 0; llama.cpp's
    # cohere2 fixes the pattern at 4. 32 layers -> 24 sliding (window 4,096), 8 global
    cfg = {"model_type": "cohere2", "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 256000, "max_position_embeddings": 132096, "sliding_window": 4096,
           "sliding_window_pattern": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = model_from_hf_config(tmp_path / "config.json")
    kinds = {g.kind: g for g in m.layer_groups}
    assert kinds["full"].layer_indices == tuple(range(3, 32, 4))
    assert (kinds["sliding"].layers, kinds["sliding"].window_tokens) == (24, 4096)
    assert m.tied_embeddings is True        # Cohere2Config's default; the key is left out


def test_a_cohere2_gguf_header_has_a_global_layer_every_fourth(tmp_path):
    import gguf
    import numpy as np

    from kvsim.model.importers import model_from_gguf

    w = gguf.GGUFWriter(str(tmp_path / "r7b.gguf"), "cohere2")
    w.add_block_count(8)
    w.add_embedding_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(8192)
    w.add_vocab_size(100)
    w.add_sliding_window(512)
    w.add_tensor("token_embd.weight", np.zeros((100, 128), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = model_from_gguf(tmp_path / "r7b.gguf")
    kinds = {g.kind: g for g in m.layer_groups}
    assert kinds["full"].layer_indices == (3, 7)
    assert (kinds["sliding"].layers, kinds["sliding"].window_tokens) == (6, 512)


def test_model_max_length_above_max_position_embeddings_is_the_context(tmp_path):
    cfg = {"model_type": "cohere", "num_hidden_layers": 2, "hidden_size": 256,
           "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 1000,
           "intermediate_size": 512, "max_position_embeddings": 8192}
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_max_length": 131072}))
    assert model_from_hf_config(tmp_path / "config.json").max_context_tokens == 131072
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_max_length": 2048}))
    assert model_from_hf_config(tmp_path / "config.json").max_context_tokens == 8192
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_max_length": "long"}))
    with pytest.raises(InputError, match="model_max_length"):
        model_from_hf_config(tmp_path / "config.json")
