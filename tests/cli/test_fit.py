"""`kvsim fit`: reproduces real engine numbers; bad input is one line and exit 2."""

import json

import pytest
import yaml

from kvsim.cli import main

TINY = {"name": "tiny-8l", "display_name": "tiny 8-layer", "params_total": 1.0e7,
        "params_active": 1.0e7, "num_layers": 8, "hidden_size": 128,
        "num_attention_heads": 2, "num_kv_heads": 2, "head_dim": 64, "vocab_size": 1000,
        "max_context_tokens": 8192, "source": "test fixture: llama-server run",
        "layer_groups": [{"kind": "full", "layers": 8, "n_kv_heads": 2, "head_dim_k": 64,
                          "head_dim_v": 64}]}


def run(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.fixture
def tiny(tmp_path):
    p = tmp_path / "tiny-8l.yaml"
    p.write_text(yaml.safe_dump(TINY))
    return str(p)


@pytest.mark.parametrize("kv,mib", [("f16", "32.00"), ("q8_0", "17.00"), ("q4_0", "9.00")])
def test_reproduces_llama_server_kv_buffer(capsys, tiny, kv, mib):
    code, out, _ = run(capsys, "fit", "--gpu", "rtx-4090", "--model", tiny, "--weights", "f16",
                       "--engine", "llama.cpp", "--ctx-size", "8192", "--kv", kv, "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["kv_reserved_bytes"] == float(mib) * 2**20
    assert f"KV buffer size = {mib} MiB" in " ".join(doc["log_lines"])


def test_json_fields(capsys):
    # Llama-3.1-8B q4_k_m on an RTX 4090 (24 GiB = 25,769,803,776 B), --context 8192 --parallel 4 (-c 32768), q8_0 KV:
    #   KV     2 x 32 x 8 x 128 x 34/32 = 69,632 B/token (docs/reference/engines.md §0: 68 KiB)
    #   layer  (8.03e9 - 2 x 128,256 x 4,096) / 32 = 218,103,964 params: Q, O 4,096^2 and
    #          K, V 4,096 x 1,024 = 41,943,040; gate + up 2/3 of the other 176,160,924 =
    #          117,440,616, down 1/3 = 58,720,308. All Q4_K (4.5 bpw, 0.5625 B) = 122,683,479.75,
    #          and in Q4_K_M's 16 "more bits" layers of 32 (0-3, 6, 9, ..., 27, 28-31) attn_v and
    #          ffn_down are Q6_K (6.5625 bpw, +2.0625): (4,194,304 + 58,720,308) / 2 x 2.0625 / 8
    #          = 8,110,086.70 -> 130,793,566 B
    #          head Q6_K 525,336,576 x 0.8203125 = 430,940,160 B; embedding Q4_K x 0.5625
    #          = 295,501,824 B
    #   weights on GPU 32 x 130,793,566 + 430,940,160 = 4,616,334,272 (embedding on the CPU)
    #   weights total  4,616,334,272 + 295,501,824 (embedding)     = 4,911,836,096
    #   compute buffer 512 x 128,256 x 4 + 512 x 4,096 x 16        =   296,222,720
    #          + F16 mask of one slot's stream 8,192 x 512 x 2      =     8,388,608
    #   total  400 MiB 419,430,400 + 4,616,334,272 + 304,611,328 + 32,768 x 69,632
    #          = 7,622,077,376  -> / the 4090's 24,080 MiB (as CUDA reports it,
    #          kvsim.config.device_memory) 25,249,710,080 = 0.3019
    #   85 %   int(0.85 x 25,249,710,080) = 21,462,253,568 -> headroom 13,840,176,192
    #   max context: each cell of -c costs 69,632 KV + 1,024 mask / 4 slots = 69,888 B;
    #          fixed 419,430,400 + 4,616,334,272 + 296,222,720 = 5,331,987,392:
    #          (21,462,253,568 - 5,331,987,392) / 69,888 = 230,801.6 cells, in steps
    #          of 4 slots x 256 = 1024 -> 225 x 1024 = 230,400
    #   max parallel, each session keeping its 8,192 tokens (-c = 8,192 x p, as plan):
    #          5,331,987,392 + one stream's mask 8,388,608 = 5,340,376,000 fixed, and
    #          8,192 x 69,632 = 570,425,344 a session:
    #          (21,462,253,568 - 5,340,376,000) / 570,425,344 = 28.26 -> 28
    # (per-slot streams: --no-kv-unified, as a scenario's engine.allocator: slots)
    code, out, _ = run(capsys, "fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                       "--weights", "q4_k_m", "--engine", "llama.cpp", "--context", "8192",
                       "--parallel", "4", "--no-kv-unified", "--kv", "q8_0", "--json")
    d = json.loads(out)
    assert code == 0
    assert d["kv_bytes_per_token"] == 69632
    assert d["kv_reserved_bytes"] == 32768 * 69632 == 2_281_701_376  # 4 slots of 8192
    assert d["slot_tokens"] == 8192 and d["allocator"] == "slots"
    assert d["device_bytes"] == 24_080 * 2**20 and d["fits"] is True  # as CUDA reports it
    assert (d["driver_reserve_bytes"], d["display_reserve_bytes"]) == (419_430_400, 0)
    assert d["weights_gpu_bytes"] == 4_616_334_272
    assert (d["weights_total_bytes"], d["weights_cpu_bytes"]) == (4_911_836_096, 295_501_824)
    # compute buffer 296,222,720 + one slot stream's F16 mask 8192 x 512 x 2 = 8,388,608
    assert d["activation_bytes"] == 304_611_328 and d["engine_overhead_bytes"] == 0
    assert d["total_bytes"] == 7_622_077_376
    assert d["device_fraction"] == pytest.approx(0.3019, abs=1e-4)
    assert d["headroom_to_85_bytes"] == 13_840_176_192
    assert (d["gpu_layers"], d["num_layers"]) == (32, 32)
    assert d["max_context_at_85"] == 230_400
    assert d["max_parallel_at_85"] == 28


def test_max_context_is_the_85_percent_boundary(capsys):
    args = ["fit", "--gpu", "rtx-4060-ti-16gb", "--model", "qwen2.5-14b", "--engine",
            "llama.cpp", "--parallel", "1", "--kv", "f16", "--json"]
    best = json.loads(run(capsys, *args, "--context", "4096")[1])["max_context_at_85"]
    at = json.loads(run(capsys, *args, "--context", str(best))[1])
    over = json.loads(run(capsys, *args, "--context", str(best + 256))[1])
    assert at["total_bytes"] <= 0.85 * at["device_bytes"] < over["total_bytes"]


def test_human_table_and_engines(capsys):
    code, out, _ = run(capsys, "fit", "--gpu", "rtx-3090", "--model", "llama-3.1-8b",
                       "--weights", "bf16", "--engine", "vllm", "--context", "20000")
    assert code == 0 and "GPU KV cache size:" in out and "Maximum concurrency" in out
    code, out, _ = run(capsys, "fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                       "--engine", "ollama", "--context", "8192", "--parallel", "4",
                       "--kv", "q8_0", "--flash-attn", "--ollama-version", "0.11.4")
    # docs/reference/engines.md §4.2: releases up to 0.11.4 place layers by their own estimate
    assert code == 0 and "Ollama's own estimate" in out and "under-counts" in out
    code, out, _ = run(capsys, "fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                       "--engine", "sglang", "--context", "8192", "--json")
    assert "mem_fraction_static=0.847" in json.loads(out)["log_lines"][0]


def test_ollama_ignores_quantized_kv_without_flash_attention(capsys):
    # docs/reference/engines.md §4.1: flash attention off by default for llama before 0.30 (0.12.4
    # turned it on for qwen3 / gpt-oss only), and without it Ollama keeps an f16 cache
    code, out, _ = run(capsys, "fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                       "--engine", "ollama", "--kv", "q8_0", "--ollama-version", "0.12.4",
                       "--json")
    d = json.loads(out)
    assert code == 0 and d["cache_type_v"] == "f16"
    assert any("q8_0" in n and "flash attention" in n for n in d["notes"]), d["notes"]
    # from 0.30 Ollama runs llama-server with --flash-attn auto: the q8_0 cache is kept
    code, out, _ = run(capsys, "fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                       "--engine", "ollama", "--kv", "q8_0", "--json")
    assert json.loads(out)["cache_type_v"] == "q8_0"
    code, _, err = run(capsys, "fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                       "--engine", "vllm", "--ollama-version", "0.12.4")
    assert code == 2 and "--ollama-version" in err


@pytest.mark.parametrize("args,needle", [
    (["--gpu", "rtx-4091"], "closest: rtx-4090"),
    (["--model", "llama-3.1-9b"], "closest"),
    (["--engine", "vllmm"], "one of: vllm, "),
    (["--context", "0"], "--context"),
    (["--context", "-5"], "--context"),
    (["--parallel", "0"], "--parallel"),
    (["--context", "8", "--parallel", "16"], "must not exceed --context"),
    (["--display-reserve", "1 GiBs"], "--display-reserve"),
    (["--context", "32kk"], "--context"),
    (["--weights", "q4_k_x"], "--weights"),
    (["--kv", "q8_0", "--no-flash-attn"], "needs flash attention"),
    (["--no-hybrid-kv"], "only vllm has a hybrid KV cache manager"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, needle):
    base = {"--gpu": "rtx-4090", "--model": "llama-3.1-8b", "--engine": "llama.cpp"}
    argv = ["fit"]
    given = dict(zip(args[::2], args[1::2])) if len(args) % 2 == 0 else {}
    for k, v in base.items():
        if k not in given:
            argv += [k, v]
    argv += args
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("engine,args,line", [
    ("llama.cpp", ["--kv", "q9_0"], ("error: --kv: 'q9_0' — not supported by llama.cpp; "
                                     "allowed: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, "
                                     "q5_0, q5_1")),
    ("vllm", ["--kv-v", "q8_0"], ("error: --kv-v: 'q8_0' — not supported by vllm; "
                                  "allowed: f16, bf16, fp8, fp8_e4m3, fp8_e5m2")),
    # Ollama would silently use f16 without flash attention; an unknown type is still an error
    ("ollama", ["--kv", "q9_0"], ("error: --kv: 'q9_0' — not supported by ollama; "
                                  "allowed: f16, q8_0, q4_0")),
])
def test_unknown_cache_type_names_the_flag(capsys, engine, args, line):
    code, out, err = run(capsys, "fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                         "--engine", engine, *args)
    assert code == 2 and out == "" and err == line + "\n"


def test_vllm_hybrid_manager_fits_gemma_3_at_32k_and_the_flag_turns_it_off(capsys):
    # Gemma-3-12B fp8 on a 4090 at max_model_len 32768, vLLM's newest release (tied
    # embedding E = 262,208 x 3,840 = 1,006,878,720 params, kept bf16): weights (11.77e9 -
    # E) / 48 = 224,231,693 B a layer x 48 + 2 E = 12,776,878,704, + the SigLIP encoder's
    # 842,581,728 B in 16-bit (tests/model/test_vision.py); activation: the sampler pass,
    # 256 rows x 262,208 x 38 B + 2048 x 3,840 x 2 B of hidden states = 2,566,488,064,
    # beside 8 x 256 x 3,840 x 2 B of encoder outputs = 2,582,216,704 (above the encoder's
    # own pass, 2048 // 256 = 8 images x 4,096 patches x (2 x (2 x 1,152 + 2 x 4,304) +
    # 4 x 3 x 14 x 14) B = 792,199,168; the MLP's 2048 x 2 x (3 x 15,368 + 3 x 3,840) =
    # 236,027,904 is less); pool int(0.92 x 24080 MiB) 23,229,733,273 - weights -
    # activation - non-torch 375,809,638 - CUDA graphs 697,932,186 = 5,954,314,313.  Its
    # 5,678 1-MiB blocks (6 groups of 8 layers: 8 x 16 tokens x 8,192 B) hold one
    # request's 2048 full + 5 x 193 sliding blocks; with every layer at full length
    # (blocks of 16 x 48 x 8,192 = 6,291,456 B) it holds 946 x 16 = 15,136 tokens < 32768
    # and vLLM refuses
    argv = ["fit", "--gpu", "rtx-4090", "--model", "gemma-3-12b", "--weights", "fp8",
            "--engine", "vllm", "--context", "32768", "--json"]
    code, out, _ = run(capsys, *argv)
    on = json.loads(out)
    assert code == 0 and on["fits"] and on["blocks_per_request"] == 3013
    assert on["num_gpu_blocks"] == 5678 and on["kv_reserved_bytes"] == 5678 * 2**20
    assert on["kv_groups"] == [["sliding", 1024]] * 5 + [["full", 0]]
    assert on["max_concurrency"] == pytest.approx(on["num_gpu_blocks"] / 3013)
    code, out, _ = run(capsys, *argv, "--no-hybrid-kv")
    off = json.loads(out)
    assert not off["fits"] and off["kv_groups"] == [] and off["kv_pool_tokens"] == 15136


def test_ollamas_estimate_says_when_the_output_layer_and_tower_stay_off(capsys):
    # Gemma 3 12B with 11.1 GiB of a 12 GB card free (ollama-001's): Ollama's estimate
    # keeps the output layer and the vision tower off the GPU (48 of 49 layers)
    code, out, _ = run(capsys, "fit", "--gpu", "rtx-3060-12gb", "--model", "gemma-3-12b",
                       "--engine", "ollama", "--context", "8192", "--parallel", "1",
                       "--ollama-version", "0.9.0", "--display-reserve", "0.9GiB")
    flat = " ".join(out.split())
    assert code == 0 and "48/48 layers; the output layer and vision tower in CPU RAM" in flat
    assert "projector.weights=795.87 MiB projector.graph=1.01 GiB" in flat
