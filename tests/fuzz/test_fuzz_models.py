"""Fuzz: model files for ``kvsim profiles import`` — HF config.json objects with mutated
keys and values, and GGUF headers written with ``gguf.GGUFWriter`` with mutated keys,
types and values — then ``kvsim fit`` on what imported.

Each run must exit 0 or print one ``error:`` line and exit 2 (tests/fuzz/conftest.py).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import gguf
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz.helpers import FUZZ

CONFIG = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
          "max_position_embeddings": 4096, "intermediate_size": 512}
HF_KEYS = sorted(set(CONFIG) | {
    "n_layer", "num_layers", "d_model", "n_embd", "n_head", "head_dim", "n_positions",
    "moe_intermediate_size", "sliding_window", "use_sliding_window", "sliding_window_pattern",
    "layer_types", "attn_layer_period", "attn_layer_offset", "full_attention_interval",
    "attention_chunk_size", "no_rope_layers", "state_size", "conv_kernel", "expand",
    "num_heads", "n_groups", "mamba_expand", "mamba_d_state", "mamba_d_conv",
    "linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "kv_lora_rank", "qk_rope_head_dim",
    "num_experts", "num_local_experts", "n_routed_experts", "tie_word_embeddings",
    "_name_or_path", "text_config"})
MODEL_TYPES = ["llama", "mamba", "mamba2", "jamba", "qwen3_next", "gemma2", "gemma3",
               "llama4", "deepseek_v3", "gpt_oss", "mistral", ""]
EDGE: list[Any] = [0, -1, 1, 2, 3, 7, 64, 2**31, 2**63, 10**30, 0.5, 1e308, math.nan,
                   math.inf, "", "x", "ünï ✓", True, False, None, [], {}, [1, 0, 1, 0],
                   ["sliding_attention", "full_attention"] * 2, {"num_hidden_layers": 2}]


@st.composite
def config_json(draw: st.DrawFn) -> Any:
    cfg: dict[str, Any] = dict(CONFIG, model_type=draw(st.sampled_from(MODEL_TYPES)))
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(HF_KEYS))
        if draw(st.integers(0, 4)) == 4:
            cfg.pop(key, None)
        else:
            cfg[key] = draw(st.sampled_from(EDGE) | st.integers(-3, 5000))
    return cfg if draw(st.integers(0, 9)) < 9 else draw(st.sampled_from([[], 1, "x", None]))


def _import_then_fit(clean_exit, folder: Path, model_file: Path) -> None:
    profile = folder / "model.yaml"
    code, _, _ = clean_exit(["profiles", "import", str(model_file), "-o", str(profile)])
    if code == 0:
        clean_exit(["fit", "--gpu", "rtx-4090", "--model", str(profile)])


@settings(FUZZ, max_examples=80)
@given(cfg=config_json())
@example(cfg={**CONFIG, "attn_layer_period": "x", "model_type": "jamba"})  # found: TypeError
@example(cfg={**CONFIG, "linear_num_value_heads": 2})  # found: KeyError 'linear_num_key_heads'
@example(cfg={**CONFIG, "layer_types": [1, 2]})
def test_config_json(clean_exit, tmp_path, cfg):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(cfg, allow_nan=True), encoding="utf-8")
        _import_then_fit(clean_exit, Path(d), path)


GGUF_KEYS = ["block_count", "embedding_length", "attention.head_count",
             "attention.head_count_kv", "context_length", "vocab_size", "attention.key_length",
             "attention.value_length", "attention.kv_lora_rank", "rope.dimension_count",
             "attention.sliding_window", "attention.sliding_window_pattern", "ssm.inner_size",
             "ssm.state_size", "ssm.conv_kernel", "ssm.group_count", "ssm.time_step_rank"]
GOOD_GGUF = {"block_count": 4, "embedding_length": 256, "attention.head_count": 4,
             "attention.head_count_kv": 2, "context_length": 4096, "vocab_size": 1000}
ARCHS = ["llama", "gemma3", "gemma2", "mamba", "mamba2", "deepseek2", "jamba", "gpt-oss"]
GGUF_VALUES = st.one_of(
    st.tuples(st.just("u32"), st.sampled_from([0, 1, 2, 4, 6, 512, 2**32 - 1])),
    st.tuples(st.just("i32"), st.sampled_from([-1, -(2**31), 3])),
    st.tuples(st.just("f32"), st.sampled_from([0.5, math.nan, math.inf, 4.0])),
    st.tuples(st.just("bool"), st.booleans()),
    st.tuples(st.just("str"), st.sampled_from(["", "x", "ünï"])),
    st.tuples(st.just("arr"), st.lists(st.integers(0, 8), max_size=5)),
    st.tuples(st.just("arr"), st.lists(st.booleans(), min_size=1, max_size=5)))


def _add(w: gguf.GGUFWriter, key: str, kind: str, v: Any) -> None:
    adders = {"u32": w.add_uint32, "i32": w.add_int32, "f32": w.add_float32,
              "bool": w.add_bool, "str": w.add_string, "arr": w.add_array}
    adders[kind](key, v)


@st.composite
def gguf_header(draw: st.DrawFn) -> tuple[str, dict[str, tuple[str, Any]]]:
    arch = draw(st.sampled_from(ARCHS))
    kv = {k: ("u32", v) for k, v in GOOD_GGUF.items()}
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(GGUF_KEYS))
        if draw(st.integers(0, 4)) == 4:
            kv.pop(key, None)
        else:
            kv[key] = draw(GGUF_VALUES)
    return arch, kv


@settings(FUZZ, max_examples=60)
@given(header=gguf_header(), cut=st.sampled_from([None, None, None, 10, 40, 200]))
@example(header=("llama", {}), cut=None)
@example(header=("mamba", {**{k: ("u32", v) for k, v in GOOD_GGUF.items()},
                           "ssm.state_size": ("str", "x"), "ssm.inner_size": ("u32", 4)}),
         cut=None)  # found: TypeError in the recurrent state size
def test_gguf_headers(clean_exit, tmp_path, header, cut):
    arch, kv = header
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = Path(d) / "m.gguf"
        w = gguf.GGUFWriter(str(path), arch)
        for key, (kind, v) in kv.items():
            _add(w, f"{arch}.{key}", kind, v)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if cut is not None:
            path.write_bytes(path.read_bytes()[:cut])
        _import_then_fit(clean_exit, Path(d), path)
