"""`kvsim fit`'s KV bytes per token: the cache that grows with context (docs/reference/models.csv
``kv_bytes_per_token_fp16``, docs/reference/hardware-and-models.md §2), the windowed part apart."""

import json

import pytest

from kvsim.cli import main


def fit(capsys, *argv, as_json=True):
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--gpu", "rtx-4090", *argv, *(["--json"] if as_json else [])])
    out, _ = capsys.readouterr()
    assert exc.value.code == 0
    return json.loads(out) if as_json else " ".join(out.split())


def test_gemma_3_27b_on_llama_cpp(capsys):
    # docs/reference/models.csv: full 2 x 10 x 16 x 128 x 2 = 81,920 B per token; windowed
    # 2 x 52 x 16 x 128 x 2 = 425,984 B per token for the newest 1,024 tokens, at most
    # 425,984 x 1,024 = 436,207,616 B per sequence.  -c 16384, 1 slot: 16,384 cells x
    # 81,920 = 1,342,177,280 + iSWA cells pad256(min(16384, 1024 + 512)) = 1,536 x 425,984
    # = 654,311,424 -> 1,996,488,704 B reserved (docs/reference/engines.md §3.3)
    d = fit(capsys, "--model", "gemma-3-27b", "--context", "16384", "--parallel", "1")
    assert (d["kv_bytes_per_token"], d["kv_windowed_bytes_per_token"]) == (81_920, 425_984)
    assert (d["kv_window_tokens"], d["kv_windowed_cap_bytes_per_seq"]) == ([1024], 436_207_616)
    assert d["kv_windowed_at_full_length"] is False and d["kv_recurrent_bytes_per_seq"] == 0
    assert d["kv_reserved_bytes"] == 16_384 * 81_920 + 1_536 * 425_984 == 1_996_488_704
    text = fit(capsys, "--model", "gemma-3-27b", "--context", "16384", "--parallel", "1",
               as_json=False)
    assert ("KV bytes per token: 81920 (grows with context; full-attention layers) + 425984 "
            "for the newest 1024 tokens only (sliding-window layers, at most 436207616 per "
            "sequence) · pool 16384 tokens") in text


def test_gpt_oss_20b(capsys):
    # docs/reference/models.csv: 2 x 12 x 8 x 64 x 2 = 24,576 B full, the same windowed over 128
    # tokens (cap 24,576 x 128 = 3,145,728)
    d = fit(capsys, "--model", "gpt-oss-20b", "--weights", "mxfp4", "--context", "8192")
    assert (d["kv_bytes_per_token"], d["kv_windowed_bytes_per_token"],
            d["kv_window_tokens"], d["kv_windowed_cap_bytes_per_seq"]) == (
        24_576, 24_576, [128], 3_145_728)


def test_vllm_hybrid_groups_cap_the_window_and_sglang_does_not(capsys):
    # Gemma-3-12B: full 2 x 8 x 8 x 256 x 2 = 65,536; windowed 2 x 40 x 8 x 256 x 2 =
    # 327,680 (docs/reference/models.csv).  SGLang holds the sliding layers at full length (kvsim's
    # model, kvsim.model.hybrid): every layer grows, 65,536 + 327,680 = 393,216
    on = fit(capsys, "--model", "gemma-3-12b", "--weights", "bf16", "--engine", "vllm",
             "--context", "8192")
    assert (on["kv_bytes_per_token"], on["kv_windowed_bytes_per_token"]) == (65_536, 327_680)
    off = fit(capsys, "--model", "gemma-3-12b", "--weights", "bf16", "--engine", "vllm",
              "--context", "8192", "--no-hybrid-kv")
    sg = fit(capsys, "--model", "gemma-3-12b", "--weights", "bf16", "--engine", "sglang",
             "--context", "8192")
    for d in (off, sg):
        assert (d["kv_bytes_per_token"], d["kv_windowed_bytes_per_token"]) == (393_216, 0)
        assert d["kv_windowed_at_full_length"] is True and d["kv_window_tokens"] == []
    # SGLang's page of 1 token: the pool is whole tokens of 393,216 B
    assert sg["kv_reserved_bytes"] == sg["kv_pool_tokens"] * 393_216


def test_a_model_without_windows_and_a_recurrent_one(capsys):
    d = fit(capsys, "--model", "llama-3.1-8b", "--context", "8192")
    assert (d["kv_bytes_per_token"], d["kv_windowed_bytes_per_token"],
            d["kv_windowed_at_full_length"]) == (131_072, 0, False)
    # Jamba: 4 attention layers x 8 KV heads x (128 + 128) x 2 B = 16,384 B per token
    # (docs/reference/models.csv 16 KiB); its Mamba state is a per-sequence cost, f32 in llama.cpp:
    # 28 layers x (8,192 x 16 SSM + 8,192 x (4 - 1) window, n_embd_s + n_embd_r) x 4 B
    # = 17,432,576
    j = fit(capsys, "--model", "jamba-v0.1", "--context", "8192", "--parallel", "1")
    assert (j["kv_bytes_per_token"], j["kv_recurrent_bytes_per_seq"]) == (16_384, 17_432_576)


def test_vllm_reserves_whole_blocks(capsys):
    # Llama-3.1-8B bf16, vLLM at max_model_len 16384 (the family-4-vllm scenario's card
    # and engine, vLLM's newest release): pool int(0.92 x 24080 MiB) - 16,060,000,000 weights
    # - 1,264,451,584 activation (the sampler pass's 256 rows x 128,256 x 38 B + 2048 x
    # 4096 x 2 B of hidden states) - 375,809,638 non-torch - 697,932,186 CUDA graphs =
    # 4,831,539,865 B = 2,303 blocks of 16 x 131,072 = 2,097,152 B -> 2,303 x 2,097,152 =
    # 4,829,741,056 B reserved, not the pool's 4,831,539,865
    d = fit(capsys, "--model", "llama-3.1-8b", "--weights", "bf16", "--engine", "vllm",
            "--context", "16384")
    assert (d["num_gpu_blocks"], d["kv_pool_tokens"]) == (2_303, 36_848)
    assert d["kv_reserved_bytes"] == 2_303 * 2_097_152 == 4_829_741_056


def test_ollama_context_above_the_model_is_clamped_with_a_note(kvsim_cli):
    # phi-4-14b trains at 16,384 tokens (docs/reference/models.csv); Ollama clamps num_ctx to it
    # (§4.1)
    code, err, out = kvsim_cli("fit", "--gpu", "rtx-4090", "--model", "phi-4-14b",
                               "--engine", "ollama", "--context", "32768", "--json")
    d = json.loads(out)
    assert (code, err) == (0, "") and d["slot_tokens"] == 16384
    assert ("Ollama clamps num_ctx 32,768 to phi-4-14b's training length 16,384 "
            "(docs/reference/engines.md §4.1)") in d["notes"]


@pytest.mark.parametrize("args,flag", [
    (["--engine", "vllm", "--context", "300000"], "--context: 300000 — at most"),
    (["--engine", "ollama", "--ollama-version", "abc"], "--ollama-version: 'abc' — ")])
def test_engine_errors_name_the_flag_typed(kvsim_cli, args, flag):
    code, err, _ = kvsim_cli("fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b", *args)
    assert code == 2 and err.startswith(f"error: {flag}")
