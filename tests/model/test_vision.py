"""Vision-language checkpoints: the image encoder's size (kvsim.model.vision) and where it
is loaded (vLLM / SGLang with the checkpoint; a llama.cpp GGUF leaves it to its mmproj)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu
from kvsim.engines.sglang import vlm_fraction_factor
from kvsim.model.importers import model_from_hf_config
from kvsim.model.vision import vision_bytes, vision_from_hf, vision_params
from kvsim.model.weights import model_weights

CONFIGS = Path(__file__).resolve().parents[2] / "scripts" / "data" / "hf-configs"
R3090 = load_gpu("rtx-3090")


@pytest.mark.parametrize(("slug", "published", "tol"), [
    # the Gemma 3 technical report, table 1: one 417M SigLIP encoder for 4B/12B/27B (the
    # count here adds the projector, an RMSNorm and 1152 x 2560 at 4B: +0.7 %)
    ("gemma-3-4b", 417e6, 0.01),
    # the Qwen2.5-VL technical report, table 1: a 675M ViT
    ("qwen2.5-vl-7b", 675e6, 0.005),
    # Qwen3.6-27B's tensor list (its config copy's source): vision tower 460,730,096, exactly
    ("qwen3.6-27b", 460_730_096, 0),
])
def test_encoder_counts_match_the_published_ones(slug, published, tol):
    v = load_model(slug).vision_encoder
    assert v is not None
    assert vision_params(v) == pytest.approx(published, rel=tol)


def test_every_gemma3_size_carries_the_same_encoder_with_its_own_projector():
    encoders = {s: load_model(s).vision_encoder for s in ("gemma-3-4b", "gemma-3-12b",
                                                           "gemma-3-27b")}
    blocks = {v.model_copy(update={"out_hidden_size": 1}) for v in encoders.values()}
    assert len(blocks) == 1
    # the projector maps 1152 to the text width: 1152 x (5376 - 2560) more at 27B
    diff = vision_params(encoders["gemma-3-27b"]) - vision_params(encoders["gemma-3-4b"])
    assert diff == 1152 * (5376 - 2560)


def test_text_checkpoints_and_unsized_encoders_weigh_nothing():
    assert load_model("llama-3.1-8b").vision_encoder is None
    assert vision_bytes(load_model("llama-3.1-8b")) == 0
    assert load_model("gemma-4-31b").vision_encoder is None   # no vision_config at hand
    # DeepStack mergers (Qwen3-VL) are a layout kvsim does not count: not sized, not guessed
    qwen3vl = {"model_type": "qwen3_vl", "vision_config": {
        "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "patch_size": 16,
        "out_hidden_size": 4096, "deepstack_visual_indexes": [8, 16, 24]}}
    assert vision_from_hf(qwen3vl) is None
    assert vision_from_hf({"model_type": "llama", "hidden_size": 4096}) is None


def test_the_importer_reads_the_vision_config(tmp_path):
    raw = json.loads((CONFIGS / "qwen3.6-35b-a3b.json").read_text(encoding="utf-8"))
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw), encoding="utf-8")
    v = model_from_hf_config(p, name="mine").vision_encoder
    assert v == load_model("qwen3.6-35b-a3b").vision_encoder
    assert (v.position_embeddings, v.spatial_merge_size, v.out_hidden_size) == (2304, 2, 2048)
    del raw["vision_config"]
    p.write_text(json.dumps(raw), encoding="utf-8")
    assert model_from_hf_config(p, name="mine").vision_encoder is None


def _budget(model, preset, weights="q4_k_m", gpus=(R3090,)):
    cfg = engine_for_gpu({"preset": preset, "context_tokens": 8192}, gpus[0], model,
                         weights=weights, more_gpus=tuple(gpus[1:]))
    return memory_budget(gpus[0], model, weights, cfg, more_gpus=tuple(gpus[1:]))


@pytest.mark.parametrize("preset", ["vllm", "sglang"])
def test_paged_engines_load_the_encoder_in_16_bit_and_the_pool_pays_for_it(preset):
    gemma = load_model("gemma-3-12b")
    text = gemma.model_copy(update={"vision_encoder": None})
    with_v, without = _budget(gemma, preset, "awq"), _budget(text, preset, "awq")
    enc = 2 * vision_params(gemma.vision_encoder)           # 16-bit in a 4-bit checkpoint
    assert with_v.weights_gpu_bytes - without.weights_gpu_bytes == enc
    assert with_v.weights_total_bytes == model_weights(gemma, "awq").total_bytes + enc
    # vLLM's profiling pass also encodes dummy images (tests/engines/test_vllm_encoder.py)
    extra = with_v.activation_bytes - without.activation_bytes
    assert (extra > 0) == (preset == "vllm")
    # SGLang lowers its default memory share instead (test below)
    share = without.extra["share_bytes"] - with_v.extra["share_bytes"]
    assert (share > 0) == (preset == "sglang")
    assert without.extra["kv_pool_bytes"] - with_v.extra["kv_pool_bytes"] == enc + extra + share
    assert with_v.num_gpu_blocks < without.num_gpu_blocks
    assert any("image encoder" in n and "16-bit" in n for n in with_v.notes)
    # only vLLM has a profiling pass that runs the encoder
    assert any("profiling pass" in n for n in with_v.notes) == (preset == "vllm")
    assert not any("image encoder" in n for n in without.notes)


def test_tensor_ranks_each_hold_their_share_of_the_encoder():
    gemma = load_model("gemma-3-27b")
    text = gemma.model_copy(update={"vision_encoder": None})
    two = (R3090, R3090)
    with_v, without = _budget(gemma, "vllm", "awq", two), _budget(text, "vllm", "awq", two)
    enc = 2 * vision_params(gemma.vision_encoder)
    for d, d0 in zip(with_v.devices, without.devices, strict=True):
        assert d.weights_bytes - d0.weights_bytes == enc // 2


def test_llama_cpp_leaves_the_encoder_to_the_mmproj_file():
    gemma = load_model("gemma-3-12b")
    text = gemma.model_copy(update={"vision_encoder": None})
    a, b = _budget(gemma, "llama.cpp"), _budget(text, "llama.cpp")
    assert (a.weights_gpu_bytes, a.kv_reserved_bytes) == (b.weights_gpu_bytes,
                                                          b.kv_reserved_bytes)


@pytest.mark.parametrize("model,factor", [
    # SigLIP: 27 layers of 1,152 → ratio 27 x 1152² / (24 x 1024²) = 1.42383
    ("gemma-3-12b", 0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1))),
    # a Qwen-VL config names its layers `depth`: SGLang reads 24 → ratio 1152² / 1024²
    ("qwen3.6-35b-a3b", 0.95 * (1 - 0.1 * (1152**2 / 1024**2 - 1))),
    ("llama-3.1-8b", 1.0),
])
def test_sglang_lowers_its_default_fraction_for_a_vision_language_checkpoint(model, factor):
    g, m = load_gpu("rtx-4090"), load_model(model)
    assert vlm_fraction_factor(m.vision_encoder) == pytest.approx(factor)
    e = engine_for_gpu({"preset": "sglang", "context_tokens": 8192}, g, m, "fp8")
    assert e.gpu_memory_utilization == pytest.approx(0.847 * factor)   # 24 GiB, TP 1
    given = engine_for_gpu({"preset": "sglang", "context_tokens": 8192,
                            "gpu_memory_utilization": 0.8}, g, m, "fp8")
    assert given.gpu_memory_utilization == 0.8                          # a given one wins
