"""Numeric flags outside their documented range get the one-line error, exit 2, before
anything runs (fit and plan; the ranges are in each flag's --help)."""

import pytest

from kvsim.cli import main

FIT = ["fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b"]
PLAN = ["plan", "quickstart", "--no-progress", "--no-report"]


@pytest.mark.parametrize("args,line", [
    # llama.cpp: --context is one session's (its slot's) share, at most the model's 131,072;
    # --ctx-size is -c, all slots' cells: 4 slots (the preset's) of at most 131,072 each
    (FIT + ["--context", "1e99"], "error: --context: 99999999999999996733616880411669127384"),
    (FIT + ["--context", "10000000"],
     "error: --context: 10000000 — at most 131,072 tokens per session: llama-3.1-8b's "
     "maximum, at which llama-server caps each slot"),
    (FIT + ["--ctx-size", "10000000"],
     "error: --ctx-size: 10000000 — at most 524,288 for 4 slots (-c is all slots' cells): "
     "llama-3.1-8b's maximum is 131,072 tokens per session and llama-server caps each slot "
     "at it"),
    (FIT + ["--ctx-size", "131073", "--parallel", "1"],
     "error: --ctx-size: 131073 — at most 131,072 for 1 slot (-c is all slots' cells)"),
    (FIT + ["--context", "8192", "--ctx-size", "32768"],
     "error: --ctx-size: 32768 — either --context (per session) or --ctx-size"),
    (FIT + ["--engine", "vllm", "--ctx-size", "32768"],
     "error: --ctx-size: 32768 — vllm has no -c for all slots"),
    (FIT + ["--parallel", "257"],
     "error: --parallel: 257 — at most 256 on llama.cpp: llama.cpp's LLAMA_MAX_SEQ: "
     "llama-server refuses more slots ('n_seq_max must be <= 256')"),
    (FIT + ["--engine", "ollama", "--parallel", "300"],
     "error: --parallel: 300 — at most 256 on ollama: its runner is llama.cpp"),
    (FIT + ["--engine", "vllm", "--parallel", "1e9"],
     "error: --parallel: 1000000000 — at most 65536 on vllm: kvsim's planning range"),
    (FIT + ["--engine", "vllm", "--context", "131073"],
     "error: --context: 131073 — at most the model's maximum (131072)"),
    (FIT + ["--gpu-layers", "1e12"],
     "error: --gpu-layers: '1e12' — between 0 and 2147483647"),
    (PLAN + ["--contexts", "8192", "--parallel", "1,300"],
     "error: --parallel: 300 — at most 256 on llama.cpp"),
    (PLAN + ["--contexts", "8192", "--parallel", "1", "-n", "1001"],
     "error: --replications: 1001 — between 1 and 1,000"),
    (PLAN + ["--contexts", "8192", "--parallel", "1", "-n", "1", "-j", "100000"],
     "error: --jobs: 100000 — between 1 and 1024 worker processes"),
])
def test_out_of_range_is_one_line_and_exit_2(capsys, args, line):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), err


@pytest.mark.parametrize("args", [
    FIT + ["--ctx-size", "524288"],                     # 4 slots x 131,072: the edge
    FIT + ["--context", "131072"],
    FIT + ["--parallel", "256", "--ctx-size", "262144"],
    FIT + ["--engine", "vllm", "--parallel", "65536"],
    FIT + ["--gpu-layers", "999"],
])
def test_the_edges_of_the_ranges_are_accepted(capsys, args):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code in (0, None), capsys.readouterr().err
