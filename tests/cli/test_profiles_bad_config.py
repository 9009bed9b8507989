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


@pytest.mark.parametrize("name", ["", "a/b", "../x", "UPPER", "-x"])
def test_bad_names(tmp_path, kvsim_cli, name):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(OK))
    rc, err, _ = kvsim_cli("profiles", "import", cfg, "--name", name)
    assert (rc, err) == (2, (f"error: --name: '{name}' — a profile slug: lowercase letters, "
                            "digits, '.', '-' and '_', starting with a letter or digit "
                            "(e.g. my-model-8b)"))


def test_a_good_config_still_imports(tmp_path, kvsim_cli):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(OK))
    rc, err, out = kvsim_cli("profiles", "import", cfg, "--name", "my-model_8b.v2")
    assert (rc, err) == (0, "") and "name: my-model_8b.v2" in out
