"""Startup-log readers against realistic logs in the formats quoted in docs/reference/engines.md."""

from pathlib import Path

import pytest

from kvsim.engines.startup_log import read_log, read_log_text
from kvsim.errors import InputError

FIX = Path(__file__).parent / "fixtures"
MiB, GiB = 2**20, 2**30


def test_vllm_v1_kv_tokens_and_concurrency() -> None:
    f = read_log(FIX / "vllm_v1.log")
    assert f.engine == "vllm"
    assert f.kv_cache_tokens == 36944
    assert (f.max_concurrency_tokens, f.max_concurrency) == (8192, 4.51)
    # 4.51 × 1,073,741,824 = 4,842,575,626.24 → 4,842,575,626 B
    assert f.available_kv_bytes == round(4.51 * GiB) == 4_842_575_626


def test_vllm_v1_numbers_are_read_from_their_own_lines() -> None:
    # Each value is the one its line prints (thousands separators dropped), not derived
    # from another: the concurrency printed here, 2.5x, is deliberately not
    # 100,000 / 32,768 = 3.05, so a reader computing it would fail; and
    # 12.25 GiB = 12.25 × 2^30 = 13,153,337,344 B.
    text = ("INFO [gpu_worker.py:227] Available KV cache memory: 12.25 GiB\n"
            "INFO [kv_cache_utils.py:634] GPU KV cache size: 100,000 tokens\n"
            "INFO [kv_cache_utils.py:637] Maximum concurrency for 32,768 tokens per "
            "request: 2.5x\n")
    f = read_log_text(text)
    assert f.engine == "vllm"
    assert (f.kv_cache_tokens, f.max_concurrency_tokens, f.max_concurrency) == (
        100_000, 32_768, 2.5)
    assert f.available_kv_bytes == 13_153_337_344
    assert (f.gpu_blocks, f.cpu_blocks) == (None, None)
    # a log with only the cache-size line leaves the others unset
    only = read_log_text("INFO GPU KV cache size: 1,234,567 tokens\n")
    assert (only.kv_cache_tokens, only.max_concurrency, only.max_concurrency_tokens,
            only.available_kv_bytes) == (1_234_567, None, None, None)


def test_vllm_v0_blocks() -> None:
    f = read_log(FIX / "vllm_v0.log")
    assert (f.engine, f.gpu_blocks, f.cpu_blocks, f.kv_cache_tokens) == ("vllm", 2132, 2048, None)


def test_llama_server_context_and_kv_sizes() -> None:
    f = read_log(FIX / "llama_server.log")
    assert f.engine == "llama.cpp"
    assert (f.n_seq_max, f.n_ctx, f.n_ctx_seq, f.kv_unified) == (4, 16384, 4096, False)
    assert f.kv_buffers == {"CUDA0": 2048 * MiB}
    # non-unified: 4 streams of n_ctx_seq cells each
    assert (f.kv_size_bytes, f.kv_cells, f.kv_streams, f.kv_layers) == (2048 * MiB, 4096, 4, 32)
    assert (f.k_type, f.v_type, f.k_bytes, f.v_bytes) == ("f16", "f16", 1024 * MiB, 1024 * MiB)
    # Llama-3.1-8B f16 = 128 KiB per token (docs/reference/engines.md §0): 16384 cells → 2 GiB
    assert f.kv_size_bytes == f.kv_cells * f.kv_streams * 128 * 1024


def test_llama_old_build_sums_devices_and_reads_self_size() -> None:
    f = read_log(FIX / "llama_old.log")
    assert f.kv_buffers == {"CUDA0": 544 * MiB, "CUDA_Host": 32 * MiB}
    assert f.kv_buffer_bytes == 576 * MiB == f.kv_size_bytes
    assert (f.k_type, f.n_ctx) == ("q8_0", 8192)


def test_ollama_memory_line_and_runner_lines() -> None:
    f = read_log(FIX / "ollama.log")
    assert f.engine == "ollama"
    assert f.ollama_memory["required.kv"] == 1 * GiB
    assert f.ollama_memory["weights.nonrepeating"] == 411 * MiB
    assert f.ollama_memory["graph.partial"] == int(677.5 * MiB)
    assert f.ollama_memory["gpu_overhead"] == 0
    assert (f.layers_model, f.layers_offload) == (33, 33)
    assert (f.n_ctx_seq, f.kv_buffer_bytes, f.k_bytes) == (4096, 1024 * MiB, 512 * MiB)


def test_unrecognisable_log_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no vLLM"):
        read_log_text("hello\nworld\n", "notes.txt")


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        read_log(tmp_path / "nope.log")


def test_llama_cpp_buffers_batches_and_flash_attention() -> None:
    f = read_log(FIX / "llama_server.log")
    # load_tensors: CUDA0 model buffer size = 4403.50 MiB; compute buffer 296.00 MiB
    assert f.model_buffers == {"CUDA0": round(4403.5 * MiB)}
    assert f.model_buffer_bytes == round(4403.5 * MiB)
    assert (f.compute_buffers, f.compute_buffer_bytes) == ({"CUDA0": 296 * MiB}, 296 * MiB)
    assert (f.n_batch, f.n_ubatch, f.gpu_layers, f.layers_total) == (2048, 512, 33, 33)
    # "flash_attn = auto" says what was asked, not what ran
    assert (f.flash_attn_setting, f.flash_attn) == ("auto", None)


def test_host_buffers_are_not_counted_on_the_gpu_and_the_resolved_flash_attention_is() -> None:
    text = ("load_tensors: offloaded 20/33 layers to GPU\n"
            "load_tensors:   CPU_Mapped model buffer size =  1900.00 MiB\n"
            "load_tensors:        CUDA0 model buffer size =  2500.00 MiB\n"
            "llama_context: n_ctx         = 8192\n"
            "llama_context: flash_attn    = auto\n"
            "llama_context: Flash Attention was auto, set to enabled\n"
            "llama_kv_cache:      CUDA0 KV buffer size =   640.00 MiB\n"
            "llama_context:      CUDA0 compute buffer size =   300.00 MiB\n"
            "llama_context:  CUDA_Host compute buffer size =    24.00 MiB\n"
            "llama_context:      CUDA0 compute buffer size =    99.00 MiB\n")  # a draft's
    f = read_log_text(text)
    assert f.model_buffer_bytes == 2500 * MiB and f.compute_buffer_bytes == 300 * MiB
    assert f.flash_attn is True


def test_scenario_keys_reproduce_the_startups_kv_buffer(kvsim_cli) -> None:
    import json

    from kvsim.api import scenario_budget
    from kvsim.scenario import load_scenario

    rc, _, out = kvsim_cli("calibrate", "from-log", FIX / "llama_server.log")
    doc = json.loads(out)
    assert rc == 0 and "ollama_memory" not in doc  # no empty Ollama section on llama.cpp
    keys = doc["scenario"]
    # the log's n_ctx is -c: ctx_size (each of its slots' share is context_tokens)
    assert keys["engine.ctx_size"] == 16384 and keys["engine.gpu_layers"] == 32
    s = load_scenario("quickstart", ["model=llama-3.1-8b", "gpu=rtx-4090", "engine=llama.cpp",
                                     *(f"{k}={v}" for k, v in keys.items())])
    b = scenario_budget(s)
    assert b.kv_reserved_bytes == doc["kv_buffer_bytes"] == 2048 * MiB
    assert b.activation_bytes == doc["compute_buffer_bytes"]
