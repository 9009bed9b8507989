"""HF config.json and GGUF header importers → the geometry of the shipped profiles."""

import json

import gguf  # core dependency: a missing gguf is a broken install, not a skip
import numpy as np
import pytest

from kvsim.config.catalog import load_model
from kvsim.errors import InputError
from kvsim.model.geometry import kv_geometry
from kvsim.model.importers import import_model, model_from_gguf, model_from_hf_config


def write_tiny_gguf(path, *, swa=None, layers=8, head=False, ff=None, expert_ff=None):
    w = gguf.GGUFWriter(str(path), "llama")
    if ff is not None:
        w.add_feed_forward_length(ff)
    if expert_ff is not None:
        w.add_expert_feed_forward_length(expert_ff)
    w.add_name("Tiny Llama")
    w.add_block_count(layers)
    w.add_embedding_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_context_length(8192)
    w.add_vocab_size(1000)
    if swa:
        w.add_sliding_window(swa)
    w.add_tensor("token_embd.weight", np.zeros((1000, 128), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((128, 128), dtype=np.float32))
    if head:
        w.add_tensor("output.weight", np.zeros((1000, 128), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_header_geometry(tmp_path):
    m = model_from_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"))
    assert (m.num_layers, m.num_kv_heads, m.head_dim, m.max_context_tokens) == (8, 2, 64, 8192)
    assert m.params_total == 1000 * 128 + 128 * 128      # from tensor shapes
    g = kv_geometry(m)
    assert g.kv_bytes_per_token == 2 * 8 * 2 * 64 * 2   # 4096 B/token at f16


def test_gguf_head_tied_when_the_file_has_no_output_tensor(tmp_path):
    # llama.cpp loads token_embd again as the head when output.weight is absent
    assert model_from_gguf(write_tiny_gguf(tmp_path / "a.gguf")).tied_embeddings is True
    own = model_from_gguf(write_tiny_gguf(tmp_path / "b.gguf", head=True))
    assert own.tied_embeddings is False and own.params_total == 2 * 1000 * 128 + 128 * 128


@pytest.mark.parametrize("extra,tied,embeds", [
    ({"tie_word_embeddings": False}, False, 2), ({"tie_word_embeddings": True}, True, 1),
    ({}, None, 2),                                   # unknown: counted as untied
    ({"model_type": "gemma3_text"}, True, 1)])       # Gemma's class default: tied
def test_config_json_tied_embeddings(tmp_path, extra, tied, embeds):
    base = {k: v for k, v in LLAMA_31_8B.items() if k != "tie_word_embeddings"}
    (tmp_path / "config.json").write_text(json.dumps({**base, **extra}))
    m = model_from_hf_config(tmp_path / "config.json")
    assert m.tied_embeddings is tied
    untied = {**base, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(untied))
    ref = model_from_hf_config(tmp_path / "config.json").params_total
    # 128256 x 4096 embedding rows once (tied) or twice
    assert ref - m.params_total == (2 - embeds) * 128256 * 4096


def test_gguf_sliding_window_all_layers(tmp_path):
    m = model_from_gguf(write_tiny_gguf(tmp_path / "swa.gguf", swa=512))
    assert [g.kind for g in m.layer_groups] == ["sliding"]
    assert kv_geometry(m).windowed_cap_bytes_per_seq == 4096 * 512


def test_truncated_and_non_gguf(tmp_path):
    good = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(good[:50])
    (tmp_path / "text.gguf").write_bytes(b"not a gguf at all")
    for name in ("cut.gguf", "text.gguf"):
        with pytest.raises(InputError, match="not a GGUF file or truncated"):
            import_model(tmp_path / name)


LLAMA_31_8B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
               "intermediate_size": 14336, "max_position_embeddings": 131072,
               "tie_word_embeddings": False, "_name_or_path": "meta-llama/Llama-3.1-8B"}
GEMMA3_12B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 48,
                              "hidden_size": 3840, "num_attention_heads": 16,
                              "num_key_value_heads": 8, "head_dim": 256,
                              "sliding_window": 1024, "sliding_window_pattern": 6,
                              "vocab_size": 262208, "max_position_embeddings": 131072}}
DEEPSEEK_V2_LITE = {"model_type": "deepseek_v2", "num_hidden_layers": 27, "hidden_size": 2048,
                    "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512,
                    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                    "vocab_size": 102400, "max_position_embeddings": 163840}
JAMBA = {"model_type": "jamba", "num_hidden_layers": 32, "hidden_size": 4096,
         "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 65536,
         "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4,
         "mamba_expand": 2, "max_position_embeddings": 262144}


@pytest.mark.parametrize("cfg,slug", [(LLAMA_31_8B, "llama-3.1-8b"), (GEMMA3_12B, "gemma-3-12b"),
                                      (DEEPSEEK_V2_LITE, "deepseek-v2-lite"),
                                      (JAMBA, "jamba-v0.1")])
def test_config_json_matches_catalogue_geometry(tmp_path, cfg, slug):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    got = kv_geometry(model_from_hf_config(p), "f16", "f16", state_dtype="f16")
    want = kv_geometry(load_model(slug), "f16", "f16", state_dtype="f16")
    assert (got.full_bytes_per_token, got.windowed_bytes_per_token,
            got.windowed_cap_bytes_per_seq, got.recurrent_bytes_per_seq) == (
        want.full_bytes_per_token, want.windowed_bytes_per_token,
        want.windowed_cap_bytes_per_seq, want.recurrent_bytes_per_seq)


def test_config_json_param_estimate_is_close():
    # dense estimate vs the model card's 8.03B
    import pathlib
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / "config.json"
        p.write_text(json.dumps(LLAMA_31_8B))
        assert model_from_hf_config(p).params_total == pytest.approx(8.03e9, rel=0.01)


@pytest.mark.parametrize("drop", ["num_hidden_layers", "hidden_size", "vocab_size",
                                  "num_attention_heads", "max_position_embeddings"])
def test_config_json_missing_fields(tmp_path, drop):
    cfg = {k: v for k, v in LLAMA_31_8B.items() if k != drop}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="missing from config.json"):
        model_from_hf_config(p)


def test_config_json_not_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{ not json")
    with pytest.raises(InputError, match="not valid JSON"):
        import_model(p)


def _tiny_config(**extra):
    return {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4,
            "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1024,
            "vocab_size": 32000, "max_position_embeddings": 4096, **extra}


def test_a_config_without_a_name_is_not_named_after_its_folder(tmp_path):
    import json

    folder = tmp_path / "path"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_tiny_config()))
    spec = import_model(folder / "config.json")
    assert spec.name.startswith("llama-0.") and spec.name.endswith("b") and "path" not in spec.name
    assert "name from model_type" in spec.notes
    cache = tmp_path / "models--meta-llama--Llama-3.2-1B" / "snapshots" / "4e20de36"
    cache.mkdir(parents=True)
    (cache / "config.json").write_text(json.dumps(_tiny_config()))
    spec = import_model(cache / "config.json")
    assert (spec.name, spec.hf_repo) == ("llama-3.2-1b", "meta-llama/Llama-3.2-1B")


def _gemma4(**extra):
    """A Gemma 4 text_config: 5 sliding layers then 1 full, as gemma-4-31B-it's (head_dim 256 /
    global_head_dim 512, 16 KV heads / 4 global), two periods."""
    return {"model_type": "gemma4", "text_config": {
        "model_type": "gemma4_text", "hidden_size": 5376, "num_hidden_layers": 12,
        "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256,
        "global_head_dim": 512, "num_global_key_value_heads": 4, "sliding_window": 1024,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2,
        "vocab_size": 262144, "max_position_embeddings": 262144, **extra}}


@pytest.mark.parametrize("k_eq_v, full_heads", [(True, 4), (False, 16)])
def test_gemma4_global_layers_have_their_own_head_dim(tmp_path, k_eq_v, full_heads):
    # HF Gemma4 uses num_global_key_value_heads only on K=V (attention_k_eq_v) global layers;
    # global_head_dim on every global layer
    p = tmp_path / "config.json"
    p.write_text(json.dumps(_gemma4(attention_k_eq_v=k_eq_v)))
    full, sliding = model_from_hf_config(p, "g4").layer_groups
    assert (full.layer_indices, full.n_kv_heads, full.head_dim_k, full.head_dim_v) == (
        (5, 11), full_heads, 512, 512)
    assert (sliding.layers, sliding.n_kv_heads, sliding.head_dim_k, sliding.window_tokens) == (
        10, 16, 256, 1024)
    # 2 global layers x 2 (K, V) x heads x 512 x 2 B per token
    geo = kv_geometry(model_from_hf_config(p, "g4"), "f16", "f16")
    assert geo.full_bytes_per_token == 2 * 2 * full_heads * 512 * 2


def test_config_without_global_head_dim_keeps_one_geometry(tmp_path):
    cfg = _gemma4(attention_k_eq_v=True)
    del cfg["text_config"]["global_head_dim"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    full, _ = model_from_hf_config(p, "g4").layer_groups
    assert (full.n_kv_heads, full.head_dim_k) == (16, 256)


def test_ffn_widths_come_from_the_config_and_the_header(tmp_path):
    # the widths set a GGUF k-quant's fallback types (kvsim.model.gguf_mix)
    (tmp_path / "config.json").write_text(json.dumps(_tiny_config(
        intermediate_size=1856, moe_intermediate_size=1408)))
    m = model_from_hf_config(tmp_path / "config.json")
    assert (m.ffn_intermediate_size, m.moe_intermediate_size) == (1856, 1408)
    (tmp_path / "config.json").write_text(json.dumps({**_tiny_config(
        shared_expert_intermediate_size=512), "intermediate_size": None}))
    assert model_from_hf_config(tmp_path / "config.json").ffn_intermediate_size == 512
    g = model_from_gguf(write_tiny_gguf(tmp_path / "w.gguf", ff=1856, expert_ff=704))
    assert (g.ffn_intermediate_size, g.moe_intermediate_size) == (1856, 704)
    bare = model_from_gguf(write_tiny_gguf(tmp_path / "bare.gguf"))
    assert (bare.ffn_intermediate_size, bare.moe_intermediate_size) == (None, None)


def test_a_bad_ffn_width_is_refused_naming_the_key(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_tiny_config(moe_intermediate_size=-1)))
    with pytest.raises(InputError, match="moe_intermediate_size"):
        model_from_hf_config(tmp_path / "config.json")
    with pytest.raises(InputError, match="feed_forward_length"):
        model_from_gguf(write_tiny_gguf(tmp_path / "bad.gguf", ff=[1024] * 3))  # 8 layers
