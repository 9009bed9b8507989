"""`kvsim fit` on a box of several GPUs: --gpu names them, the split flags set the
engine's knobs, each GPU's part is printed; bad input is one line and exit 2."""

import json

import pytest

from kvsim.cli import main
from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu


def run(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


BASE = ("fit", "--model", "llama-3.1-8b", "--weights", "bf16", "--context", "32k")


def test_two_3090s_tensor_parallel_json_is_the_box_layout(capsys):
    code, out, _ = run(capsys, *BASE, "--gpu", "2x rtx-3090", "--engine", "vllm", "--json")
    assert code == 0
    doc = json.loads(out)
    g, m = load_gpu("rtx-3090"), load_model("llama-3.1-8b")
    cfg = engine_for_gpu({"preset": "vllm", "context_tokens": 32768}, g, m, weights="bf16",
                         more_gpus=(g,))
    b = memory_budget(g, m, "bf16", cfg, more_gpus=(g,))
    assert (doc["split"], doc["tensor_parallel"], doc["pipeline_parallel"]) == ("tensor", 2, 1)
    assert doc["kv_pool_tokens"] == b.kv_pool_tokens
    assert [d["gpu"] for d in doc["devices"]] == ["rtx-3090", "rtx-3090"]
    assert [d["kv_bytes"] for d in doc["devices"]] == [b.devices[0].kv_bytes] * 2
    # the verdict judges the fullest GPU
    assert doc["device_fraction"] == round(max(d.fraction for d in b.devices), 6)


def test_pipeline_flag_splits_the_layers(capsys):
    code, out, _ = run(capsys, *BASE, "--gpu", "2x rtx-3090", "--engine", "vllm",
                       "--pipeline-parallel-size", "2", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["split"] == "pipeline"
    assert [d["layers"] for d in doc["devices"]] == [16, 16]
    assert [d["holds_output"] for d in doc["devices"]] == [False, True]


def test_the_table_names_each_gpu_and_the_box(capsys):
    code, out, _ = run(capsys, *BASE, "--gpu", "rtx-3090+rtx-3060-12gb", "--engine", "vllm")
    assert code == 0
    assert "on GeForce RTX 3090 + GeForce RTX 3060 12GB — vllm (tensor parallel 2)" in \
        " ".join(out.split())
    rows = [line.split("│")[1:3] for line in out.splitlines() if "│ 1 " in line or "│ 0 " in line]
    assert [[c.strip() for c in r] for r in rows] == [["0", "rtx-3090"], ["1", "rtx-3060-12gb"]]
    assert "(rank 1, rtx-3060-12gb) Available KV cache memory" in out


def test_a_card_too_small_is_named_in_the_verdict(capsys):
    code, out, _ = run(capsys, "fit", "--model", "qwen2.5-14b", "--weights", "bf16",
                       "--context", "8k", "--gpu", "rtx-3090+rtx-3060-12gb", "--engine",
                       "vllm", "--json")
    doc = json.loads(out)
    assert code == 0 and not doc["fits"]
    assert doc["verdict"].startswith("DOES NOT FIT — (rank 1, rtx-3060-12gb) No available "
                                     "memory for the cache blocks")


@pytest.mark.parametrize("argv,flag", [
    (("--gpu", "2x rtx-3090", "--engine", "ollama", "--tensor-split", "1,1"),
     "--tensor-split"),
    (("--gpu", "4x rtx-3090", "--engine", "vllm", "--tensor-parallel-size", "3"),
     "--tensor-parallel-size"),
    (("--gpu", "rtx-3090", "--engine", "vllm", "--tensor-parallel-size", "2"),
     "--tensor-parallel-size"),
    (("--gpu", "2x rtx-3090", "--engine", "llama.cpp", "--tensor-split", "a,b"),
     "--tensor-split"),
    (("--gpu", "2x rtx-3090", "--engine", "llama.cpp", "--tensor-split", "1,1,1"),
     "--tensor-split"),
    (("--gpu", "2x rtx-3090", "--engine", "vllm", "--split-mode", "row"), "--split-mode"),
    (("--gpu", "2x rtx-3090", "--engine", "llama.cpp", "--main-gpu", "2"), "--main-gpu"),
    (("--gpu", "0x rtx-3090", "--engine", "vllm"), "--gpu"),
    (("--gpu", "rtx-3090+", "--engine", "vllm"), "--gpu"),
    (("--gpu", "17x rtx-3090", "--engine", "vllm"), "--gpu"),
])
def test_bad_box_input_is_one_line_naming_the_flag(capsys, argv, flag):
    code, out, err = run(capsys, *BASE, *argv)
    assert code == 2 and out == "", (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"error: {flag}"), err


def test_llama_cpp_layer_split_prints_each_gpus_buffers(capsys):
    # -c 8192, one slot: a qwen3-32b layer's KV = 8192 x 4,096 B = 32 MiB; the first card
    # holds layers 0-32, the second 33-63 and the output layer (llama.cpp's split by free
    # memory: equal cards)
    code, out, _ = run(capsys, "fit", "--model", "qwen3-32b", "--weights", "q5_k_m",
                       "--context", "8192", "--parallel", "1", "--gpu", "2x rtx-3090",
                       "--engine", "llama.cpp")
    text = " ".join(out.split())
    assert code == 0 and "— llama.cpp (split mode layer)" in text
    assert "llama_kv_cache: CUDA0 KV buffer size = 1056.00 MiB" in text   # 33 x 32 MiB
    assert "llama_kv_cache: CUDA1 KV buffer size = 992.00 MiB" in text    # 31 x 32 MiB
    assert "load_tensors: offloaded 65/65 layers to GPU" in text
    assert "rtx-3090 +head" in text


def test_llama_cpp_row_split_json_gives_each_gpus_rows(capsys):
    code, out, _ = run(capsys, "fit", "--model", "qwen3-32b", "--weights", "q5_k_m",
                       "--context", "8192", "--parallel", "1", "--gpu", "2x rtx-3090",
                       "--engine", "llama.cpp", "--split-mode", "row", "--tensor-split",
                       "3,1", "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["split"], doc["tensor_parallel"]) == ("row", 2)
    assert [d["weight_fraction"] for d in doc["devices"]] == [0.75, 0.25]
    # each layer's KV stays on its home card, placed by the same 3:1 split (49 + 15)
    assert [d["kv_bytes"] for d in doc["devices"]] == [49 * 32 * 2**20, 15 * 32 * 2**20]


def test_ollama_over_three_gpus_prints_its_estimate_line(capsys):
    code, out, _ = run(capsys, "fit", "--model", "qwen3-32b", "--weights", "q6_k",
                       "--context", "32768", "--gpu", "3x rtx-3090", "--engine", "ollama",
                       "--ollama-version", "0.6.8")
    text = " ".join(out.split())
    assert code == 0
    assert ("offload to cuda layers.model=65 layers.offload=65 layers.split=22,22,21 "
            "memory.required.full=67.30 GiB") in text
