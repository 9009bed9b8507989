"""`kvsim profiles list/show/import`."""

import json
from pathlib import Path

import gguf  # core dependency: a missing gguf is a broken install, not a skip
import numpy as np
import pytest
import yaml

from kvsim.cli import main
from kvsim.config.catalog import load_model


def run(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.mark.parametrize("kind,expect", [("gpus", "rtx-4060-ti-16gb"), ("models", "gemma-3-12b"),
                                         ("links", "pcie5-x16"), ("hosts", "desktop-64gb"),
                                         ("engines", "llama.cpp")])
def test_list(capsys, kind, expect):
    code, out, _ = run(capsys, "profiles", "list", kind)
    assert code == 0 and expect in out


def test_list_all_and_bad_kind(capsys):
    code, out, _ = run(capsys, "profiles", "list")
    assert code == 0 and "rtx-5090" in out and "deepseek-v3" in out
    code, _, err = run(capsys, "profiles", "list", "gpu")
    assert code == 2 and "one of gpus" in err and len(err.strip().splitlines()) == 1


def test_show(capsys):
    code, out, _ = run(capsys, "profiles", "show", "llama-3.1-8b")
    assert code == 0 and "full 131072 B/token" in out
    code, out, _ = run(capsys, "profiles", "show", "rtx-4090")
    assert code == 0 and yaml.safe_load(out)["default_link"] == "pcie4-x16"
    code, _, err = run(capsys, "profiles", "show", "rtx-4091")
    assert code == 2 and "closest" in err and "Traceback" not in err


def _gguf(path: Path) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(8)
    w.add_embedding_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_context_length(8192)
    w.add_vocab_size(1000)
    w.add_tensor("token_embd.weight", np.zeros((1000, 128), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_import_gguf_to_file_then_fit(capsys, tmp_path):
    out_yaml = tmp_path / "tiny.yaml"
    code, out, _ = run(capsys, "profiles", "import", str(_gguf(tmp_path / "t.gguf")),
                       "-o", str(out_yaml))
    assert code == 0 and "4096 B/token" in out
    m = load_model(str(out_yaml))
    assert (m.num_layers, m.num_kv_heads, m.head_dim) == (8, 2, 64)
    code, out, _ = run(capsys, "fit", "--gpu", "rtx-4090", "--model", str(out_yaml),
                       "--weights", "f16", "--ctx-size", "8192", "--kv", "q8_0", "--json")
    assert code == 0 and json.loads(out)["kv_reserved_bytes"] == 17 * 2**20


def test_import_config_json_prints_yaml(capsys, tmp_path):
    cfg = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
           "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
           "max_position_embeddings": 131072, "sliding_window": 131072,
           "use_sliding_window": False, "intermediate_size": 18944}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, out, err = run(capsys, "profiles", "import", str(tmp_path / "config.json"))
    assert code == 0
    doc = yaml.safe_load(out)
    assert doc["layer_groups"] == [{"kind": "full", "layers": 28,
                                    "layer_indices": list(range(28)), "n_kv_heads": 4,
                                    "head_dim_k": 128, "head_dim_v": 128}]
    assert "57344 B/token" in err          # docs/reference/models.csv Qwen2.5-7B


@pytest.mark.parametrize("content,needle", [
    (b"GGUF\x03\x00\x00\x00", "truncated"), (b"hello, not a model", "not a GGUF")])
def test_import_bad_gguf(capsys, tmp_path, content, needle):
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    out = tmp_path / "never.yaml"
    code, _, err = run(capsys, "profiles", "import", str(p), "-o", str(out))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_import_config_missing_fields(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    code, _, err = run(capsys, "profiles", "import", str(tmp_path / "config.json"))
    assert code == 2 and "missing from config.json" in err and "Traceback" not in err
