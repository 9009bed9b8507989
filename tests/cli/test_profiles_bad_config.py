"""``kvsim profiles import`` of a config.json with nonsense sizes, and bad --name: one
line and exit code 2, never a crash or a silently replaced value (audit B15/C26)."""

from __future__ import annotations

import json

import pytest

OK = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
      "intermediate_size": 14336}


@pytest.mark.parametrize("key, value, why", [
    ("hidden_size", "abc", "a positive integer"),
    ("hidden_size", 4096.5, "a positive integer"),
    ("num_attention_heads", 0, "a positive integer"),
    ("num_key_value_heads", 0, "a positive integer"),
    ("max_position_embeddings", 0, "a positive integer"),
    ("intermediate_size", -5, "a positive integer"),
    ("num_hidden_layers", True, "a positive integer"),
    ("num_key_value_heads", 64, ("a divisor of num_attention_heads (32): each KV head serves a "
                                "whole group of query heads")),
    ("num_key_value_heads", 5, ("a divisor of num_attention_heads (32): each KV head serves a "
                               "whole group of query heads")),
])
def test_bad_sizes(tmp_path, kvsim_cli, key, value, why):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**OK, key: value}))
    rc, err, _ = kvsim_cli("profiles", "import", cfg)
    shown = f"'{value}'" if isinstance(value, str) else repr(value)
    assert (rc, err) == (2, f"error: config.json 'config.json'.{key}: {shown} — {why}")


def test_sizes_inside_text_config_are_checked(tmp_path, kvsim_cli):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"text_config": {**OK, "hidden_size": 0}}))
    rc, err, _ = kvsim_cli("profiles", "import", tmp_path)
    assert rc == 2 and err.startswith("error: config.json 'config.json'.hidden_size: 0")


@pytest.mark.parametrize("name", ["", "-", "/ /"])
def test_names_without_a_letter_or_digit(tmp_path, kvsim_cli, name):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(OK))
    rc, err, _ = kvsim_cli("profiles", "import", cfg, "--name", name)
    assert (rc, err) == (2, (f"error: --name: '{name}' — a profile name with a letter or "
                            "digit (made a slug: lowercase, '-' between words, e.g. "
                            "my-model-8b)"))


@pytest.mark.parametrize("name, slug", [("Gemma-3-12B-it", "gemma-3-12b-it"),
                                        ("My Model 8B", "my-model-8b"), ("a/b", "a-b"),
                                        ("my-model-8b.v2", "my-model-8b.v2")])
def test_a_name_is_made_a_slug_as_the_default_is(tmp_path, kvsim_cli, name, slug):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(OK))
    rc, err, out = kvsim_cli("profiles", "import", cfg, "--name", name)
    assert (rc, err) == (0, "") and f"name: {slug}\n" in out
