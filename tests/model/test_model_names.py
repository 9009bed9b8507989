"""resolve_model: printed model names (benchmarks, llama-bench, file names, HF repos, Ollama
tags) -> catalogue slug and weight format, by whole tokens, never by similarity."""

import csv
from pathlib import Path

import pytest

from kvsim.config.catalog import list_names, load_model
from kvsim.model.names import ModelMatch, resolve_model
from kvsim.model.weights import weight_format_names

MEASUREMENTS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "measurements"

RESOLVED = [
    # llama.cpp scoreboards (docs/reference/measurements/llamabench-scoreboard.csv)
    ("Llama 2 7B (llama-2-7b.Q4_0.gguf)", "llama-2-7b", "q4_0"),
    ("LLaMA 7B v2 (F16)", "llama-2-7b", "f16"),
    ("LLaMA 7B v2 (Q8_0)", "llama-2-7b", "q8_0"),
    ("LLaMA 7B v2 (Q4_0)", "llama-2-7b", "q4_0"),
    ("7B Q4 (probably Llama 2 7B Q4_0)", "llama-2-7b", "q4_0"),
    # llama.cpp benches/dgx-spark.md and XiongjieDai tables (speed-vs-load.csv)
    ("gpt-oss-20b (MoE, 11.27 GiB)", "gpt-oss-20b", None),
    ("gpt-oss-120b (MoE, 59.02 GiB)", "gpt-oss-120b", None),
    ("Qwen3-Coder-30B-A3B (MoE, 30.25 GiB)", "qwen3-coder-30b-a3b", None),
    ("gemma-3-4b-it-qat (gemma3 4B, 2.35 GiB)", "gemma-3-4b", None),
    ("Llama 3 8B", "llama-3-8b", None),
    # HF repos, GGUF files, Ollama tags
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", None),
    ("meta-llama/Meta-Llama-3-8B", "llama-3-8b", None),
    ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "llama-3.1-8b", "q4_k_m"),
    ("qwen2.5-7b-instruct-q4_k_m.gguf", "qwen2.5-7b", "q4_k_m"),
    ("llama-2-7b.Q4_0.gguf", "llama-2-7b", "q4_0"),
    ("llama-2-7b-chat.Q8_0.gguf", "llama-2-7b", "q8_0"),
    ("mistral-7b-instruct-v0.1.Q4_K_M.gguf", "mistral-7b-v0.1", "q4_k_m"),
    ("mixtral-8x7b-instruct-v0.1.Q5_K_M.gguf", "mixtral-8x7b", "q5_k_m"),
    ("Qwen3-32B-Q5_K_M.gguf", "qwen3-32b", "q5_k_m"),
    ("Qwen3-32B-Q6_K", "qwen3-32b", "q6_k"),
    ("google/gemma-2-2b-it", "gemma-2-2b", None),
    ("microsoft/Phi-3-mini-4k-instruct", "phi-3-mini-4k", None),
    ("Phi-4-mini-instruct", "phi-4-mini", None),
    ("phi-4", "phi-4-14b", None),
    ("DeepSeek-R1-Distill-Qwen-7B-Q4_K_M.gguf", "deepseek-r1-distill-qwen-7b", "q4_k_m"),
    ("llama3.1:8b", "llama-3.1-8b", None),
    ("llama3:70b", "llama-3-70b", None),
    ("gpt-oss:20b", "gpt-oss-20b", None),
    ("qwen2.5-14b", "qwen2.5-14b", None),
    ("qwen2.5-1.5b", "qwen2.5-1.5b", None),
    ("Qwen2.5-0.5B-Instruct-BF16", "qwen2.5-0.5b", "bf16"),
    ("openai/gpt-oss-20b MXFP4", "gpt-oss-20b", "mxfp4"),
    # a fine-tune carries its base model's geometry
    ("CognitiveComputations/dolphin-qwen2:72b-v2.9.2-q4_k_s", "qwen2-72b", "q4_k_s"),
    # DeepSeek-R1's distills are their base models' geometry (its model card), also under
    # Ollama's deepseek-r1:<size> tags; Llama 3.3 70B is Llama 3.1 70B's
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "llama-3.1-8b", None),
    ("DeepSeek-R1-Distill-Qwen-14B-Q4_K_M.gguf", "qwen2.5-14b", "q4_k_m"),
    ("deepseek-r1:1.5b", "deepseek-r1-distill-qwen-1.5b", None),
    ("deepseek-r1:7b", "deepseek-r1-distill-qwen-7b", None),
    ("deepseek-r1:14b", "qwen2.5-14b", None),
    ("deepseek-r1:32b-qwen-distill-q8_0", "qwen2.5-32b", "q8_0"),
    ("library/deepseek-r1:70b", "llama-3.1-70b", None),
    ("llama3.3:70b", "llama-3.1-70b", None),
    ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.1-70b", None),
    ("Qwen3MoeForCausalLM (Qwen/Qwen3-30B-A3B-Instruct per PR text; inferred)",
     "qwen3-30b-a3b", None),
    # llama-bench model_type strings with one catalogue model of that type
    ("gpt-oss 20B MXFP4 MoE", "gpt-oss-20b", "mxfp4_moe"),
    ("gemma3 4B Q4_0", "gemma-3-4b", "q4_0"),
    ("llama 8x7B Q4_K - Medium", "mixtral-8x7b", "q4_k_m"),
]


@pytest.mark.parametrize("text, slug, fmt", RESOLVED)
def test_resolves(text, slug, fmt):
    m = resolve_model(text)
    assert (m.slug, m.weight_format) == (slug, fmt), m.reason
    assert m.reason and not m.reason.startswith(("ambiguous", "unknown"))
    assert slug in list_names("models")
    assert fmt is None or fmt in weight_format_names()


def test_the_hedge_is_kept_in_the_reason():
    assert "probably" in resolve_model("7B Q4 (probably Llama 2 7B Q4_0)").reason


@pytest.mark.parametrize("text, fmt", [
    ("Q4_0", "q4_0"), ("F16", "f16"), ("fp16", "f16"), ("BF16", "bf16"),
    ("Q4_K - Medium", "q4_k_m"), ("Q4_K_M", "q4_k_m"), ("q5_k - medium", "q5_k_m"),
    ("MXFP4", "mxfp4"), ("MXFP4 MoE", "mxfp4_moe"), ("IQ4_XS", "iq4_xs"), ("Q8_0", "q8_0"),
    ("Qwen3-235B-A22B-FP8", "fp8"), ("Qwen/Qwen1.5-7B-Chat-GPTQ-Int4", "gptq"),
    ("Kimi-Linear-48B-A3B-Instruct-AWQ-4bit", "awq"),
    # the model file's format comes first, not the projector's
    ("unsloth/gemma-4-31B-it-GGUF gemma-4-31B-it-IQ4_XS.gguf + BF16 mmproj", "iq4_xs"),
    # formats engine-memory-logs.csv rows use (kvsim.model.weights: their bpw and sources)
    ("dolphin-qwen2:72b-v2.9.2-q4_k_s", "q4_k_s"), ("Q4_K - Small", "q4_k_s"),
    ("nvidia/Gemma-4-31B-IT-NVFP4", "nvfp4"), ("Qwen3.6-35B-A3B-UD-IQ4_NL.gguf", "iq4_nl"),
])
def test_weight_format_named_in_the_text(text, fmt):
    assert resolve_model(text).weight_format == fmt


@pytest.mark.parametrize("text, named", [
    ("dolphin-qwen2:72b-v2.9.2-q3_k_l", "Q3_K_L"), ("Qwen3-8B-IQ2_XXS.gguf", "IQ2_XXS"),
    ("some-model-int8", "INT8"),
    # kvsim's awq / gptq are 4-bit: an 8-bit checkpoint of either is not priced as one
    ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8", "GPTQ-INT8"), ("Qwen3-8B-AWQ-8bit", "AWQ-8BIT"),
])
def test_formats_kvsim_does_not_model_are_named_not_guessed(text, named):
    m = resolve_model(text)
    assert m.weight_format is None and named in m.reason


@pytest.mark.parametrize("text, candidates", [
    ("llama 7B Q4_0", {"llama-2-7b", "mistral-7b-v0.1", "mistral-7b-v0.3"}),
    ("llama 7B", {"llama-2-7b", "mistral-7b-v0.1", "mistral-7b-v0.3"}),
    ("qwen2 7B Q8_0", {"qwen2-7b", "qwen2.5-7b", "deepseek-r1-distill-qwen-7b"}),
    ("qwen3moe 30B.A3B Q8_0", {"qwen3-30b-a3b", "qwen3-coder-30b-a3b"}),
    ("Mistral 7B", {"mistral-7b-v0.1", "mistral-7b-v0.3"}),
    ("Llama 2", {"llama-2-7b", "llama-2-13b", "llama-2-70b"}),
])
def test_ambiguous_names_say_so(text, candidates):
    m = resolve_model(text)
    assert m.slug is None and m.reason.startswith("ambiguous: ")
    assert {c for c in candidates if c in m.reason} == candidates


def test_another_part_of_the_text_narrows_a_model_type():
    # a published table's "llama 70B Q4_K_M (Llama 3.x 70B inferred; file not named)":
    # the parenthesised name keeps the Llama 3 models, "3.x" standing for 3 and 3.M
    m = resolve_model("llama 70B Q4_K_M (Llama 3.x 70B inferred; file not named)")
    assert m.slug is None and m.candidates == ("llama-3-70b", "llama-3.1-70b")
    assert "narrowed by 'llama 3.x 70b inferred; file not named'" in m.reason
    m = resolve_model("llama 70B Q4_K_M (Llama 2 70B)")
    assert (m.slug, m.weight_format) == ("llama-2-70b", "q4_k_m")
    # a hint that names none of them leaves the model type's candidates as they were
    assert resolve_model("llama 70B (Qwen 72B)").candidates == (
        "llama-2-70b", "llama-3-70b", "llama-3.1-70b")


def test_llama_bench_parameter_count_picks_the_model():
    # llama-bench model_n_params of llama-2-7b.Q4_0.gguf (LLaMA 1 7B prints the same; the
    # catalogue has no LLaMA 1)
    m = resolve_model("llama 7B Q4_0", n_params=6_738_415_616)
    assert (m.slug, m.weight_format) == ("llama-2-7b", "q4_0")
    assert "outside the catalogue" in m.reason
    # Mistral 7B's count: still two catalogue models (v0.1 and v0.3 have the same shapes)
    m = resolve_model("llama 7B Q4_0", n_params=7_241_732_096)
    assert m.slug is None and m.reason.startswith("ambiguous: ") and "llama-2-7b" not in m.reason


def test_llama_bench_model_size_picks_the_model():
    # 3.56 GiB: llama-2-7b at q4_0 is 6.738e9 x 4.5 / 8 = 3.53 GiB, Mistral 7B 3.79 GiB
    m = resolve_model("llama 7B Q4_0", size_bytes=int(3.56 * 2**30))
    assert m.slug == "llama-2-7b"


@pytest.mark.parametrize("text", [
    "Qwen2.5-Coder-14B-Instruct",               # neither qwen2.5-coder-7b nor qwen2.5-14b
    "qwen2.5vl:3b",                             # a VL model is not qwen2.5-3b, nor the 7B VL
    "Qwen2.5-Math-7B", "Qwen3-VL-235B-A22B-Instruct", "deepseek-r1:8b",  # R1-0528 moved it
    "Phi-3-medium-128k-instruct", "Phi-4-multimodal-instruct", "google/gemma-4-E4B-it",
    "Nemotron-3-Super-120B-A12B", "Qwen3.5-27B",   # neither Nano nor Qwen3.6/3.8
    "mistralai/Voxtral-Mini-4B-Realtime-2602", "Kimi-Linear-48B-A3B-Instruct",
    "DeepSeek-V4-Flash-FP8",
])
def test_models_outside_the_catalogue_are_unknown(text):
    m = resolve_model(text)
    assert m.slug is None and m.reason.startswith("unknown: "), m


@pytest.mark.parametrize("text", ["", "not shown", "not seen (vision + MTP model)",
                                  "Q4_K - Medium"])
def test_no_model_name(text):
    m = resolve_model(text)
    assert m.slug is None and m.reason.startswith("unknown: no model name")


def test_close_names_never_match_each_other():
    # token equality: 14b is not 1.5b, Llama 3 is not Llama 3.1, v0.1 is not v0.3
    assert resolve_model("Qwen2.5-14B-Instruct").slug == "qwen2.5-14b"
    assert resolve_model("Qwen2.5-1.5B-Instruct").slug == "qwen2.5-1.5b"
    assert resolve_model("Llama-3-70B").slug == "llama-3-70b"
    assert resolve_model("Llama-3.1-70B").slug == "llama-3.1-70b"
    assert resolve_model("Mistral-7B-v0.3").slug == "mistral-7b-v0.3"
    assert resolve_model("Qwen3-30B-A3B").slug == "qwen3-30b-a3b"
    assert resolve_model("Qwen3-Coder-30B-A3B-Instruct").slug == "qwen3-coder-30b-a3b"


def test_every_catalogue_slug_and_display_name_resolves_to_itself():
    for slug in list_names("models"):
        assert resolve_model(slug).slug == slug, resolve_model(slug)
        display = load_model(slug).display_name.split(" (")[0]
        assert resolve_model(display).slug == slug, (display, resolve_model(display))


def test_match_is_a_frozen_value():
    m = resolve_model("Llama 3 8B")
    assert isinstance(m, ModelMatch)
    with pytest.raises(AttributeError):
        m.slug = "x"  # type: ignore[misc]


# what the measurement files' model columns name, and the catalogue has
MEASURED = {
    "Llama 2 7B (llama-2-7b.Q4_0.gguf)": "llama-2-7b", "LLaMA 7B v2 (F16)": "llama-2-7b",
    "LLaMA 7B v2 (Q8_0)": "llama-2-7b", "LLaMA 7B v2 (Q4_0)": "llama-2-7b",
    "7B Q4 (probably Llama 2 7B Q4_0)": "llama-2-7b", "Llama 3 8B": "llama-3-8b",
    "gpt-oss-20b (MoE, 11.27 GiB)": "gpt-oss-20b", "gpt-oss-20b (MoE)": "gpt-oss-20b",
    "gpt-oss-120b (MoE, 59.02 GiB)": "gpt-oss-120b",
    "Qwen3-Coder-30B-A3B (MoE, 30.25 GiB)": "qwen3-coder-30b-a3b",
    "gemma-3-4b-it-qat (gemma3 4B, 2.35 GiB)": "gemma-3-4b",
    "gemma-3-4b-it-qat (gemma3 4B)": "gemma-3-4b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3-8B": "llama-3-8b", "llama3.1:8b": "llama-3.1-8b",
    "gpt-oss:20b": "gpt-oss-20b", "Qwen3-32B-Q5_K_M.gguf": "qwen3-32b",
    "Qwen3-32B-Q6_K": "qwen3-32b",
    "Qwen2.5-Coder-7B (qwen2 7B, 7.54 GiB)": "qwen2.5-coder-7b",   # never qwen2.5-7b
    "Qwen2.5-Coder-7B (qwen2 7B)": "qwen2.5-coder-7b",
    # models added from their config.json for engine-memory-logs.csv (scripts/gen_models_added.py)
    "unsloth Nemotron-3-Nano-30B-A3B-Q6_K.gguf": "nemotron-3-nano-30b-a3b",
    "qwen3.6-35b-a3b-nvfp4 (local path)": "qwen3.6-35b-a3b",
    "unsloth/Qwen3.6-35B-A3B-MTP-GGUF Qwen3.6-35B-A3B-UD-IQ4_NL.gguf": "qwen3.6-35b-a3b",
    "GianniDPC Qwen3.6-27B-MTP-IQ4_XS-PURE.gguf (13.5 GiB)": "qwen3.6-27b",
    "Qwen3.8-27B-FP8 (hybrid: 16 of 64 layers full attention per PR text)": "qwen3.8-27b",
    "Qwen/Qwen1.5-7B-Chat-GPTQ-Int4": "qwen1.5-7b",
    "Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "Qwen3-Coder-480B-A35B-Instruct-FP8": "qwen3-coder-480b-a35b",
    "google/gemma-4-26B-A4B": "gemma-4-26b-a4b",
    "nvidia/Gemma-4-31B-IT-NVFP4": "gemma-4-31b",
    "unsloth/gemma-4-31B-it-GGUF gemma-4-31B-it-IQ4_XS.gguf + BF16 mmproj": "gemma-4-31b",
    "qwen2.5vl:7b": "qwen2.5-vl-7b",            # Ollama's tag for Qwen2.5-VL-7B-Instruct
    "Voxtral TTS 4B (mistralai/Voxtral-4B-TTS-2603)": "voxtral-tts-4b",
}


def test_measurement_model_columns():
    seen = {}
    for path in sorted(MEASUREMENTS.glob("*.csv")):
        with open(path, encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                if row["model"]:
                    seen[row["model"]] = resolve_model(row["model"]).slug
    for text, slug in MEASURED.items():
        assert seen.get(text) == slug, (text, seen.get(text))
    # everything else there is a model outside the catalogue (or none named)
    others = {t: s for t, s in seen.items() if t not in MEASURED and s is not None}
    assert set(others) <= {
        ("CognitiveComputations/dolphin-qwen2:72b-v2.9.2-q4_k_s (inferred: the pasted log's "
         "partial=23.7 GiB matches the value the user gives for this model; llama3:70b gave "
         "partial=23.9 GiB)"),
        "Qwen3MoeForCausalLM (Qwen/Qwen3-30B-A3B-Instruct per PR text; inferred)",
        # the name resolves, but kvsim.validate.memlogs reads "not shown ..." as no model
        "not shown in excerpt (club-3090 Qwen3.6-27B stack; inferred)"}, others
