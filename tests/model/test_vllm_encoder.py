"""vLLM's profiling pass over a vision-language checkpoint's image encoder
(kvsim.engines.vllm_encoder): how many dummy images it encodes, its peak, and what it
takes from the KV pool, against the published start-up logs of the two Qwen3.5-family
rows (../shared/measurements/engine-memory-logs.csv, copied to
docs/reference/measurements/)."""

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu
from kvsim.engines.vllm_encoder import (
    encoder_cache_bytes,
    encoder_pass,
    encoder_peak_bytes,
    patch_peak_bytes,
    with_encoder_pass,
)
from kvsim.errors import InputError
from kvsim.model.vision import patches_per_image, vision_params
from kvsim.validate.memlog_predict import engine_spec, memory_rows
from kvsim.validate.memlog_text import read_settings
from kvsim.validate.memlogs import read_memory_rows

PUBLISHED = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "measurements"
             / "engine-memory-logs.csv")


def _engine(model: str, gpu: str = "rtx-5090", **knobs):
    g, m = load_gpu(gpu), load_model(model)
    return m, engine_for_gpu({"preset": "vllm", **knobs}, g, m, "nvfp4")


def test_one_largest_qwen_image_when_the_batch_budget_is_smaller():
    # vllm-011's settings; a Qwen3.5-family start-up log prints exactly this line
    # (noonghunna/club-3090 issue #1047)
    m, e = _engine("qwen3.6-35b-a3b", context_tokens=131072, max_num_batched_tokens=8192,
                   max_num_seqs=1)
    p = encoder_pass(m, e)
    assert (p.items, p.tokens_per_item, p.budget_tokens) == (1, 16384, 16384)
    assert p.log_line() == ("Encoder cache will be initialized with a budget of 16384 tokens, "
                            "and profiled with 1 image items of the maximum feature size.")
    assert patches_per_image(m.vision_encoder) == 16384 * 4


@pytest.mark.parametrize("knobs,items", [
    ({"max_num_batched_tokens": 2048}, 8),           # budget // 256
    ({"max_num_batched_tokens": 8192}, 32),
    # max_model_len below one image: one image a prompt, max_num_seqs prompts
    ({"max_num_batched_tokens": 2048, "context_tokens": 200, "max_num_seqs": 3}, 3),
])
def test_small_images_fill_the_budget_up_to_the_sequences_prompts(knobs, items):
    m, e = _engine("gemma-3-12b", **{"context_tokens": 32768, "max_num_seqs": 256, **knobs})
    assert encoder_pass(m, e).items == items


def test_no_pass_for_text_models_unsized_encoders_and_v0():
    m, e = _engine("llama-3.1-8b")
    assert encoder_pass(m, e) is None
    g = load_model("gemma-3-12b")
    unknown = g.model_copy(update={"vision_encoder": g.vision_encoder.model_copy(
        update={"max_image_tokens": 0})})
    _, e = _engine("gemma-3-12b")
    assert encoder_pass(unknown, e) is None
    _, v0 = _engine("gemma-3-12b", version="0.7.3")
    assert encoder_pass(g, v0) is None


def test_peak_per_patch():
    qwen = load_model("qwen3.6-35b-a3b").vision_encoder
    # residual + norm (2 x 1,152) and fc1 + GELU (2 x 4,304) in 16-bit, 3 x 2 x 16 x 16
    # float32 pixels
    assert patch_peak_bytes(qwen) == 2 * (2 * 1152 + 2 * 4304) + 4 * 1536 == 27968
    assert patch_peak_bytes(qwen, tp=2) == 2 * (2 * 1152 + 4304) + 4 * 1536 == 19360
    vl = load_model("qwen2.5-vl-7b").vision_encoder        # gated: gate/up + product
    assert patch_peak_bytes(vl) == 2 * (2 * 1280 + 3 * 3420) + 4 * 3 * 2 * 14 * 14 == 30344


def test_the_larger_of_the_encoder_and_the_language_models_batch_beside_its_outputs():
    m, e = _engine("qwen3.6-35b-a3b", context_tokens=131072, max_num_batched_tokens=8192,
                   max_num_seqs=1)
    p = encoder_pass(m, e)
    peak = encoder_peak_bytes(m, p)
    assert peak == 65536 * 27968
    assert encoder_cache_bytes(m, p) == 16384 * 2048 * 2
    assert with_encoder_pass(10**8, m, p) == peak
    assert with_encoder_pass(2 * peak, m, p) == 2 * peak + 16384 * 2048 * 2


def test_the_pool_gives_up_the_difference():
    m, e = _engine("qwen3.6-35b-a3b", context_tokens=131072, max_num_batched_tokens=8192,
                   max_num_seqs=1)
    g = load_gpu("rtx-5090")
    text = m.model_copy(update={"vision_encoder": m.vision_encoder.model_copy(
        update={"max_image_tokens": 0})})
    a, b = memory_budget(g, m, "nvfp4", e), memory_budget(g, text, "nvfp4", e)
    assert a.activation_bytes == 65536 * 27968
    assert b.extra["kv_pool_bytes"] - a.extra["kv_pool_bytes"] == (a.activation_bytes
                                                                  - b.activation_bytes)
    assert a.log_lines[0].startswith("Encoder cache will be initialized")
    assert any("encodes 1 dummy image(s) of 16,384 tokens" in n for n in a.notes)


def test_tensor_ranks_run_the_encoder_split():
    # vllm-007's shape: Qwen3.8-27B fp8 on two RTX 3090s, tensor parallel 2
    g, m = load_gpu("rtx-3090"), load_model("qwen3.8-27b")
    e = engine_for_gpu({"preset": "vllm", "tensor_parallel_size": 2, "context_tokens": 131072,
                        "max_num_batched_tokens": 8192, "max_num_seqs": 2,
                        "gpu_memory_utilization": 0.92, "cache_type_k": "fp8",
                        "cache_type_v": "fp8"}, g, m, "fp8", more_gpus=(g,))
    b = memory_budget(g, m, "fp8", e, more_gpus=(g,))
    assert b.activation_bytes == 2 * 65536 * 19360       # each rank: the split encoder


@pytest.mark.parametrize("rid", ["vllm-011", "vllm-007"])
def test_the_vision_language_rows_are_within_15_percent(rid):
    ms = {m.id: m for m in read_memory_rows(_csv_rows(), PUBLISHED.name)}
    rows, _ = memory_rows(ms[rid])
    kv = next(r for r in rows if r["metric"] == "kv_tokens")
    # before the encoder's pass was sized: +17.4 % (vllm-011) and +17.8 % (vllm-007)
    assert abs(kv["rel_err"]) < 0.15, kv


def _csv_rows() -> list[dict[str, str]]:
    with open(PUBLISHED, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_language_model_only_drops_the_encoder_and_its_pass():
    g = load_gpu("rtx-5090")
    m, e = _engine("qwen3.6-35b-a3b", context_tokens=131072, max_num_batched_tokens=8192,
                   max_num_seqs=1)
    text = e.model_copy(update={"language_model_only": True})
    a, b = memory_budget(g, m, "nvfp4", e), memory_budget(g, m, "nvfp4", text)
    assert encoder_pass(m, text) is None
    assert a.weights_total_bytes - b.weights_total_bytes == 2 * vision_params(m.vision_encoder)
    assert b.extra["kv_pool_bytes"] - a.extra["kv_pool_bytes"] == (
        a.weights_total_bytes - b.weights_total_bytes + a.activation_bytes - b.activation_bytes)
    assert not any(line.startswith("Encoder cache") for line in b.log_lines)
    assert any("--language-model-only" in n for n in b.notes)


def test_language_model_only_is_vllms_knob():
    g, m = load_gpu("rtx-5090"), load_model("qwen3.6-35b-a3b")
    with pytest.raises(InputError) as err:
        engine_for_gpu({"preset": "sglang", "language_model_only": True}, g, m, "nvfp4")
    assert err.value.field == "engine.language_model_only"
    e = engine_for_gpu({"preset": "vllm", "language_model_only": True}, g, m, "nvfp4")
    assert e.language_model_only is True


def test_a_logged_language_model_only_start_up_drops_the_encoder():
    knobs, _ = read_settings("max_model_len=131072; language_model_only=true", "x")
    assert knobs == {"max_model_len": 131072, "language_model_only": True}
    m = {r.id: r for r in read_memory_rows(_csv_rows(), PUBLISHED.name)}["vllm-011"]
    text = replace(m, settings={**m.settings, "language_model_only": True})
    spec, notes = engine_spec(text)
    assert spec["language_model_only"] is True and not any("language" in n for n in notes)
    kv = [next(r for r in memory_rows(x)[0] if r["metric"] == "kv_tokens")["predicted"]
          for x in (m, text)]
    assert kv[1] > kv[0]


def test_a_family_whose_largest_item_is_a_video_is_not_sized():
    # Qwen2.5-VL: vLLM's dummy video grows with max_model_len (vllm PR #25631)
    m, e = _engine("qwen2.5-vl-7b", gpu="rtx-4090", context_tokens=32768)
    assert m.vision_encoder.video_largest and encoder_pass(m, e) is None
    b = memory_budget(load_gpu("rtx-4090"), m, "nvfp4", e)
    assert any("dummy video" in n and "does not size" in n for n in b.notes)
    assert not any(line.startswith("Encoder cache") for line in b.log_lines)
