"""The HF config.json importer refuses nonsense sizes itself, so a library caller of
``import_model`` / ``model_from_hf_config`` gets the one line ``kvsim profiles import``
prints (audit B15/C26)."""

from __future__ import annotations

import json

import pytest

from kvsim.errors import InputError
from kvsim.model.importers import import_model, model_from_hf_config

OK = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
      "intermediate_size": 14336}
DIVISOR = ("a divisor of num_attention_heads (32): each KV head serves a whole group of "
           "query heads")


@pytest.mark.parametrize("key, value, why", [
    ("hidden_size", "abc", "a positive integer"),
    ("head_dim", 127.5, "a positive integer"),
    ("num_key_value_heads", 0, "a positive integer"),
    ("vocab_size", -1, "a positive integer"),
    ("moe_intermediate_size", False, "a positive integer"),
    ("num_key_value_heads", 5, DIVISOR),
    ("global_head_dim", 0, "a positive integer"),
    # Gemma 4 E2B/E4B: their last layers read an earlier layer's K and V
    ("num_kv_shared_layers", 20, "0: layers that reuse another layer's KV are not modelled"),
])
def test_import_model_refuses_bad_sizes(tmp_path, key, value, why):
    (tmp_path / "config.json").write_text(json.dumps({**OK, key: value}))
    with pytest.raises(InputError) as exc:
        import_model(tmp_path)  # a folder: its config.json
    assert (exc.value.field, exc.value.value, exc.value.allowed) == (
        f"config.json 'config.json'.{key}", value, why)


def test_sizes_are_checked_before_a_missing_one_is_named(tmp_path):
    p = tmp_path / "my.json"
    p.write_text(json.dumps({"text_config": {"hidden_size": 0}}))
    with pytest.raises(InputError) as exc:
        model_from_hf_config(p)
    assert str(exc.value) == "config.json 'my.json'.hidden_size: 0 — a positive integer"


def test_a_good_config_imports_with_its_sizes(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(OK))
    m = import_model(p, "ok")
    assert (m.num_layers, m.num_kv_heads, m.head_dim, m.max_context_tokens) == (32, 8, 128, 8192)


def test_unreadable_json_keeps_the_importers_own_error(tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b"\xff\xfe{")
    with pytest.raises(InputError) as exc:
        import_model(p)
    assert str(exc.value) == f"config.json: '{p}' — not valid JSON"
