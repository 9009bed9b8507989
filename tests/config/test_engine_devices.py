"""Cards an engine does not run on are refused with the engine's own requirement
(docs/reference/engines.md §1): vLLM needs compute capability 7.0, so no Pascal card;
the llama.cpp family runs on them."""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.resolve import engine_for_gpu
from kvsim.errors import InputError
from kvsim.scenario import resolve_scenario

WHY = ("vLLM needs an NVIDIA GPU of compute capability 7.0 or newer (docs.vllm.ai, "
       "installation: 'GPU: compute capability 7.0 or higher', 7.5 in its newest docs; "
       "docs/reference/engines.md §1); llama.cpp and Ollama run on it")


@pytest.mark.parametrize("slug,display", [("tesla-p40", "Tesla P40"),
                                          ("gtx-1080-ti", "GeForce GTX 1080 Ti"),
                                          ("tesla-p100-16gb", "Tesla P100 PCIe 16GB")])
def test_vllm_refuses_pascal_cards(slug, display):
    with pytest.raises(InputError) as exc:
        engine_for_gpu("vllm", load_gpu(slug), load_model("llama-3.1-8b"), weights="awq")
    assert exc.value.one_line() == \
        f"engine: 'vllm' — does not run on {slug} ({display}, pascal): {WHY}"


def test_a_pascal_card_anywhere_in_the_box_is_refused():
    with pytest.raises(InputError, match="does not run on tesla-p40"):
        resolve_scenario({"gpu": "rtx-3090+tesla-p40", "model": "llama-3.1-8b",
                          "weights": "awq", "engine": {"preset": "vllm"},
                          "workload": {"preset": "family-4"}})


@pytest.mark.parametrize("preset", ["llama.cpp", "ollama", "sglang"])
def test_other_engines_run_on_a_p40(preset):
    eng = engine_for_gpu(preset, load_gpu("tesla-p40"), load_model("llama-3.1-8b"),
                         weights="q4_k_m")
    assert eng.preset == preset


@pytest.mark.parametrize("slug", ["tesla-v100-sxm2-32gb", "tesla-t4", "rtx-3090",
                                  "rx-7900-xtx", "arc-a770-16gb", "apple-m2-max-38c"])
def test_vllm_takes_volta_and_newer_and_the_other_vendors(slug):
    assert engine_for_gpu("vllm", load_gpu(slug), load_model("llama-3.1-8b"),
                          weights="awq").preset == "vllm"
