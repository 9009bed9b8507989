"""Start-up logs as users paste them: a GPU named only by vendor and memory size, the free
memory Ollama printed, a release known only by the log's date, figures known only to
their printed digits, and the engines' own lines (llama.cpp's buffers, Ollama's
per-device layout, vLLM's maximum concurrency) — kvsim.validate.memlogs, .memlog_text,
.memlog_predict."""
import csv
from pathlib import Path

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.budget import memory_budget
from kvsim.engines.ollama_releases import ollama_release_at
from kvsim.engines.resolve import engine_for_gpu
from kvsim.validate.memlog_predict import engine_spec, memory_rows
from kvsim.validate.memlog_text import read_figures
from kvsim.validate.memlogs import available_bytes, gpu_candidates, read_memory_rows

PUBLISHED = Path(__file__).resolve().parents[2] / "docs" / "reference" / "measurements" / \
    "engine-memory-logs.csv"
GIB = 2**30
NVIDIA_24 = ("a10", "a30", "l4", "quadro-rtx-6000", "rtx-3090", "rtx-3090-ti", "rtx-4090",
             "rtx-4090-d", "rtx-4500-ada", "rtx-5090-laptop", "rtx-a5000", "rtx-a5500",
             "rtx-pro-4000-blackwell", "tesla-p40", "titan-rtx")


def _published(rid: str):
    with open(PUBLISHED, encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return next(m for m in read_memory_rows(rows, PUBLISHED.name) if m.id == rid)


@pytest.mark.parametrize("gpu, vram, candidates, said", [
    ("1x AMD GPU, 24 GiB (model not seen)", "memory.available=[24.0 GiB]", ("rx-7900-xtx",),
     "AMD cards of the gpu cell's 24 GiB, 24.0 GiB from the vram_total cell"),
    ("1x NVIDIA GPU, 24GB class (model not seen)", "memory.available=[22.7 GiB]", NVIDIA_24,
     "NVIDIA cards of the gpu cell's 24GB, 22.7 GiB from the vram_total cell"),
    ("1x NVIDIA GPU (model not stated)", "", (), ""),             # no size: no candidates
    ("1x NVIDIA GPU (model not seen)", "memory.available=[11.1 GiB]", (  # the free memory's
        "rtx-2060-12gb", "rtx-3060-12gb", "rtx-3080-12gb", "rtx-3080-ti", "rtx-4070",
        "rtx-4070-super", "rtx-4070-ti", "rtx-4080-laptop", "rtx-5070", "rtx-a2000-12gb"),
     "NVIDIA cards, 11.1 GiB from the vram_total cell"),
    ("AMD Instinct (~287 GB total implied; inferred)", "", (),    # no AMD card that size
     "AMD cards of the gpu cell's 287 GB"),
])
def test_a_vendor_and_a_memory_size_name_the_cards_they_fit(gpu, vram, candidates, said):
    assert gpu_candidates(gpu, vram) == (candidates, said)


def test_ollamas_free_memory_is_read_from_either_cell():
    assert available_bytes("memory.available=[22.7 GiB]") == (round(22.7 * GIB),)
    assert available_bytes("", 'x=1; memory.available="[23.6 GiB 11.8 GiB]"') == \
        (round(23.6 * GIB), round(11.8 * GIB))
    assert available_bytes("24 GB", "nothing") == ()


def test_a_log_showing_no_release_is_laid_out_as_the_one_out_before_its_date():
    assert ollama_release_at("2024-07-24")[0] == "0.1.49"
    assert ollama_release_at("2025-04-30")[0] == "0.1.49"  # v0.6.7's month: maybe before it
    assert ollama_release_at("2025-05")[0] == "0.6.7"
    assert ollama_release_at("2026-08-01")[0] == "0.30.0"
    assert ollama_release_at("2024-05-01")[0] is None   # before the first release kvsim dates
    assert ollama_release_at("")[0] is None


def test_an_unnamed_amd_card_with_ollamas_estimate_is_compared():
    # ollama-007 (ollama issue #5913, 2024-07-24, ROCm): "1x AMD GPU, 24 GiB", dolphin-qwen2
    # 72B q4_k_s, ctx 2048; laid out as v0.1.49 on the one 24 GiB AMD card, all of its
    # 24.0 GiB free.  qwen2's graphs are what the log printed (tests/config/test_ollama_graph.py)
    # and the estimator places the same 43 layers
    m = _published("ollama-007")
    spec, notes = engine_spec(m)
    assert spec["ollama_version"] == "0.1.49" and "2024-07-24" in notes[0]
    rows, skipped = memory_rows(m)
    by = {r["metric"]: r for r in rows}
    assert skipped == [] and rows[0]["gpu"] == "rx-7900-xtx"
    assert by["ollama_layers_offload"]["predicted"] == 43
    assert by["ollama_graph_full_bytes"]["predicted"] == by["ollama_graph_full_bytes"]["measured"]
    assert by["ollama_graph_partial_bytes"]["rel_err"] == 0.0  # 1.26 GiB prints as "1.3 GiB"
    assert by["ollama_required_kv_bytes"]["rel_err"] == 0.0
    for metric in ("ollama_required_full_bytes", "ollama_required_partial_bytes"):
        assert abs(by[metric]["rel_err"]) < 0.003


def test_memory_in_use_by_others_is_what_ollama_did_not_see_free():
    # ollama-013: "memory.available=[22.7 GiB]" on a 24 GB card (sized as the a10, 24 GiB
    # less 2 % as CUDA reports it, 23.52 GiB): the other 0.82 GiB are held by others, so
    # the layout is the card's with that much reserved
    m = _published("ollama-013")
    rows, _ = memory_rows(m)
    assert rows and all("memory.available 22.7 GiB: the other 0.82 GiB of the card in use "
                        "by others" in r["notes"] for r in rows)
    g, mod = load_gpu(rows[0]["gpu"]), load_model("llama-3.1-8b")
    spec, _ = engine_spec(m)
    cfg = engine_for_gpu(spec, g, mod, weights="q4_k_m")
    b = memory_budget(g, mod, "q4_k_m", cfg,
                      display_reserve_bytes=g.usable_memory_bytes - round(22.7 * GIB))
    full = next(r for r in rows if r["metric"] == "ollama_required_full_bytes")
    assert full["predicted"] == b.estimate.full_bytes


def test_a_figure_is_known_only_to_the_digits_printed():
    (f,), _ = read_figures("memory.graph.partial=1.3 GiB", "x")
    assert f.half_unit == pytest.approx(0.05 * GIB)
    (g,), _ = read_figures("total_gpu_memory=23.58GiB", "x", gb_is_gib=True)
    assert g.half_unit == pytest.approx(0.005 * GIB)
    (h,), _ = read_figures("actual VRAM usage=about 36 GiB", "x")
    assert h.half_unit == pytest.approx(0.5 * GIB)


def test_a_vendor_and_size_no_card_has_is_the_reason():
    # sglang-007: "AMD Instinct (…; ~287 GB total implied; inferred)": no AMD profile holds
    # 287 GB, and the skipped row says so
    m = _published("sglang-007")
    assert m.gpus == () and m.gpu_candidates == ()
    assert m.gpu_reason.endswith("; no card in the catalogue fits (AMD cards of the gpu "
                                 "cell's 287 GB)")


def test_ollamas_per_device_layout_lines_are_read():
    # the Go engine's lines as Ollama prints them (ollama issue #12247's log): the GPU's
    # parts are compared, the host's are not a GPU's
    text = ('source=backend.go:332 msg="compute graph" device=CUDA0 size="108.0 MiB"; '
            'source=backend.go:337 msg="compute graph" device=CPU size="6.0 MiB"; '
            'source=backend.go:342 msg="total memory" size="1.1 GiB"')
    figures, unread = read_figures(text, "x")
    assert unread == () and [(f.metric, f.device, f.value) for f in figures] == \
        [("compute_bytes", "CUDA0", 108 * 2**20)]


def test_an_ollama_layout_is_compared_per_device(tmp_path):
    # llama3.1:8b at num_ctx 8192 on an RTX 3090 (v0.12.11: measured layouts): its f16 KV
    # is 8192 x 128 KiB = 1.0 GiB, printed on CUDA0
    f = tmp_path / "mine.csv"
    f.write_text("id,engine,engine_version,gpu,vram_total,model,weight_format,settings,"
                 "printed_figures,latency_figures,source,date,notes\n"
                 'ol-9,ollama,0.12.11,1x NVIDIA GeForce RTX 3090,,llama3.1:8b,Q4_K_M,'
                 'num_ctx=8192,"msg=""kv cache"" device=CUDA0 size=""1.0 GiB""",,me,2025-12,\n',
                 encoding="utf-8")
    with open(f, encoding="utf-8") as fh:
        (m,) = read_memory_rows(list(csv.DictReader(fh)), f.name)
    rows, skipped = memory_rows(m)
    (kv,) = [r for r in rows if r["metric"] == "kv_bytes"]
    assert skipped == [] and kv["device"] == "CUDA0" and kv["measured"] == GIB
    assert kv["rel_err"] == 0.0


def test_llama_cpp_start_up_lines_are_read_as_printed(tmp_path):
    # a llama-server start-up pasted as it prints (Llama 3.1 8B Q4_K_M, -c 16384, one GPU):
    # 16,384 cells x 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 2048.00 MiB on CUDA0;
    # the host's CPU_Mapped / CUDA_Host buffers are not the GPU's
    lines = ("llama_kv_cache: CUDA0 KV buffer size = 2048.00 MiB; "
             "load_tensors: CUDA0 model buffer size = 4403.49 MiB; "
             "load_tensors: CPU_Mapped model buffer size = 281.81 MiB; "
             "llama_context: CUDA0 compute buffer size = 560.00 MiB; "
             "llama_context: CUDA_Host compute buffer size = 40.01 MiB")
    figures, _ = read_figures(lines, "x")
    assert {(f.metric, f.device, f.value) for f in figures} == {
        ("kv_bytes", "CUDA0", 2048 * 2**20), ("weights_bytes", "CUDA0", round(4403.49 * 2**20)),
        ("compute_bytes", "CUDA0", 560 * 2**20)}
    f = tmp_path / "mine.csv"
    f.write_text("id,engine,engine_version,gpu,vram_total,model,weight_format,settings,"
                 "printed_figures,latency_figures,source,date,notes\n"
                 f'lc-1,llama.cpp,b6500,NVIDIA GeForce RTX 3090,,llama-3.1-8b,Q4_K_M,'
                 f'ctx_size=16384; parallel=1,"{lines}",,me,2025-10,\n', encoding="utf-8")
    with open(f, encoding="utf-8") as fh:
        (m,) = read_memory_rows(list(csv.DictReader(fh)), f.name)
    rows, _ = memory_rows(m)
    by = {r["metric"]: r for r in rows}
    assert by["kv_bytes"]["rel_err"] == 0.0 and by["kv_bytes"]["device"] == "CUDA0"
    assert {"weights_bytes", "compute_bytes"} <= set(by)
    # an older build's one-line total, with no device
    (old,), _ = read_figures("llama_kv_cache_unified: size = 2048.00 MiB (16384 cells, 32 "
                             "layers, 1/1 seqs), K (f16): 1024.00 MiB, V (f16): 1024.00 MiB", "x")
    assert (old.metric, old.device, old.value) == ("kv_bytes", "", 2048 * 2**20)


def test_vllms_maximum_concurrency_is_its_pool_over_the_request_length(tmp_path):
    # vllm-011 printed 567,978 tokens and 4.33x for 131,072 tokens per request: kvsim's
    # concurrency is off by what its pool is
    rows, _ = memory_rows(_published("vllm-011"))
    by = {r["metric"]: r for r in rows}
    assert by["max_concurrency"]["unit"] == "x" and by["max_concurrency"]["measured"] == 4.33
    assert by["max_concurrency"]["rel_err"] == pytest.approx(by["kv_tokens"]["rel_err"],
                                                             abs=0.002)
    # a log whose settings do not give max_model_len: the printed L is it
    f = tmp_path / "mine.csv"
    f.write_text("id,engine,engine_version,gpu,vram_total,model,weight_format,settings,"
                 "printed_figures,latency_figures,source,date,notes\n"
                 "v-1,vllm,0.11.0,NVIDIA GeForce RTX 4090,,meta-llama/Llama-3.1-8B-Instruct,"
                 'BF16,,"Maximum concurrency for 32,768 tokens per request: 1.23x",,me,'
                 "2025-10,\n", encoding="utf-8")
    with open(f, encoding="utf-8") as fh:
        (m,) = read_memory_rows(list(csv.DictReader(fh)), f.name)
    spec, notes = engine_spec(m)
    assert spec["context_tokens"] == 32_768 and any("printed maximum concurrency" in n
                                                    for n in notes)


def test_sglangs_pool_line_as_printed_or_rewritten():
    # SGLang prints "KV Cache is allocated. #tokens: N, K size: X GB, V size: Y GB" (GiB)
    for text in ("KV Cache is allocated. #tokens: 1669816, K size: 76.44 GB, V size: 76.44 GB",
                 "#tokens=1669816 K size=76.44 GB V size=76.44 GB"):
        figures, _ = read_figures(text, "x", gb_is_gib=True)
        assert [(f.metric, f.value) for f in figures] == [
            ("kv_tokens", 1_669_816), ("kv_bytes", 2 * round(76.44 * GIB))]


def test_vllms_lines_as_printed_without_equals_signs(tmp_path):
    # a V1 start-up pasted as its log prints it, with the logger's prefix: each figure is
    # the words before its number ("GPU KV cache size: 48,944 tokens", "model weights
    # take 14.99GiB", "the rest of the memory reserved for KV Cache is 4.87GiB")
    text = ("INFO 01-01 12:00:00 [gpu_model_runner.py:1234] Model loading took 14.9888 GiB "
            "and 5.2 seconds\n"
            "INFO 01-01 12:00:01 [kv_cache_utils.py:716] GPU KV cache size: 48,944 tokens\n"
            "INFO 01-01 12:00:01 [kv_cache_utils.py:720] Maximum concurrency for 20,000 "
            "tokens per request: 2.45x\n"
            "Memory profiling takes 5.2 seconds\n"
            "the current vLLM instance can use total_gpu_memory (23.58GiB) x "
            "gpu_memory_utilization (0.90) = 21.22GiB\n"
            "model weights take 14.99GiB; non_torch_memory takes 0.13GiB; PyTorch activation "
            "peak memory takes 1.23GiB; the rest of the memory reserved for KV Cache is 4.87GiB.")
    figures, unread = read_figures(text, "x", gb_is_gib=True)
    by = {f.metric: f.value for f in figures}
    assert unread == () and by == {
        "kv_tokens": 48_944, "kv_bytes": round(4.87 * GIB), "weights_bytes": round(14.9888 * GIB),
        "compute_bytes": round(1.23 * GIB), "device_bytes": round(23.58 * GIB),
        "max_concurrency": 2.45}


def test_gemma3s_estimate_beside_a_log_of_the_model_it_fits():
    # ollama-001 (ollama PR #12000, Aug 2025) shows no model, but 49 layers (48 + output),
    # a projector and an 8192-token context: laid out as Gemma 3 12B (Q4_K_M, Ollama's
    # default tag), every figure it printed comes out as printed: the KV, 992.0 MiB by
    # GraphSize's gemma3 case (8 global layers x 64 MiB + 40 sliding x (1024 + 512) cells
    # x 12 KiB); both graphs (519.5 MiB, 1.3 GiB); the vision tower (795.9 MiB, graph
    # 1.0 GiB) with the output layer, which the 11.1 GiB free cannot hold, so 48 of 49
    # layers and required 8.9 / 11.4 GiB. The free 11.1 GiB fits ten NVIDIA profiles,
    # which lay it out alike.
    from dataclasses import replace

    m = _published("ollama-001")
    assert len(m.gpu_candidates) == 10 and m.free_bytes == (round(11.1 * GIB),)
    rows, skipped = memory_rows(replace(m, weights="q4_k_m"), model=load_model("gemma-3-12b"))
    by = {r["metric"]: r for r in rows}
    assert skipped == [] and by["ollama_required_kv_bytes"]["predicted"] == 992 * 2**20
    assert by["ollama_layers_offload"]["predicted"] == 48
    assert abs(by["ollama_graph_full_bytes"]["rel_err"]) < 2e-4  # the vocabulary's padding
    assert {k for k, r in by.items() if r["rel_err"] != 0.0} == {"ollama_graph_full_bytes"}
    assert set(by) == {"ollama_required_full_bytes", "ollama_required_partial_bytes",
                       "ollama_required_kv_bytes", "ollama_graph_full_bytes",
                       "ollama_graph_partial_bytes", "ollama_projector_weights_bytes",
                       "ollama_projector_graph_bytes", "ollama_layers_offload"}
