"""Plan's flags for gpt-oss: openai/gpt-oss-20b *is* the MXFP4 checkpoint (docs/reference/models.csv
notes: "Released weights are MXFP4 for MoE experts"), so vLLM/SGLang are given the repo;
on llama.cpp the GGUF placeholder says which layout a format is (mxfp4: experts MXFP4,
rest BF16; mxfp4_moe, llama-quantize MXFP4_MOE: experts MXFP4, rest Q8_0)."""

import pytest

from kvsim.config.catalog import load_model
from kvsim.engines._checkpoint import released_format
from kvsim.plan.flags import configure, engine_flags, flag_notes
from kvsim.scenario import resolve_scenario


def point(weights: str, preset: str, model: str = "gpt-oss-20b"):
    s = resolve_scenario({"gpu": "rtx-5090", "model": model, "weights": weights,
                          "engine": {"preset": preset},
                          "workload": {"preset": "family-4", "days": 0.1}})
    return configure(s, 8192, 2, None, None, 0.85)


def test_released_format_is_read_from_the_profiles_notes():
    assert released_format(load_model("gpt-oss-20b")) == "mxfp4"
    assert released_format(load_model("gpt-oss-120b")) == "mxfp4"
    assert released_format(load_model("llama-3.1-8b")) is None


@pytest.mark.parametrize("preset,head", [
    ("vllm", "vllm serve openai/gpt-oss-20b --max-model-len 8192 --max-num-seqs 2 "),
    ("sglang", ("python -m sglang.launch_server --model-path openai/gpt-oss-20b "
               "--context-length 8192 --max-running-requests 2 ")),
])
def test_mxfp4_on_paged_engines_serves_the_repo_itself(preset, head):
    s = point("mxfp4", preset)
    assert engine_flags(s).startswith(head)
    assert "<" not in engine_flags(s) and "--quantization" not in engine_flags(s)
    assert flag_notes(s) == [(f"openai/gpt-oss-20b is published in MXFP4 (the model's "
                             f"notes): {preset} reads the quantization from its "
                             "config.json quantization_config")]


def test_other_formats_of_gpt_oss_still_name_a_placeholder():
    assert engine_flags(point("awq", "vllm")).startswith(
        "vllm serve <AWQ checkpoint of openai/gpt-oss-20b> ")
    assert engine_flags(point("mxfp4_moe", "vllm")).startswith(
        "vllm serve <MXFP4_MOE GGUF file of openai/gpt-oss-20b> --tokenizer openai/gpt-oss-20b ")


@pytest.mark.parametrize("weights,gguf", [
    ("mxfp4", "<MXFP4 GGUF of gpt-oss-20b: experts MXFP4, rest BF16>"),
    ("mxfp4_moe", "<MXFP4_MOE GGUF of gpt-oss-20b: experts MXFP4, rest Q8_0>"),
])
def test_llama_cpp_gguf_names_the_layout(weights, gguf):
    s = point(weights, "llama.cpp")
    # -c = 8,192 x 2 (plan's context is per session)
    assert engine_flags(s) == (f"llama-server -m {gguf} -c 16384 --parallel 2 -ctk f16 "
                               "-ctv f16 -fa on -kvu")
    assert flag_notes(s) == [(f"replace {gguf} by the path of a GGUF of gpt-oss-20b in that "
                              "layout (a file name such as ...-mxfp4.gguf does not say "
                              "which; llama-quantize MXFP4_MOE gives experts MXFP4, rest "
                              "Q8_0)")]


def test_llama_cpp_other_formats_keep_the_file_name():
    s = point("q4_k_m", "llama.cpp")
    assert engine_flags(s).startswith("llama-server -m gpt-oss-20b-q4_k_m.gguf -c 16384 ")
    assert flag_notes(s) == []
