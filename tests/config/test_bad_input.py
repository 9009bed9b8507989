"""Bad scenario / profile input: one line naming the full field, its value and what is
allowed, exit code 2, no traceback (audit items B11-B16, C19-C30, C34, D36-D39)."""

from pathlib import Path

import pytest
import yaml

from kvsim.cli import main
from kvsim.config.catalog import load_raw
from kvsim.errors import InputError
from kvsim.scenario import load_scenario


def _cli_error(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _load_error(sets: list[str]) -> str:
    with pytest.raises(InputError) as exc:
        load_scenario("quickstart", sets)
    return exc.value.one_line()


@pytest.mark.parametrize("value", ["5", "null", "true", "[1]"])
def test_engine_that_is_not_a_name_or_mapping(value):  # B11
    line = _load_error([f"engine={value}"])
    assert line.startswith("engine: ")
    assert "a preset name (one of llama.cpp, ollama, sglang, vllm) or a mapping" in line


def test_engine_written_as_a_number_in_yaml(tmp_path, capsys):  # B11
    p = tmp_path / "s.yaml"
    p.write_text("gpu: rtx-4090\nmodel: llama-3.1-8b\nengine: 5\nworkload: family-4\n")
    err = _cli_error(capsys, ["simulate", str(p), "-o", str(tmp_path / "o")])
    assert err.startswith("error: engine: 5 — a preset name")


def test_trace_that_is_not_a_path():  # B12
    assert _load_error(["workload.trace=5"]) == \
        "workload.trace: 5 — Input should be a valid string"


def test_non_utf8_scenario_and_model(tmp_path, capsys):  # B13
    p = tmp_path / "binary.yaml"
    p.write_bytes(b"gpu: \xff\xfe\x00\x81 rtx\n")
    err = _cli_error(capsys, ["simulate", str(p), "-o", str(tmp_path / "o")])
    assert err == f"error: scenario: '{p}' — not UTF-8 text; kvsim reads UTF-8 files " \
                  "(save or convert it as UTF-8)"
    err = _cli_error(capsys, ["fit", "--gpu", "rtx-4090", "--model", str(p)])
    assert err.startswith(f"error: model: '{p}' — not UTF-8 text")


def test_non_utf8_policy_file(tmp_path, capsys):  # B13 (parse_policy)
    from kvsim.cli.plan import parse_policy
    p = tmp_path / "pbin.yaml"
    p.write_bytes(b"kind: \xff\xfe\n")
    with pytest.raises(InputError) as exc:
        parse_policy(str(p))
    assert exc.value.one_line().startswith(f"--policy: '{p}' — not UTF-8 text")


def test_duplicate_yaml_key_is_refused(tmp_path):  # C30
    p = tmp_path / "dup.yaml"
    p.write_text("gpu: rtx-4090\nmodel: llama-3.1-8b\nworkload: family-4\ngpu: rtx-3090\n")
    with pytest.raises(InputError) as exc:
        load_scenario(p)
    assert exc.value.one_line() == \
        f"scenario: '{p}' — key 'gpu' written twice (lines 1 and 4)"
    p.write_text("gpu: rtx-4090\nmodel: llama-3.1-8b\nworkload: {preset: family-4}\n"
                 "engine: {preset: llama.cpp, parallel: 2, parallel: 4}\n")  # one line
    with pytest.raises(InputError) as exc:
        load_scenario(p)
    assert exc.value.one_line() == \
        f"scenario: '{p}' — key 'parallel' written twice (lines 4 and 4)"


def _profile(tmp_path: Path, kind: str, name: str, **changes) -> str:
    raw = {**load_raw(kind, name), **changes}
    p = tmp_path / f"{name}-bad.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


@pytest.mark.parametrize("changes,field,allowed", [
    ({"params_total": float("inf")}, "params_total", "Input should be a finite number"),
    ({"head_dim": 0}, "head_dim", "> 0: a model with attention layers"),
    ({"num_kv_heads": 0}, "num_kv_heads", "> 0: a model with attention layers"),
    ({"params_active": 1e20}, "params_active", "at most params_total"),
])
def test_bad_model_profile(tmp_path, capsys, changes, field, allowed):  # B16 / C27
    path = _profile(tmp_path, "models", "llama-3.1-8b", **changes)
    err = _cli_error(capsys, ["fit", "--gpu", "rtx-4090", "--model", path])
    assert err.startswith(f"error: model '{path}'.{field}: ")
    assert allowed in err


@pytest.mark.parametrize("changes,field,allowed", [
    ({"gpu_memory_limit_bytes": 1e30}, "gpu_memory_limit_bytes", "at most memory_bytes"),
    ({"fp16_tensor_flops": float("inf")}, "fp16_tensor_flops", "a finite number"),
    ({"pcie_lanes": 0}, "pcie_lanes", "greater than 0"),
])
def test_bad_gpu_profile(tmp_path, capsys, changes, field, allowed):  # C20
    path = _profile(tmp_path, "gpus", "rtx-4090", **changes)
    err = _cli_error(capsys, ["fit", "--gpu", path, "--model", "llama-3.1-8b"])
    assert err.startswith(f"error: gpu '{path}'.{field}: ")
    assert allowed in err


def test_llama_cpp_context_past_host_ram(capsys):  # C19
    # 32 slots of the model's whole 131,072-token context: 4,194,304 cells x 131,072 B
    # (Llama-3.1-8B f16 KV per token) = 512 GiB, all of it past the GPU
    err = _cli_error(capsys, ["fit", "--gpu", "rtx-4060-ti-16gb", "--model", "llama-3.1-8b",
                              "--context", "131072", "--parallel", "32",
                              "--host", "desktop-64gb"])
    assert err.startswith("error: --context: 131072 — this layout puts 512.00 GiB of KV")
    assert "more than the host's 64.00 GiB (desktop-64gb)" in err


def test_llama_cpp_context_past_host_ram_in_a_run(tmp_path, capsys):  # C19
    err = _cli_error(capsys, ["simulate", "quickstart", "-o", str(tmp_path / "o"),
                              "--set", "engine.context_tokens=100000000"])
    assert err.startswith("error: engine.context_tokens: 100000000 — this layout puts")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_paged_engines_refuse_context_above_the_model(engine):  # C19
    line = _load_error([f"engine={engine}", "engine.context_tokens=200000"])
    assert line == (f"engine.context_tokens: 200000 — at most the model's maximum (131072): "
                    f"{engine} refuses a max_model_len above the model's derived maximum")


def test_ollama_clamps_context_to_the_model():  # C19, docs/reference/engines.md §4.1
    s = load_scenario("quickstart", ["engine=ollama", "engine.context_tokens=10000000"])
    assert s.engine.context_tokens == s.model.max_context_tokens


@pytest.mark.parametrize("sets,field", [
    (["engine.context_tokens=true"], "engine.context_tokens"),
    (["seed=true"], "seed"),
    (["workload.days=true"], "workload.days"),
    (["workload.start_weekday=true"], "workload.start_weekday"),
])
def test_booleans_are_not_numbers(sets, field):  # C29
    assert _load_error(sets) == f"{field}: True — a number, not true/false"


def test_vllm_swap_space_within_host_ram():  # C34
    # NOTE: any positive block_tokens stays allowed: docs/reference/engines.md §1.1 — some backends
    # and hybrid models force a runtime block size other than --block-size's choices
    line = _load_error(["engine=vllm", "engine.swap_space_bytes=1e15"])
    assert line.startswith("engine.swap_space_bytes: 1000000000000000 — at most the host's RAM")


def test_latency_without_kind(tmp_path):  # D36
    # a latency section written without a kind says which kinds there are
    p = tmp_path / "s.yaml"
    p.write_text("gpu: rtx-4090\nmodel: llama-3.1-8b\nworkload: family-4\n"
                 "latency: {step_overhead_s: 0.01}\n", encoding="utf-8")
    with pytest.raises(InputError) as exc:
        load_scenario(p)
    assert exc.value.one_line() == (
        "latency.kind: 'missing' — a latency section needs a kind: one of roofline, "
        "calibrated, constant")
    # --set latency.KEY on a scenario without one sets it in the default roofline section
    assert _load_error(["latency.step_overhead_s=-1"]) == \
        "latency.roofline.step_overhead_s: -1 — a duration must be a finite number >= 0"


def test_errors_name_the_full_path():  # D38
    assert _load_error(["workload.days=inf"]) == \
        "workload.days: 'inf' — Input should be a finite number"
    assert _load_error(["display_reserve_bytes=100GiB"]).startswith(
        "display_reserve_bytes: 107374182400 — plus driver_reserve_bytes")


def test_unknown_preset_names_the_full_path(tmp_path, capsys):  # D38
    err = _cli_error(capsys, ["simulate", "quickstart", "-o", str(tmp_path / "o"),
                              "--set", "workload.preset=nosuch"])
    assert err == "error: workload.preset: 'nosuch' — unknown; one of: family-2, family-4, " \
                  "family-6"


def test_missing_field_says_missing(tmp_path):  # D39
    line = _load_error(["gpu={name: x}"])
    assert line.startswith("gpu.display_name: 'missing' — required (given: name)")


def test_weights_past_host_ram_still_load(capsys):  # review: llama.cpp memory-maps weights
    from kvsim.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--gpu", "rtx-4090", "--model", "qwen2.5-72b", "--weights", "bf16",
              "--engine", "llama.cpp", "--host", "desktop-64gb"])
    assert exc.value.code == 0
    assert "RUNS WITH CPU OFFLOAD" in capsys.readouterr().out
