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
