"""An engine's own start-up log, pasted to ``kvsim validate`` (kvsim.validate.startup_paste):
what it ran is read from its lines, and its memory figures are compared as a row of
engine-memory-logs.csv is."""
import json
from pathlib import Path

from kvsim.validate.run import read_file
from kvsim.validate.startup_paste import read_startup_paste

FIXTURES = Path(__file__).resolve().parents[1] / "calibrate" / "fixtures"
DATA = Path(__file__).resolve().parent / "data"

# the lines llama-server prints before its context (formats of ggml-cuda's device list,
# llama_model_load_from_file_impl, llama_model_loader and print_info), then the fixture's
LLAMA_HEAD = """\
ggml_cuda_init: found 1 CUDA devices:
  Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9, VMM: yes
llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 4090) - 23582 MiB free
llama_model_loader: loaded meta data with 33 key-value pairs and 292 tensors from /models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf (version GGUF V3 (latest))
print_info: file type   = Q4_K - Medium
"""
# ggml-org/llama.cpp PR #6122 (a comment's log): a 4070 Ti beside a 3090 Ti, the older
# llm_load_tensors / llama_new_context_with_model lines; the model is not in the excerpt
MIXED_BOX = """\
ggml_cuda_init: found 2 CUDA devices:
  Device 0: NVIDIA GeForce RTX 4070 Ti, compute capability 8.9, VMM: yes
  Device 1: NVIDIA GeForce RTX 3090 Ti, compute capability 8.6, VMM: yes
llm_load_tensors: offloaded 41/41 layers to GPU
llama_new_context_with_model: n_ctx      = 4096
llama_kv_cache_init:      CUDA0 KV buffer size =  1536.00 MiB
llama_kv_cache_init:      CUDA1 KV buffer size =  3584.00 MiB
llama_new_context_with_model: KV self size  = 5120.00 MiB, K (f16): 2560.00 MiB, V (f16): 2560.00 MiB
llama_new_context_with_model: pipeline parallelism enabled (n_copies=4)
llama_new_context_with_model:      CUDA0 compute buffer size =   672.01 MiB
"""


def _one(text: str, origin: str = "server.log"):
    got = read_startup_paste(text, origin)
    assert got is not None and len(got) == 1
    return got[0]


def test_a_llama_server_log_names_the_card_model_weights_and_settings():
    text = LLAMA_HEAD + (FIXTURES / "llama_server.log").read_text()
    m = _one(text)
    assert (m.engine, m.engine_version, m.gpus) == ("llama.cpp", "6002", ("rtx-4090",))
    assert (m.model, m.weights) == ("llama-3.1-8b", "q4_k_m")
    assert m.settings == {"ctx_size": 16384, "parallel": 4, "kv_unified": False,
                          "batch_size": 2048, "ubatch_size": 512, "flash_attn": True,
                          "cache_type_k": "f16", "cache_type_v": "f16"}
    assert [(f.metric, f.device) for f in m.figures] == [
        ("kv_bytes", "CUDA0"), ("weights_bytes", "CUDA0"), ("compute_bytes", "CUDA0")]


def test_validate_takes_the_log_as_it_is(kvsim_cli, tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LLAMA_HEAD + (FIXTURES / "llama_server.log").read_text())
    code, err, out = kvsim_cli("validate", log, "--json")
    assert (code, err) == (0, "")
    rows = {r["metric"]: r for r in json.loads(out)["rows"]}
    # 4 non-unified slots of 4,096 cells, f16: 16,384 x 131,072 B = 2,048 MiB, as printed
    assert rows["kv_bytes"]["predicted"] == rows["kv_bytes"]["measured"] == 2048 * 2**20
    assert abs(rows["weights_bytes"]["rel_err"]) < 0.001  # 4,403.50 MiB printed
    assert rows["kv_bytes"]["gpu"] == "rtx-4090" and rows["kv_bytes"]["kind"] == "memory"


def test_a_mixed_box_is_its_cards_in_device_order():
    m = _one(MIXED_BOX, "pr6122.log")
    assert m.gpus == ("rtx-4070-ti", "rtx-3090-ti") and m.gpu_count == 2
    assert [(f.metric, f.device, f.value) for f in m.figures] == [
        ("kv_bytes", "CUDA0", 1536 * 2**20), ("kv_bytes", "CUDA1", 3584 * 2**20),
        ("compute_bytes", "CUDA0", round(672.01 * 2**20))]
    # no model in the excerpt: said, not guessed
    assert m.model is None and m.model_reason == "model not shown in the log"


def test_an_ollama_server_log_gives_its_estimate_slots_and_free_memory():
    m = _one((FIXTURES / "ollama.log").read_text())
    assert (m.engine, m.date) == ("ollama", "2025-03-02")
    # its runner's command line: --ctx-size 8192 --parallel 2 -> num_ctx 4096 a slot
    assert (m.settings["num_ctx"], m.settings["parallel"]) == (4096, 2)
    assert m.free_bytes == (round(23.2 * 2**30),)
    metrics = {f.metric for f in m.figures}
    assert {"ollama_required_full_bytes", "ollama_required_kv_bytes", "ollama_graph_full_bytes",
            "ollama_layers_offload", "kv_bytes"} <= metrics


def test_a_vllm_log_without_its_config_line_says_what_is_missing():
    m = _one((FIXTURES / "vllm_v1.log").read_text())
    assert m.engine == "vllm" and m.model is None
    assert {f.metric for f in m.figures} >= {"kv_tokens", "kv_bytes", "max_concurrency"}


def test_other_pastes_keep_their_readers():
    # llama-batched-bench prints a table; llama-bench output stays a speed measurement
    meas, _ = read_file(DATA / "batched.md")
    assert meas and all(type(x).__name__ == "Measurement" for x in meas)
    assert read_startup_paste("| model | size |\n|---|---|\n", "x") is None


# vLLM's own first lines (formats of its engine banner and arg_utils' non-default args)
VLLM_HEAD = """\
INFO 05-12 10:13:58 [utils.py:326] non-default args: {'model': 'Qwen/Qwen2.5-7B-Instruct', 'max_model_len': 8192, 'gpu_memory_utilization': 0.85}
INFO 05-12 10:14:09 [core.py:61] Initializing a V1 LLM engine (v0.10.1) with config: model='Qwen/Qwen2.5-7B-Instruct', speculative_config=None, tokenizer='Qwen/Qwen2.5-7B-Instruct', dtype=torch.bfloat16, max_seq_len=8192, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda
"""


def test_a_vllm_log_gives_its_release_model_and_knobs():
    m = _one(VLLM_HEAD + (FIXTURES / "vllm_v1.log").read_text())
    assert (m.engine, m.engine_version, m.model, m.weights) == (
        "vllm", "0.10.1", "qwen2.5-7b", "bf16")
    assert m.settings == {"max_model_len": 8192, "tensor_parallel_size": 1,
                          "pipeline_parallel_size": 1, "kv_cache_dtype": "auto",
                          "enforce_eager": False, "gpu_memory_utilization": 0.85}
    assert m.gpus == () and m.gpu_reason == "GPU not named in the log"  # --gpu names it


def test_flash_attention_auto_reads_as_llama_cpp_resolves_it():
    # a settings cell or a log's "flash_attn = auto": on where the device runs it
    from kvsim.validate.memlog_text import read_settings
    from kvsim.validate.records import FA_AUTO
    settings, _ = read_settings("flash_attn=auto; ctx_size=4096", "x")
    assert settings["flash_attn"] is FA_AUTO and settings["ctx_size"] == 4096
