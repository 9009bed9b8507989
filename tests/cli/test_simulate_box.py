"""`kvsim simulate` on a box of several GPUs with each engine: the run starts, its summary
gives each GPU's part and peak, and the latency model names the box and its split."""

import json

import pytest
import yaml

from kvsim.engines.budget import box_reserves, memory_budget
from kvsim.scenario import load_scenario


@pytest.mark.parametrize("engine, weights, split", [
    ("llama.cpp", "q4_k_m", "layer split"), ("ollama", "q4_k_m", "layer split"),
    ("vllm", "awq", "tensor split"), ("sglang", "awq", "tensor split")])
def test_every_engine_runs_a_two_gpu_box(tmp_path, kvsim_cli, engine, weights, split):
    doc = {"name": "box", "seed": 0, "gpu": "2x rtx-3090", "model": "qwen3-32b",
           "weights": weights, "engine": {"preset": engine, "context_tokens": 16384},
           "workload": {"preset": "family-2", "days": 1}}
    path = tmp_path / "box.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, err, out = kvsim_cli("simulate", path, "--output", tmp_path / "out")
    assert (code, err) == (0, "")
    assert f"over 2x rtx-3090 ({split}" in " ".join(out.split())  # the table's title
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    s = load_scenario(str(path))
    b = memory_budget(s.gpu, s.model, s.weights, s.engine, **box_reserves(s))
    assert [g["kv_bytes"] for g in summary["gpus"]] == [d.kv_bytes for d in b.devices]
    assert f"over 2x rtx-3090 ({split}, pcie4-x16-host)" in summary["latency_model"]
    assert summary["peak_device_fraction"] == max(g["peak_device_fraction"]
                                                  for g in summary["gpus"])
