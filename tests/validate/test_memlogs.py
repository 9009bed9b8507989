"""``kvsim validate`` on start-up memory logs (engine-memory-logs.csv): real rows read to
the figures the engines printed, compared with kvsim's load-time layout, every row
predicted or skipped with its reason, bad cells one line."""
import csv
import io
import json
from pathlib import Path

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu
from kvsim.errors import InputError
from kvsim.validate.memlog_predict import engine_spec, memory_rows
from kvsim.validate.memlog_text import read_figures, read_settings
from kvsim.validate.memlogs import MemoryMeasurement, gpu_candidates, read_memory_rows
from kvsim.validate.run import read_files, read_inputs, validate

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "data" / "memory_logs.csv"   # rows copied from the published file
PUBLISHED = HERE.parents[1] / "docs" / "reference" / "measurements" / "engine-memory-logs.csv"
SHARED = HERE.parents[2] / "shared" / "measurements" / "engine-memory-logs.csv"
HEADER = ("id,engine,engine_version,gpu,vram_total,model,weight_format,settings,"
          "printed_figures,latency_figures,source,date,notes\n")


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _read(path: Path = SAMPLE) -> dict[str, MemoryMeasurement]:
    return {m.id: m for m in read_memory_rows(_rows(path), path.name)}


def _validated(path: Path = SAMPLE):
    meas, skipped, problems = read_inputs([path])
    assert problems == [] and skipped == []
    return validate(meas)


def _one_row(tmp_path: Path, line: str) -> Path:
    f = tmp_path / "mine.csv"
    f.write_text(HEADER + line + "\n", encoding="utf-8")
    return f


def test_vllm_001_blocks_times_block_size_beside_kvsims_pool():
    m = _read()["vllm-001"]
    assert (m.engine, m.gpus, m.model, m.weights, m.startup) == (
        "vllm", ("rtx-3090",), "llama-3.1-8b", "bf16", "ok")
    assert m.settings == {"max_model_len": 20000, "gpu_memory_utilization": 0.9}
    fig = {f.metric: f.value for f in m.figures}
    assert fig["kv_tokens"] == 1952 * 16 == 31232          # "GPU blocks=1952", block 16
    assert fig["kv_bytes"] == round(3.81 * 2**30)          # kv_cache_size=3.81GiB
    assert fig["weights_bytes"] == round(14.9888 * 2**30)  # vLLM's "GB" is GiB
    assert fig["device_bytes"] == round(23.58 * 2**30)
    rows, skipped = memory_rows(m)
    assert skipped == []
    by = {r["metric"]: r for r in rows}
    # kvsim's prediction: the layout `kvsim fit --vllm-version 0.7.3` gives for the same
    # knobs (a V0-format log, release not shown: the last release whose default was V0)
    g, mod = load_gpu("rtx-3090"), load_model("llama-3.1-8b")
    cfg = engine_for_gpu({"preset": "vllm", "context_tokens": 20000, "version": "0.7.3",
                          "gpu_memory_utilization": 0.9}, g, mod, weights="bf16")
    b = memory_budget(g, mod, "bf16", cfg)
    kv = by["kv_tokens"]
    assert (kv["measured"], kv["predicted"], kv["kind"], kv["backend"]) == (
        31232, b.kv_pool_tokens, "memory", "vllm")
    assert kv["rel_err"] == pytest.approx((b.kv_pool_tokens - 31232) / 31232)
    # V0 profiles one whole max_model_len: within 2 % of the 1,952 blocks it printed
    assert b.kv_pool_tokens == 31568 and abs(kv["rel_err"]) < 0.02
    assert by["kv_bytes"]["predicted"] == b.kv_reserved_bytes
    assert by["weights_bytes"]["predicted"] == b.weights_gpu_bytes
    assert by["startup"]["measured"] == "ok"
    assert by["startup"]["rel_err"] == (0.0 if b.fits else 1.0)


def test_failed_startups_must_be_predicted_to_fail():
    ms = _read()
    assert ms["vllm-002"].startup == "failed" and ms["vllm-017"].startup == "failed"
    assert {f.metric: f.value for f in ms["vllm-002"].figures}["kv_tokens"] == 23648
    assert {f.metric: f.value for f in ms["vllm-017"].figures}["kv_tokens"] == 24320
    rows, _ = memory_rows(ms["vllm-002"])
    start = next(r for r in rows if r["metric"] == "startup")
    assert start["measured"] == "failed"
    # a miss (1) unless kvsim's layout refuses the start-up too
    assert start["rel_err"] == (0.0 if start["predicted"] == "failed" else 1.0)
    # vllm-017 (Qwen1.5-7B GPTQ, a February 2024 log: V0, laid out as 0.7.3): its default
    # max_model_len 32768 is more than the pool holds, so the start-up fails as it did
    rows, skipped = memory_rows(ms["vllm-017"])
    by = {r["metric"]: r for r in rows}
    assert skipped == [] and (by["startup"]["measured"], by["startup"]["predicted"]) == (
        "failed", "failed")
    assert by["kv_tokens"]["predicted"] < 32768
    assert any("before vLLM 0.8.0 made V1 the default" in n for n in by["startup"]["notes"])


def test_a_v1_log_dated_before_0_17_is_laid_out_with_graphs_outside_the_budget():
    # vllm-004 (2025-07-22, release not shown, V1 log lines): a release before 0.21.0, so
    # a share of 0.9 with CUDA graphs outside it, as `kvsim fit --vllm-version 0.16.0`
    m = _read(PUBLISHED)["vllm-004"]
    spec, notes = engine_spec(m)
    assert spec["version"] == "0.16.0"
    assert any("before vLLM 0.21.0 took CUDA-graph memory into the budget" in n
               for n in notes)
    rows, _ = memory_rows(m)
    by = {r["metric"]: r for r in rows}
    g, mod = load_gpu("h100-pcie-80gb"), load_model("qwen3-235b-a22b")
    cfg = engine_for_gpu(spec, g, mod, weights="fp8", more_gpus=(g,) * 3)
    assert (cfg.gpu_memory_utilization, cfg.cuda_graphs_in_budget) == (0.9, False)
    b = memory_budget(g, mod, "fp8", cfg, more_gpus=(g,) * 3)
    assert by["kv_tokens"]["predicted"] == b.kv_pool_tokens
    # 178,880 printed; what is left is non-torch memory (docs/validation.md)
    assert 0.25 < by["kv_tokens"]["rel_err"] < 0.33


def test_unshown_model_and_gpu_are_the_reason():
    _, skipped = memory_rows(_read()["vllm-022"])
    assert [s.id for s in skipped] == ["vllm-022"]
    assert skipped[0].reason == "model not shown in the log; GPU not named in the log"
    _, skipped = memory_rows(_read()["ollama-005"])
    assert skipped[0].reason == "model not shown in the log"


def test_several_gpus_are_laid_out_as_the_engine_splits_them():
    m = _read()["llamacpp-008"]
    assert m.gpus == ("rtx-3090", "rtx-3090") and m.model == "qwen3-32b"
    # the notes: "quantized KV needs FA which failed with --split-mode layer": no FA
    assert m.settings == {"ctx_size": 32768, "n_gpu_layers": 99, "split_mode": "layer",
                          "flash_attn": False}
    assert m.stated == ("flash attention off: the notes say it failed",)
    g, mod = load_gpu("rtx-3090"), load_model("qwen3-32b")
    cfg = engine_for_gpu(engine_spec(m)[0], g, mod, weights="q5_k_m", more_gpus=(g,))
    b = memory_budget(g, mod, "q5_k_m", cfg, more_gpus=(g,))
    rows, skipped = memory_rows(m)
    by = {r["metric"]: r for r in rows}
    assert skipped == [] and set(by) == {"used_bytes", "startup"}
    # the user's nvidia-smi reading (~40.5 GB) beside both GPUs' whole layout
    assert by["used_bytes"]["predicted"] == b.total_bytes == sum(d.total_bytes
                                                                for d in b.devices)
    assert [d.layers for d in b.devices] == [33, 31]


def test_without_flash_attention_the_box_holds_the_users_reading():
    # llamacpp-008 (Qwen3-32B Q5_K_M, -c 32k over two RTX 3090s): with flash attention off
    # each GPU's compute buffer holds one layer's f32 KQ scores, 64 heads x 512 x 32,768
    # cells x 4 B = 4 GiB, and the box comes to 41.25e9 B beside the user's ~40.5 GB (+1.7 %
    # beyond the ±0.05 GB its last digit stands for; weights sized as llama-quantize's
    # Q5_K_M mix, 22.70e9 B on the GPUs); with it on
    # (llama.cpp's default), 32.6e9 (-19 %)
    rows, _ = memory_rows(_read()["llamacpp-008"])
    used = next(r for r in rows if r["metric"] == "used_bytes")
    assert used["measured"] == 40.5e9
    assert used["rel_err"] == pytest.approx(0.0172, abs=5e-4)  # beyond "40.5" GB's ±0.05
    assert "flash attention off: the notes say it failed" in used["notes"]


def test_a_box_whose_model_sits_on_one_card_is_that_card():
    # llamacpp-002: "4x NVIDIA GeForce GTX 1080 (model on CUDA0 only)": the breakdown shows
    # the other three holding nothing of the model, so the layout is one GTX 1080's
    m = _read(PUBLISHED)["llamacpp-002"]
    assert (m.gpus, m.gpu_count) == (("gtx-1080",), 1)
    rows, _ = memory_rows(m)
    kv = next(r for r in rows if r["metric"] == "kv_bytes")
    # gpt-oss-20b at n_ctx_seq 16128, default -ub 512, 4 unified slots: 12 full layers x
    # 8 KV heads x (64 + 64) x 2 B = 24,576 B x 16,128 cells = 396,361,728 B, 12 SWA layers
    # x 2,048 B x pad256(128 x 4 + 512) = 1,024 cells = 25,165,824 B -> 421,527,552 B.
    # The log's 576 MiB = 396,361,728 + 12 x 2,048 x pad256(128 + 8,192) = 8,448 cells,
    # i.e. -ub 8192, which the row does not state
    assert (kv["gpu"], kv["measured"], kv["predicted"]) == ("gtx-1080", 576 * 2**20,
                                                            421_527_552)
    assert 396_361_728 + 12 * 2_048 * 8_448 == 576 * 2**20


def test_every_published_row_is_a_prediction_or_skipped():
    v = _validated(PUBLISHED)
    ids = [r["id"] for r in _rows(PUBLISHED)]
    assert len(ids) == 34
    seen = {str(r["id"]) for r in v.rows} | {s.id.split(":")[0] for s in v.skipped}
    assert seen == set(ids)
    assert all(s.reason for s in v.skipped)
    for s in v.summary():
        assert s["kind"] == "memory" and s["n"] >= 1


@pytest.mark.skipif(not SHARED.is_file(), reason="no ../shared/measurements beside the repo")
def test_shared_measurements_file_reads_whole(kvsim_cli):
    code, err, out = kvsim_cli("validate", SHARED, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    ids = {r["id"] for r in _rows(SHARED)}
    got = {r["id"] for r in doc["rows"]} | {s["id"].split(":")[0] for s in doc["skipped"]}
    assert got == ids


def test_cli_json_rows_summary_and_skipped(kvsim_cli):
    code, err, out = kvsim_cli("validate", SAMPLE, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    kv = next(r for r in doc["rows"] if r["id"] == "vllm-001" and r["metric"] == "kv_tokens")
    assert kv["measured"] == 31232 and kv["unit"] == "tokens"
    summ = {(s["kind"], s["backend"], s["metric"]) for s in doc["summary"]}
    assert {("memory", "vllm", "kv_tokens"), ("memory", "vllm", "startup")} <= summ
    assert {s["id"] for s in doc["skipped"]} == {"ollama-005", "vllm-022"}
    # two RTX 3090s, llama.cpp's layer split: the whole box's memory beside the user's
    # reading, and the start-up outcome
    two = {r["metric"]: r for r in doc["rows"] if r["id"] == "llamacpp-008"}
    assert set(two) == {"used_bytes", "startup"} and two["used_bytes"]["gpu"] == "2x rtx-3090"
    code, err, out = kvsim_cli("validate", SAMPLE)
    assert code == 0 and "start-up memory" in out and "31,232" in out
    assert "predicted wrongly" in out


def test_speed_readers_list_memory_rows_as_skipped():
    meas, skipped, _ = read_files([SAMPLE])
    assert meas == [] and len(skipped) == 6
    assert all("kvsim validate" in s.reason for s in skipped)


def test_llama_cpp_breakdown_per_device(tmp_path):
    """A single-GPU llama-server start-up with llama_memory_breakdown_print (MiB)."""
    f = _one_row(tmp_path, 'lc-1,llama.cpp (llama-server),b6000,1x NVIDIA GeForce RTX 3090,'
                 ',Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf,Q4_K_M,"-c 8192; -ngl 99; -np 1",'
                 '"CUDA0 total=24124 free=23860 self=6000 (model 4685 + context 1024 + '
                 'compute 560) MiB; Host=300 (model 281 + compute 19) MiB",,,,Startup OK')
    m = _read(f)["lc-1"]
    assert m.settings == {"ctx_size": 8192, "n_gpu_layers": 99, "parallel": 1}
    figs = {(x.metric, x.device): x.value for x in m.figures}
    assert figs[("kv_bytes", "CUDA0")] == 1024 * 2**20
    assert figs[("compute_bytes", "CUDA0")] == 560 * 2**20
    assert figs[("device_bytes", "CUDA0")] == 24124 * 2**20
    rows, skipped = memory_rows(m)
    assert skipped == []
    g, mod = load_gpu("rtx-3090"), load_model("llama-3.1-8b")
    cfg = engine_for_gpu({"preset": "llama.cpp", "context_tokens": 8192, "gpu_layers": 99,
                          "parallel": 1, "allocator": "slots"}, g, mod, weights="q4_k_m")
    b = memory_budget(g, mod, "q4_k_m", cfg)
    by = {r["metric"]: r for r in rows}
    assert by["kv_bytes"]["device"] == "CUDA0"
    assert by["kv_bytes"]["predicted"] == b.kv_reserved_bytes
    assert by["compute_bytes"]["predicted"] == b.activation_bytes
    assert by["weights_bytes"]["predicted"] == b.weights_gpu_bytes


def test_ollama_estimate_beside_its_memory_required_line(tmp_path):
    f = _one_row(tmp_path, 'ol-1,ollama,0.5.7,1x NVIDIA GeForce RTX 3090,,llama3.1:8b,'
                 'Q4_K_M,"ctx-size=8192; parallel=1",'
                 '"layers.model=33; layers.offload=33; memory.required.full=6.2 GiB; '
                 'memory.required.partial=6.2 GiB; memory.required.kv=1.0 GiB",,,,')
    m = _read(f)["ol-1"]
    rows, skipped = memory_rows(m)
    assert skipped == []
    g, mod = load_gpu("rtx-3090"), load_model("llama-3.1-8b")
    spec = {"preset": "ollama", "context_tokens": 8192, "parallel": 1,
            "ollama_version": "0.5.7"}
    assert engine_spec(m)[0] == spec
    b = memory_budget(g, mod, "q4_k_m", engine_for_gpu(spec, g, mod, weights="q4_k_m"))
    by = {r["metric"]: r for r in rows}
    assert by["ollama_required_partial_bytes"]["predicted"] == b.estimate.total_bytes
    assert by["ollama_required_kv_bytes"]["measured"] == 2**30
    assert by["ollama_layers_offload"]["predicted"] == b.estimate.gpu_layers + 1


def test_settings_forms_and_defaults():
    knobs, remarks = read_settings("max_model_len=default 32768; gpu_memory_utilization="
                                   "not in non-default args (default); -c 32k; ngl=all; "
                                   "prefix caching=on; fit on (target 1 GiB); threads=28; "
                                   "kv_cache_dtype=fp8_e4m3 (uncalibrated); tp=2", "x")
    assert knobs == {"max_model_len": 32768, "gpu_memory_utilization": None,
                     "ctx_size": 32768, "n_gpu_layers": 2**31 - 1,
                     "enable_prefix_caching": True, "fit": True,
                     "kv_cache_dtype": "fp8_e4m3", "tensor_parallel_size": 2}
    assert remarks == ("threads=28",)
    figs, unread = read_figures("Model loading took=29.09 (unit cut off); "
                                "max_total_num_tokens=about 120576", "x", gb_is_gib=True)
    assert [(f.metric, f.value) for f in figs] == [("kv_tokens", 120576)]
    assert unread and "no byte unit" in unread[0]


@pytest.mark.parametrize("cell, field, value", [
    ('"max_model_len=abc"', "m-1.settings.max_model_len", "abc"),
    ('"gpu_memory_utilization=1.5"', "m-1.settings.gpu_memory_utilization", "1.5"),
])
def test_bad_number_is_one_line_naming_field_and_value(tmp_path, kvsim_cli, cell, field,
                                                       value):
    f = _one_row(tmp_path, f"m-1,vllm,,1x NVIDIA GeForce RTX 3090,,Llama-3.1-8B,bf16,{cell},"
                 "GPU KV cache size=1000 tokens,,,,")
    with pytest.raises(InputError) as exc:
        read_memory_rows(list(csv.DictReader(io.StringIO(f.read_text()))), f.name)
    assert (exc.value.field, exc.value.value) == (field, value)
    code, err, _ = kvsim_cli("validate", f)
    assert code == 2 and err.startswith("error: FILE")
    assert f"{field}: '{value}'" in kvsim_cli.stderr


def test_a_bad_number_skips_its_row_and_the_others_are_validated(tmp_path, kvsim_cli):
    """One row's bad setting used to drop the whole file (exit 2, nothing validated)."""
    good = ("m-1,vllm,,1x NVIDIA GeForce RTX 3090,,Llama-3.1-8B,bf16,max_model_len=8192,"
            "GPU KV cache size=1000 tokens,,,,")
    bad = ("m-2,vllm,,1x NVIDIA GeForce RTX 3090,,Llama-3.1-8B,bf16,"
           '"gpu_memory_utilization=0",GPU KV cache size=1000 tokens,,,,')
    f = tmp_path / "two.csv"
    f.write_text(HEADER + good + "\n" + bad + "\n", encoding="utf-8")
    code, err, out = kvsim_cli("validate", f, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert {r["id"] for r in doc["rows"]} == {"m-1"}
    assert doc["skipped"] == [{"id": "m-2", "reason": (
        "m-2.settings.gpu_memory_utilization: '0' — a memory fraction in (0, 1] such as 0.9 "
        "(or 'default')")}]


def test_bad_printed_figure_and_empty_file(tmp_path, kvsim_cli):
    f = _one_row(tmp_path, 'm-2,vllm,,1x NVIDIA GeForce RTX 3090,,Llama-3.1-8B,bf16,,'
                 '"GPU KV cache size=lots",,,,')
    code, _, _ = kvsim_cli("validate", f)
    assert code == 2 and "m-2.printed_figures.GPU KV cache size: 'lots'" in kvsim_cli.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text(HEADER, encoding="utf-8")
    code, _, _ = kvsim_cli("validate", empty)
    assert code == 2 and "at least one row" in kvsim_cli.stderr


def test_gpu_and_model_flags_stand_in_for_unnamed_ones(kvsim_cli):
    code, err, out = kvsim_cli("validate", SAMPLE, "--gpu", "rtx-3090", "--model",
                               "llama-3.1-8b", "--json")
    assert (code, err) == (0, "")
    why = {s["id"]: s["reason"] for s in json.loads(out)["skipped"]}
    assert why["vllm-022"] == "weights format not shown in the log"  # GPU and model given
    rows = json.loads(out)["rows"]   # the 2 GPUs the text names stay 2 x the --gpu given
    assert {r["gpu"] for r in rows if r["id"] == "llamacpp-008"} == {"2x rtx-3090"}


@pytest.mark.parametrize("gpu, vram, candidates, said", [
    ("4x NVIDIA H100", "not printed (H100 80GB class assumed; inferred)",
     ("h100-pcie-80gb", "h100-sxm5-80gb"),
     "80GB from the vram_total cell (which says it is inferred)"),
    ("NVIDIA A100", "total_gpu_memory=79.22GiB (printed)", ("a100-80gb-pcie", "a100-80gb-sxm4"),
     "79.22GiB from the vram_total cell"),
    ("NVIDIA H100", "94GB", ("h100-nvl",), "94GB from the vram_total cell"),
    ("NVIDIA H100", "not printed", ("h100-nvl", "h100-pcie-80gb", "h100-sxm5-80gb"), ""),
    ("NVIDIA A100", "24 GB", (), "24 GB from the vram_total cell"),   # no A100 has 24 GB
    ("RTX 3090", "24 GB", (), ""),                                    # resolved
])
def test_the_stated_memory_narrows_an_ambiguous_gpu(gpu, vram, candidates, said):
    assert gpu_candidates(gpu, vram) == (candidates, said)


def test_candidates_that_lay_the_start_up_out_alike_are_compared():
    # vllm-009: "1x NVIDIA A100", "80GB class inferred": the PCIe and SXM4 A100 80GB hold
    # the same memory, and nothing else of theirs enters a one-GPU vLLM start-up
    m = _read(PUBLISHED)["vllm-009"]
    assert (m.gpus, m.gpu_candidates) == ((), ("a100-80gb-pcie", "a100-80gb-sxm4"))
    rows, _ = memory_rows(m)
    sxm4, _ = memory_rows(m, load_gpu("a100-80gb-sxm4"))
    assert [(r["metric"], r["predicted"]) for r in rows] == \
        [(r["metric"], r["predicted"]) for r in sxm4]
    assert {r["metric"] for r in rows} == {"kv_bytes", "weights_bytes"}
    assert rows[0]["gpu"] == "a100-80gb-pcie" and rows[0]["notes"][-1] == (
        "GPU '1x NVIDIA A100' (80GB from the vram_total cell (which says it is inferred)) "
        "fits a100-80gb-pcie, a100-80gb-sxm4, which lay this figure out alike: sized as "
        "a100-80gb-pcie")


def test_candidates_that_part_skip_the_figures_they_part_on_with_each_ones_value():
    # vllm-010: "1x NVIDIA H100", memory not printed: the NVL's 94 GB hold more KV, so the
    # KV figure is skipped with each card's value; the weights, the same on every H100, are
    # compared
    m = _read(PUBLISHED)["vllm-010"]
    rows, skipped = memory_rows(m)
    nvl, _ = memory_rows(m, load_gpu("h100-nvl"))
    pcie, _ = memory_rows(m, load_gpu("h100-pcie-80gb"))
    kv = {r["metric"]: r["predicted"] for r in nvl}["kv_tokens"]
    kv_pcie = {r["metric"]: r["predicted"] for r in pcie}["kv_tokens"]
    assert kv > kv_pcie
    assert [r["metric"] for r in rows] == ["weights_bytes"]
    assert [s.id for s in skipped] == ["vllm-010:kv_tokens"]
    assert skipped[0].reason == (f"{m.gpu_reason}; the cards it fits lay kv_tokens out "
                                 f"differently: {kv:,.6g} (h100-nvl); {kv_pcie:,.6g} "
                                 "(h100-pcie-80gb, h100-sxm5-80gb)")


def test_a_stated_memory_that_leaves_one_profile_names_it(tmp_path):
    f = _one_row(tmp_path, 'x-1,vllm,0.11.0,1x NVIDIA H100,94GB,meta-llama/Llama-3.1-8B-Instruct,'
                 'BF16,gpu_memory_utilization=0.9,GPU KV cache size=500000 tokens,,me,2026-01,')
    m = _read(f)["x-1"]
    rows, skipped = memory_rows(m)
    assert skipped == [] and rows[0]["gpu"] == "h100-nvl"
    assert rows[0]["notes"][-1] == ("GPU '1x NVIDIA H100' (94GB from the vram_total cell): "
                                    "sized as h100-nvl")


def test_a_cell_naming_no_device_is_read_by_the_inference_it_states():
    # vllm-020: "1x 80GB-class GPU (total_gpu_memory 79.22GiB; H100/A100 inferred)": the
    # four 80 GB H100 / A100 parts hold the same memory, so the row is compared
    m = _read(PUBLISHED)["vllm-020"]
    assert m.gpus == () and m.gpu_candidates == (
        "h100-pcie-80gb", "h100-sxm5-80gb", "a100-80gb-pcie", "a100-80gb-sxm4")
    assert m.gpu_memory_said == ("H100/A100 as the gpu cell infers, 79.22GiB from the "
                                 "vram_total cell")
    rows, _ = memory_rows(m)
    by = {r["metric"]: r for r in rows}
    assert set(by) == {"kv_bytes", "weights_bytes", "compute_bytes"}
    assert by["weights_bytes"]["rel_err"] == pytest.approx(0.0, abs=1e-3)
    assert gpu_candidates("1x NVIDIA GPU (model not stated)", "") == ((), "")


def test_engine_name_from_the_start_of_the_cell_else_a_word_in_it():
    from kvsim.validate.memlogs import engine_name

    assert engine_name("sglang-omni (SGLang-based)") == "sglang"          # starts with it
    assert engine_name("custom streaming loadgen vs vllm serve") == "vllm"  # a word in it
    assert engine_name("vllm-project fork") == "vllm"
    assert engine_name("TensorRT-LLM") == "" and engine_name("myvllm") == ""


def test_a_row_whose_context_was_not_seen_is_not_compared_on_what_the_context_sets():
    # llamacpp-004 ("fit on (target free 1024 MiB); context not seen"): the KV cache and the
    # compute buffers depend on the context, so they are skipped with the reason; the
    # weights and the device's total are compared
    m = _read(PUBLISHED)["llamacpp-004"]
    assert m.context_unshown
    rows, skipped = memory_rows(m)
    assert {r["metric"] for r in rows} == {"weights_bytes", "device_bytes"}
    device = next(r for r in rows if r["metric"] == "device_bytes")
    assert device["rel_err"] == 0.0  # 24,080 MiB, as CUDA reports a 4090 and kvsim takes it
    assert sorted(s.id for s in skipped) == ["llamacpp-004:compute_bytes@CUDA1",
                                             "llamacpp-004:kv_bytes@CUDA1"]
    assert all(s.reason.endswith("the row does not show its context, which sets the KV "
                                 "cache and compute buffers") for s in skipped)
