"""Cards and models named as drivers, Hugging Face and Ollama print them work wherever a
slug does (fit, a scenario, --set, compare --gpus, profiles show) and give the very same
answer; a name that fits several profiles is refused with what to add; an unknown one
keeps the catalogue's closest slugs."""

import json

import pytest

from kvsim.config.catalog import load_gpu
from kvsim.config.gpu_names import gpu_profiles
from kvsim.errors import InputError
from kvsim.model.names import model_slug
from kvsim.plan.compare import parse_gpus
from kvsim.scenario import resolve_scenario


def _fit_json(kvsim_cli, gpu: str, model: str, *more: str) -> dict:
    code, err, out = kvsim_cli("fit", "--gpu", gpu, "--model", model, "--json", *more)
    assert (code, err) == (0, "")
    return json.loads(out)


@pytest.mark.parametrize("gpu,model,slug_gpu,slug_model", [
    ("NVIDIA GeForce RTX 4090", "meta-llama/Llama-3.1-8B-Instruct", "rtx-4090", "llama-3.1-8b"),
    ("AMD Radeon RX 7900 XTX", "qwen2.5:14b", "rx-7900-xtx", "qwen2.5-14b"),
    ("2x NVIDIA GeForce RTX 3090", "Qwen/Qwen3-8B", "2x rtx-3090", "qwen3-8b"),
    ("Apple M2 Max (38-core GPU)", "gemma3:27b", "apple-m2-max-38c", "gemma-3-27b"),
])
def test_fit_answers_a_printed_name_as_its_slug(kvsim_cli, gpu, model, slug_gpu, slug_model):
    assert _fit_json(kvsim_cli, gpu, model) == _fit_json(kvsim_cli, slug_gpu, slug_model)


@pytest.mark.parametrize("args,line", [
    (["--gpu", "NVIDIA GeForce RTX 3080", "--model", "llama-3.1-8b"],
     ("error: --gpu: 'NVIDIA GeForce RTX 3080' — ambiguous: 'NVIDIA GeForce RTX 3080' is "
      "sold with 10 or 12 GB; name the memory, e.g. 'NVIDIA GeForce RTX 3080 12GB'")),
    (["--gpu", "rtx-4090", "--model", "llama 7B"],
     ("error: --model: 'llama 7B' — ambiguous: llama.cpp model_type 'llama 7B' fits "
      "llama-2-7b, mistral-7b-v0.1, mistral-7b-v0.3")),
    (["--gpu", "RTX 9999", "--model", "llama-3.1-8b"],
     "error: gpu: 'RTX 9999' — unknown; closest: rtx-5090, rtx-4090, rtx-3090"),
    (["--gpu", "rtx-4090", "--model", "meta-llama/Llama-9-1B"],
     ("error: model: 'meta-llama/Llama-9-1B' — a model profile slug (kvsim profiles list "
      "models) or a profile .yaml file (file not found)")),
])
def test_names_that_fit_several_or_none_are_one_line(kvsim_cli, args, line):
    assert kvsim_cli("fit", *args)[:2] == (2, line)


def test_a_scenario_names_its_cards_and_model_as_printed():
    base = {"engine": {"preset": "llama.cpp"}, "workload": {"preset": "family-4"}}
    printed = resolve_scenario({**base, "gpu": "NVIDIA GeForce RTX 3090 + NVIDIA GeForce "
                                "RTX 3060 12GB", "model": "meta-llama/Llama-3.1-8B-Instruct"})
    slugs = resolve_scenario({**base, "gpu": "rtx-3090+rtx-3060-12gb", "model": "llama-3.1-8b"})
    assert printed == slugs
    assert (printed.gpu.name, [g.name for g in printed.more_gpus], printed.model.name) == (
        "rtx-3090", ["rtx-3060-12gb"], "llama-3.1-8b")


def test_simulate_set_takes_printed_names(kvsim_cli, tmp_path):
    outs = []
    for gpu, model in (("NVIDIA GeForce RTX 3090", "llama3.1:8b"), ("rtx-3090", "llama-3.1-8b")):
        out = tmp_path / gpu.replace(" ", "_")
        code, err, _ = kvsim_cli("simulate", "quickstart", "--set", f"gpu={gpu}", "--set",
                                 f"model={model}", "--set", "workload.days=1", "-o", out,
                                 "--no-report")
        assert (code, err) == (0, "")
        outs.append(json.loads((out / "summary.json").read_text()))
    assert outs[0] == outs[1]


def test_compare_labels_printed_candidates_by_slug():
    assert parse_gpus("NVIDIA GeForce RTX 4090,2x RTX 3090,rtx-3060-12gb+NVIDIA GeForce "
                      "RTX 3090") == ["rtx-4090", "2x rtx-3090", "rtx-3060-12gb+rtx-3090"]


def test_profiles_show_a_printed_name(kvsim_cli):
    code, err, out = kvsim_cli("profiles", "show", "NVIDIA GeForce RTX 4090")
    assert (code, err) == (0, "") and out.startswith("# gpu profile 'rtx-4090'\nname: rtx-4090\n")
    code, err, out = kvsim_cli("profiles", "show", "qwen2.5:14b")
    assert (code, err) == (0, "") and out.startswith("# model profile 'qwen2.5-14b'\n")


def test_gpu_profiles_one_per_device_and_paths_untouched(tmp_path):
    assert gpu_profiles("rtx-4090", "gpu") == ["rtx-4090"]
    assert gpu_profiles("NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX 3090", "gpu") == \
        ["rtx-3090", "rtx-3090"]  # llama-bench's gpu_info of a two-card box
    mine = tmp_path / "my-card.yaml"
    assert gpu_profiles(str(mine), "gpu") == [str(mine)]  # the loader says it is missing
    assert gpu_profiles("no such card", "gpu") == ["no such card"]  # the loader's closest
    with pytest.raises(InputError, match=r"^gpu: .* — several kinds of device"):
        gpu_profiles("NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX 4090", "gpu")


def test_model_slug_keeps_slugs_files_and_unknowns():
    assert model_slug("llama-3.1-8b", "model") == "llama-3.1-8b"
    assert model_slug("x.gguf", "model") == "x.gguf"  # the loader: import it first
    assert model_slug("llama-3.1-9b", "model") == "llama-3.1-9b"  # the loader's closest
    assert model_slug("mistralai/Mistral-7B-Instruct-v0.3", "model") == "mistral-7b-v0.3"


def test_a_unified_machine_named_with_its_memory_is_that_configuration(kvsim_cli):
    # the catalogue's Apple profiles are the largest configuration (96 GB for an M2 Max);
    # a 32 GB machine said so must get 32 GB, and its GPU the same 70 % share
    big = load_gpu("apple-m2-max-38c")
    [small] = gpu_profiles("Apple M2 Max (38-core GPU) 32GB", "gpu")
    assert (small.name, small.memory_bytes, small.gpu_memory_limit_bytes) == (
        "apple-m2-max-38c-32gb", 32 * 2**30,
        int(big.gpu_memory_limit_bytes * 32 * 2**30 / big.memory_bytes))
    assert gpu_profiles(small.name, "gpu") == [small]  # its own name resolves to it again
    assert gpu_profiles("apple-m2-max-38c 96GB", "gpu") == ["apple-m2-max-38c"]
    assert gpu_profiles("NVIDIA GeForce RTX 3060 12GB", "gpu") == ["rtx-3060-12gb"]
    doc = _fit_json(kvsim_cli, "Apple M2 Max (38-core GPU) 32GB", "qwen2.5-32b")
    assert doc == _fit_json(kvsim_cli, "apple-m2-max-38c-32gb", "qwen2.5-32b")
    assert doc["device_bytes"] == small.gpu_memory_limit_bytes
    assert _fit_json(kvsim_cli, "apple-m2-max-38c", "qwen2.5-32b")["device_bytes"] == \
        big.gpu_memory_limit_bytes
    assert parse_gpus("Apple M2 Max (38-core GPU) 32GB,rtx-3090") == [
        "apple-m2-max-38c-32gb", "rtx-3090"]
