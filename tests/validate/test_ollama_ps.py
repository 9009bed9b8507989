"""``ollama ps`` as users print it: kvsim's own ``ollama ps`` row (kvsim.engines._ollama_ps),
the table and ``/api/ps`` JSON read as measurements (kvsim.validate.ollama_ps), and
``kvsim validate`` on the published pastes of docs/reference/measurements-ollama-ps."""
import json
from pathlib import Path

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines._ollama_ps import human_bytes, processor
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu
from kvsim.errors import InputError
from kvsim.model.names import resolve_model
from kvsim.validate.ollama_ps import read_ollama_ps

PS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "measurements-ollama-ps"
MIB = 2**20

# attogram/ollama-bash-lib demos/ps.md (v0.40.5 demo): the table beside its JSON
HERMES_TABLE = """\
NAME          ID              SIZE      PROCESSOR    CONTEXT    UNTIL              
hermes3:8b    4f6b83f30b62    8.4 GB    100% GPU     16384      4 minutes from now    
"""
# ollama/ollama issue #5756 (v0.2.7, OLLAMA_NUM_PARALLEL=64, a 20 GB MIG slice): no CONTEXT
SPILLED_TABLE = """\
ollama ps
NAME            ID              SIZE    PROCESSOR       UNTIL   
llama3:latest   365c0bd3c000    32 GB   36%/64% CPU/GPU Forever
"""


@pytest.mark.parametrize("size, shown", [
    (8_372_905_984, "8.4 GB"), (5_618_579_456, "5.6 GB"),   # the JSON sizes beside their table
    (47_900_000_000, "47 GB"),        # from 10 up Ollama truncates (a 70B's "47 GB")
    (5_000_000_000, "5 GB"), (999, "999 B"), (1_500_000, "1.5 MB")])
def test_sizes_print_as_ollamas_humanbytes(size, shown):
    assert human_bytes(size) == shown


@pytest.mark.parametrize("size, vram, shown", [
    (100, 100, "100% GPU"), (100, 0, "100% CPU"), (100, 64, "36%/64% CPU/GPU"),
    (200, 101, "50%/50% CPU/GPU"),    # 49.5 % rounds half away from zero, as Go's math.Round
    (100, 120, "Unknown")])
def test_processor_column(size, vram, shown):
    assert processor(size, vram) == shown


def _fit(gpu: str, model: str, weights: str, ctx: int, version: str, parallel: int = 1):
    g, m = load_gpu(gpu), load_model(model)
    cfg = engine_for_gpu({"preset": "ollama", "context_tokens": ctx, "parallel": parallel,
                          "ollama_version": version}, g, m, weights=weights)
    return memory_budget(g, m, weights, cfg)


def test_era_a_ps_is_the_estimates_full_and_partial_figures():
    b = _fit("rtx-4000-ada", "llama-3-8b", "q4_0", 2048, "0.2.7", parallel=64)
    assert b.extra["ollama_ps_size_bytes"] == b.estimate.full_bytes
    assert b.extra["ollama_ps_vram_bytes"] == b.estimate.total_bytes
    # issue #5756 printed "32 GB  36%/64% CPU/GPU" (15/33 layers) on a 20 GB MIG slice;
    # a 20 GB card in kvsim (19.6 GiB as CUDA reports it): the same row, 15 layers
    assert b.estimate.layers_offload == 15
    assert any(line.endswith("SIZE 32 GB  PROCESSOR 36%/64% CPU/GPU  CONTEXT 2048")
               for line in b.log_lines)


def test_measured_era_ps_adds_the_host_embedding_only_when_every_layer_is_on_the_gpu():
    b = _fit("rtx-4090", "llama-3.1-8b", "q4_k_m", 8192, "0.12.11")
    gpu = b.weights_gpu_bytes + b.kv_reserved_bytes + b.activation_bytes
    assert b.extra["ollama_ps_size_bytes"] == gpu + b.weights_cpu_bytes
    assert b.extra["ollama_ps_vram_bytes"] == b.extra["ollama_ps_size_bytes"]  # 100% GPU
    spilled = _fit("rtx-3060-8gb", "qwen2.5-14b", "q4_k_m", 8192, "0.12.11")
    assert spilled.gpu_layers < spilled.num_layers
    assert spilled.extra["ollama_ps_vram_bytes"] == (
        spilled.weights_gpu_bytes + spilled.kv_reserved_bytes + spilled.activation_bytes)
    assert spilled.extra["ollama_ps_gpu_percent"] < 100


def test_llama_server_era_has_no_ps_figures():
    b = _fit("rtx-4090", "llama-3.1-8b", "q4_k_m", 8192, "0.30.0")
    assert "ollama_ps_size_bytes" not in b.extra
    assert not any(line.startswith("ollama ps:") for line in b.log_lines)


def test_metal_keeps_512_mib_free_where_cuda_keeps_457():
    mac = _fit("apple-m4-max", "llama-3.1-8b", "q4_0", 16384, "0.10.1")
    cuda = _fit("rtx-6000-ada", "llama-3.1-8b", "q4_0", 16384, "0.10.1")
    assert mac.estimate.full_bytes - cuda.estimate.full_bytes == 55 * MIB
    assert mac.log_lines[0].startswith("offload to metal ")


def test_the_table_is_read_by_its_columns():
    (hermes,) = read_ollama_ps(HERMES_TABLE, "ps.txt")
    assert (hermes.id, hermes.model_as_printed, hermes.settings) == \
        ("ps.txt:hermes3:8b", "hermes3:8b", {"num_ctx": 16384})
    size, share = hermes.figures
    assert (size.metric, size.value, size.half_unit) == ("ollama_ps_size_bytes", 8.4e9, 0.05e9)
    assert (share.metric, share.value) == ("ollama_ps_gpu_percent", 100.0)
    assert hermes.weights == "q4_k_m" and "default tag" in hermes.stated[0]
    (llama3,) = read_ollama_ps(SPILLED_TABLE, "ps.txt")
    size, share = llama3.figures
    assert (size.value, size.half_unit, share.value) == (32.5e9, 0.5e9, 64.0)  # 32-33 GB
    assert llama3.settings == {} and llama3.model_as_printed == "llama3:latest"


def test_a_version_line_names_the_release():
    (row,) = read_ollama_ps("ollama version is 0.10.1\n" + HERMES_TABLE, "ps.txt")
    assert row.engine_version == "0.10.1"


def test_the_json_gives_exact_bytes_the_format_and_the_date():
    rows = read_ollama_ps((PS / "attogram-2025-07-30.json").read_text(), "a.json")
    qwen, mistral = rows
    assert [(f.metric, f.value, f.half_unit) for f in qwen.figures] == [
        ("ollama_ps_size_bytes", 5_618_579_456.0, 0.0),
        ("ollama_ps_vram_bytes", 5_618_579_456.0, 0.0)]
    assert (qwen.model, qwen.weights, qwen.date, qwen.settings) == \
        ("qwen2.5-coder-7b", "q4_k_m", "2025-07-30", {"num_ctx": 4096})
    assert (mistral.model, mistral.weights) == ("mistral-7b-v0.3", "q4_0")  # the library tag


@pytest.mark.parametrize("text, field", [
    (HERMES_TABLE.replace("8.4 GB", "8.4 GiB"), "ps.txt.hermes3:8b.SIZE"),
    (HERMES_TABLE.replace("100% GPU", "most GPU"), "ps.txt.hermes3:8b.PROCESSOR"),
    ('{"models": [{"model": "x:1b", "size": -5}]}', "ps.txt.x:1b.size")])
def test_a_cell_that_does_not_read_names_itself(text, field):
    with pytest.raises(InputError) as exc:
        read_ollama_ps(text, "ps.txt")
    assert exc.value.one_line().startswith(field)


def test_other_text_is_not_taken_for_ollama_ps():
    assert read_ollama_ps("| model | size |\n", "x") is None
    assert read_ollama_ps('{"models": "none"}', "x") is None


def test_mistral_tags_name_the_version_ollamas_library_serves():
    assert resolve_model("mistral:7b-instruct").slug == "mistral-7b-v0.3"
    assert resolve_model("mistral:7b-instruct-q8_0").weight_format == "q8_0"
    assert resolve_model("mistral:7b-instruct-v0.2-q4_0").slug is None   # its own version


def _validate(kvsim_cli, *args):
    code, err, out = kvsim_cli("validate", *args, "--json")
    assert (code, err) == (0, "")
    return json.loads(out)


def test_published_pastes_within_a_quarter_percent_on_a_mac(kvsim_cli):
    doc = _validate(kvsim_cli, PS / "attogram-2025-07-30.json", "--gpu", "apple-m4-max",
                    "--engine-version", "0.10.1")
    errs = {(r["id"].split(":", 1)[1], r["metric"]): r["rel_err"] for r in doc["rows"]}
    assert len(errs) == 4 and all(abs(e) < 0.0025 for e in errs.values())
    doc = _validate(kvsim_cli, PS / "attogram-2025-07-31.json", "--gpu", "apple-m4-max",
                    "--engine-version", "0.10.1", "--model", "llama-3.1-8b")
    assert [round(r["rel_err"], 4) for r in doc["rows"]] == [-0.0001, -0.0001]
    cuda = _validate(kvsim_cli, PS / "attogram-2025-07-30.json", "--gpu", "rtx-4090",
                     "--engine-version", "0.10.1")   # CUDA's smaller minimum: ~1 % under
    assert all(-0.015 < r["rel_err"] < -0.009 for r in cuda["rows"])


def test_an_undated_release_follows_the_pastes_month_and_says_so(kvsim_cli):
    doc = _validate(kvsim_cli, PS / "attogram-2025-07-30.json", "--gpu", "apple-m4-max")
    assert all("laid out as v0.6.7" in " ".join(r["notes"]) for r in doc["rows"])
    assert all(r["rel_err"] > 0.05 for r in doc["rows"])  # its automatic 2 slots


def test_a_gpu_is_needed_and_a_bad_release_is_refused(kvsim_cli):
    doc = _validate(kvsim_cli, PS / "attogram-2025-07-30.json")
    assert not doc["rows"] and all("--gpu" in s["reason"] for s in doc["skipped"])
    code, err, _ = kvsim_cli("validate", PS / "attogram-2025-07-30.json", "--gpu", "rtx-4090",
                             "--engine-version", "latest")
    assert code == 2 and "--engine-version" in err and "0.10.1" in err
    assert len(err.strip().splitlines()) == 1


def test_fit_prints_the_ps_row_and_gives_it_in_json(kvsim_cli):
    args = ("fit", "--gpu", "apple-m4-max", "--model", "llama-3.1-8b", "--weights", "q4_0",
            "--engine", "ollama", "--context", "16384", "--parallel", "1",
            "--ollama-version", "0.10.1")
    code, err, out = kvsim_cli(*args)
    assert (code, err) == (0, "")
    assert "ollama ps: SIZE 8.4 GB  PROCESSOR 100% GPU  CONTEXT 16384" in out  # as printed
    code, err, out = kvsim_cli(*args, "--json")
    assert json.loads(out)["ollama_ps"] == {"size_bytes": 8_371_811_127,
                                            "vram_bytes": 8_371_811_127, "gpu_percent": 100}
