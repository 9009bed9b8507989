"""fit's largest parallel keeps each session's context, as plan's -c = context x parallel
does (kvsim.plan.parallel), and a vLLM/SGLang run without --parallel says what it admits.

By hand (85 % line; 400 MiB driver reserve = 419,430,400 B; weights, compute buffers
and KV bytes per token are the ones fit prints for the given layout):

RTX 4090, 24,080 MiB as CUDA reports it (kvsim.config.device_memory) = 25,249,710,080 B:
line 0.85 x that = 21,462,253,568 B.
Llama-3.1-8B Q4_K_M: weights on the GPU 4,616,334,272 B (32 layers x 130,793,566 + Q6_K head
430,940,160; tests/cli/test_fit.py::test_json_fields derives them); compute buffer 296,222,720 B;
q8_0 KV 69,632 B/token; -c 32768 --parallel 4 -> 8,192 tokens per session, so at p
sessions -c = 8,192 p and KV = 8,192 p x 69,632 = 570,425,344 p.
  per-slot streams: + one stream's F16 mask 8,192 x 512 x 2 = 8,388,608 (any p)
    total = 419,430,400 + 4,616,334,272 + 296,222,720 + 8,388,608 + 570,425,344 p
          = 5,340,376,000 + 570,425,344 p
    (21,462,253,568 - 5,340,376,000) / 570,425,344 = 28.26 -> 28
    (p = 28: 21,312,285,632 <= line; p = 29: 21,882,710,976 > line)
  unified (-kvu): + the mask over all of -c, 8,192 p x 512 x 2 = 8,388,608 p
    total = 5,331,987,392 + 578,813,952 p
    (21,462,253,568 - 5,331,987,392) / 578,813,952 = 27.87 -> 27
    (p = 27: 20,959,964,096 <= line; p = 28: 21,538,778,048 > line)
  Before: 128 = 32768 / 256, sessions of one 256-token pad unit sharing a fixed -c.

Apple M4 Max (the finding): GPU share 96,207,267,430 B, line 81,776,177,315.5 B.
Llama-3.1-70B Q4_K_M: weights 41,903,136,880 B on the GPU: 80 layers of
(70.6e9 - 2 x 128,256 x 8,192) / 80 = 856,233,171.2 params, all Q4_K (0.5625 B) =
481,631,158.8 B, + Q6_K (+2.0625 bpw) attn_v and ffn_down in the 40 "more bits" layers,
(8,388,608 + 235,079,409.07) / 2 x 2.0625 / 8 = 31,384,549.07 -> 513,015,707 B a layer;
80 x 513,015,707 + Q6_K head 1,050,673,152 x 0.8203125 = 41,041,256,560 + 861,880,320.
Compute buffer 329,777,152 B, f16 KV 327,680 B/token + unified mask 1,024 B/token;
-c 32768 --parallel 2 -> 16,384 per session:
          total = 419,430,400 + 41,903,136,880 + 329,777,152 + 16,384 p x 328,704
              = 42,652,344,432 + 5,385,486,336 p
  (81,776,177,315.5 - 42,652,344,432) / 5,385,486,336 = 7.26 -> 7 (was 128)

Ollama (num_ctx is per slot: the runner gets num_ctx x p cells, as before): RTX 4090,
Llama-3.1-8B Q4_K_M, num_ctx 16384, f16 KV 131,072 B/token, graph 312,999,936 B:
  total = 419,430,400 + 4,616,334,272 + 312,999,936 + 16,384 p x 131,072
        = 5,348,764,608 + 2,147,483,648 p;  (21,462,253,568 - 5,348,764,608)
        / 2,147,483,648 = 7.50 -> 7
"""

import json

import pytest
from click.testing import CliRunner

from kvsim.cli import cli

LINE_4090 = 0.85 * 25_249_710_080


def fit_json(*argv: str) -> dict:
    res = CliRunner().invoke(cli, ["fit", *argv, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def fit_text(*argv: str) -> str:
    res = CliRunner().invoke(cli, ["fit", *argv])
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


LLAMA_8B = ("--gpu", "rtx-4090", "--model", "llama-3.1-8b", "--engine", "llama.cpp",
            "--kv", "q8_0")


@pytest.mark.parametrize("alloc,best,at_best,over", [
    (("--no-kv-unified",), 28, 21_312_285_632, 21_882_710_976),
    ((), 27, 20_959_964_096, 21_538_778_048),
])
def test_llama_cpp_largest_parallel_keeps_each_sessions_context(alloc, best, at_best, over):
    d = fit_json(*LLAMA_8B, "--context", "8192", "--parallel", "4", *alloc)
    assert d["session_tokens"] == 8192 and d["max_parallel_at_85"] == best
    # the answer is the layout plan would print: -c = 8,192 x parallel
    at = fit_json(*LLAMA_8B, "--context", "8192", "--parallel", str(best), *alloc)
    nxt = fit_json(*LLAMA_8B, "--context", "8192", "--parallel", str(best + 1), *alloc)
    assert (at["total_bytes"], nxt["total_bytes"]) == (at_best, over)
    assert at_best <= LINE_4090 < over
    assert at["max_parallel_at_85"] == best  # the same answer from the answer's layout


def test_the_findings_example_prints_sessions_of_full_context():
    flat = fit_text("--gpu", "apple-m4-max", "--model", "llama-3.1-70b", "--context",
                    "16384", "--parallel", "2")
    assert ("largest parallel at 85% (context 16,384 per session, -c = 16,384 x "
            "parallel): 7") in flat
    assert "bounded by -c" not in flat and "(context as given)" not in flat
    d = fit_json("--gpu", "apple-m4-max", "--model", "llama-3.1-70b", "--context",
                 "16384", "--parallel", "7")
    assert d["total_bytes"] == 42_652_344_432 + 7 * 5_385_486_336 == 80_350_748_784
    assert d["total_bytes"] <= 0.85 * d["device_bytes"] < 42_652_344_432 + 8 * 5_385_486_336


def test_ollama_largest_parallel_keeps_num_ctx_per_slot():
    args = ("--gpu", "rtx-4090", "--model", "llama-3.1-8b", "--engine", "ollama",
            "--context", "16384")
    d = fit_json(*args, "--parallel", "2")
    assert (d["session_tokens"], d["max_parallel_at_85"]) == (16384, 7)
    at, nxt = fit_json(*args, "--parallel", "7"), fit_json(*args, "--parallel", "8")
    assert (at["total_bytes"], nxt["total_bytes"]) == (5_348_764_608 + 7 * 2_147_483_648,
                                                       5_348_764_608 + 8 * 2_147_483_648)
    assert at["total_bytes"] <= LINE_4090 < nxt["total_bytes"]
    assert "(num_ctx 16,384 per session): 7" in fit_text(*args, "--parallel", "2")


VLLM_8B = ("--gpu", "rtx-4090", "--model", "llama-3.1-8b", "--weights", "bf16",
           "--engine", "vllm", "--context", "16384")


def test_vllm_without_parallel_names_max_num_seqs_not_parallel_1():
    # vllm.yaml: max_num_seqs 256 below 70 GiB (docs/reference/engines.md §1.4)
    flat = fit_text(*VLLM_8B)
    assert ("vllm, context 16384, parallel unset: --max-num-seqs 256 (vLLM's default), "
            "KV f16/f16") in flat
    assert "parallel 1," not in flat
    assert "largest context at 85% (1 request at full length, --max-num-seqs 256)" in flat
    d = fit_json(*VLLM_8B)
    assert (d["parallel"], d["max_num_seqs"]) == (None, 256)
    assert d["parallel_note"] == "parallel unset: --max-num-seqs 256 (vLLM's default)"


def test_vllm_on_a_large_card_and_sglang_and_a_given_parallel():
    # engine_for_gpu: vLLM's max_num_seqs 1024 on >= 70 GiB cards other than the A100
    d = fit_json("--gpu", "h100-sxm5-80gb", *VLLM_8B[2:])
    assert d["parallel_note"] == "parallel unset: --max-num-seqs 1024 (vLLM's default)"
    # sglang.yaml: 4096 is kvsim's cap; SGLang derives --max-running-requests itself
    d = fit_json(*VLLM_8B[:4], "--weights", "awq", "--engine", "sglang", "--context", "16384")
    assert (d["parallel"], d["max_num_seqs"]) == (None, 4096)
    assert d["parallel_note"] == ("parallel unset: --max-running-requests from SGLang's "
                                  "pool (kvsim caps it at 4096)")
    d = fit_json(*VLLM_8B, "--parallel", "4")
    assert (d["parallel"], d["max_num_seqs"], d["parallel_note"]) == (4, 4, "parallel 4")
    assert "vllm, context 16384, parallel 4, KV f16/f16" in fit_text(*VLLM_8B, "--parallel", "4")
