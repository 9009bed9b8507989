"""`kvsim fit` on vLLM / SGLang: the 85 % sizes hold at the memory fraction it prints.

vLLM preallocates ``gpu_memory_utilization`` of the device whatever the context, so
at its default 0.9 an RTX 4090 peaks above 85 % for every context; the largest
context and parallelism "at 85 %" only mean something with the fraction lowered.
"""

import json

import pytest

from kvsim.cli import main
from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu

ARGS = ["fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b", "--weights", "awq",
        "--engine", "vllm", "--kv", "fp8", "--parallel", "4", "--json"]


def _fit(capsys, *extra: str) -> dict:
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, *extra])
    assert exc.value.code == 0
    return json.loads(capsys.readouterr().out)


def _budget(context: int, util: float, seqs: int = 4):
    # fit's --parallel 4 is --max-num-seqs 4 (kvsim.plan.parallel), as plan's flags set it
    gpu, model = load_gpu("rtx-4090"), load_model("llama-3.1-8b")
    eng = engine_for_gpu({"preset": "vllm", "context_tokens": context, "cache_type_k": "fp8",
                          "cache_type_v": "fp8", "gpu_memory_utilization": util,
                          "max_num_seqs": seqs}, gpu, model)
    return memory_budget(gpu, model, "awq", eng, parallel=seqs)


def test_sizes_at_85_hold_at_the_printed_fraction(capsys) -> None:
    d = _fit(capsys, "--context", "32768")
    assert d["device_fraction"] > 0.85  # the default 0.9 share: over the line
    util, ctx, par = (d["gpu_memory_utilization_at_85"], d["max_context_at_85"],
                      d["max_parallel_at_85"])
    assert 0 < util < 0.9 and round(util, 3) == util
    # the fraction: the whole device under the line, 0.001 more is over it
    assert _budget(ctx, util).device_fraction <= 0.85 < _budget(ctx, util + 0.001).device_fraction
    # the context: four full-length requests fit that pool (vLLM's own concurrency
    # figure), one 256-token step more does not
    assert _budget(ctx, util).max_concurrency >= 4 > _budget(ctx + 256, util).max_concurrency
    # the parallelism at 32k, --max-num-seqs set to it: the pool holds par full-length
    # requests, and with one more admitted it does not hold one more
    assert d["gpu_memory_utilization_at_max_parallel"] == util  # vLLM: activation inside
    assert int(_budget(32768, util, par).max_concurrency) >= par
    assert int(_budget(32768, util, par + 1).max_concurrency) < par + 1


def test_a_share_already_under_the_line_is_kept(capsys) -> None:
    d = _fit(capsys, "--context", "32768", "--gpu-util", "0.7")
    assert d["device_fraction"] <= 0.85 and d["gpu_memory_utilization_at_85"] == 0.7
