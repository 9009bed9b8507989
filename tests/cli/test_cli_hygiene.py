"""CLI hygiene: output locations, engine-only fit flags, bare groups, help texts and
the profile listings tell the truth, and bad input is one line with exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import pytest
import yaml

from kvsim.cli import cli, main
from kvsim.cli._output import check_output, output_errors
from kvsim.errors import InputError
from kvsim.model.weights import weight_format_names

ROOT = Path(__file__).resolve().parents[2]
FAKE = ["--runner", "plan_fake_runners:plan_run", "-j", "1", "-n", "2", "--no-progress",
        "--no-report"]
QWEN = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "max_position_embeddings": 131072, "intermediate_size": 18944}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def one_line(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A regular file, a small trace, a sweep and a config.json; fake plan runners."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "plan"))
    (tmp_path / "FILE").write_text("not a folder")
    (tmp_path / "config.json").write_text(json.dumps(QWEN))
    base = {"name": "b", "gpu": "rtx-4090", "model": "llama-3.1-8b",
            "engine": {"preset": "llama.cpp", "allocator": "slots", "context_tokens": 8192},
            "workload": {"preset": "family-2", "days": 0.25}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(
        {"name": "t", "base": "base.yaml", "factors": {"engine.parallel": [1, 2]}}))
    with pytest.raises(SystemExit):
        main(["trace", "generate", "family-2", "--days", "0.25", "-o",
              str(tmp_path / "t.jsonl")])
    return tmp_path


# ----------------------------------------------------------------- 1. output locations

UNDER_FILE = "FILE is a file, not a folder"
OUTPUT_CASES = [
    (["plan", "quickstart", "--contexts", "8192", "--parallel", "1", *FAKE, "-o", "FILE"],
     "--out", "FILE", "it is a file, not a folder"),
    (["compare", "--gpus", "rtx-4090,rtx-5090", "quickstart", "--contexts", "8192",
      "--parallel", "1", *FAKE, "-o", "FILE"], "--out", "FILE", "it is a file, not a folder"),
    (["compare", "M", "P", "-o", "FILE/out"], "--out", "FILE/out", UNDER_FILE),
    (["sweep", "sweep.yaml", "--jobs", "1", "--runner", "plan_fake_runners:fake_run",
      "--no-progress", "-o", "FILE/out"], "--out", "FILE/out", UNDER_FILE),
    (["trace", "generate", "family-2", "-o", "FILE/x.jsonl"], "--output", "FILE/x.jsonl",
     UNDER_FILE),
    (["trace", "sample", "t.jsonl", "--sessions", "1", "-o", "FILE/x.jsonl"], "--output",
     "FILE/x.jsonl", UNDER_FILE),
    (["trace", "import", "mooncake", "t.jsonl", "-o", "FILE/x.jsonl"], "--output",
     "FILE/x.jsonl", UNDER_FILE),
    (["profiles", "import", "config.json", "-o", "FILE/m.yaml"], "--output", "FILE/m.yaml",
     UNDER_FILE),
    (["calibrate", "engine", "--url", "http://127.0.0.1:9", "-o", "FILE/a.json"], "--output",
     "FILE/a.json", UNDER_FILE),
    (["replay", "t.jsonl", "--url", "http://127.0.0.1:9", "-o", "FILE/out"], "--output",
     "FILE/out", UNDER_FILE),
    (["simulate", "quickstart", "-o", "FILE/out"], "--output", "FILE/out", UNDER_FILE),
    (["report", "results", "-o", "FILE/r.html"], "--output", "FILE/r.html", UNDER_FILE),
]


@pytest.mark.parametrize("argv,flag,path,reason", OUTPUT_CASES,
                         ids=[" ".join(c[0][:2]) for c in OUTPUT_CASES])
def test_unwritable_output_is_refused_before_the_work(files, capsys, argv, flag, path,
                                                      reason):
    absolute = [str(files / a) if a.startswith(("FILE", "t.jsonl", "sweep.yaml",
                                                "config.json")) else a for a in argv]
    code, out, err = run(capsys, *absolute)
    line = one_line(code, err)
    assert line == f"error: {flag}: '{files / path}' — cannot write: " + (
        reason.replace("FILE", str(files / "FILE")) if reason == UNDER_FILE else reason)
    assert out == ""  # nothing ran: no table, no results
    assert not (files / "FILE").is_dir()


def test_calibrate_kernels_output_is_checked_before_timing(files, capsys):
    pytest.importorskip("torch")
    target = files / "FILE" / "a.json"
    code, out, err = run(capsys, "calibrate", "kernels", "--model", "llama-3.2-1b",
                         "-o", str(target))
    assert one_line(code, err) == (f"error: --output: '{target}' — cannot write: "
                                   f"{files / 'FILE'} is a file, not a folder")
    assert out == ""


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_a_folder_that_cannot_be_created_is_refused(tmp_path, capsys):
    code, _, err = run(capsys, "trace", "generate", "family-2", "-o", "/proc/kvsim-no/x.jsonl")
    assert one_line(code, err) == ("error: --output: '/proc/kvsim-no/x.jsonl' — cannot write: "
                                   "cannot create folder /proc/kvsim-no (No such file or "
                                   "directory)")


def test_the_probe_leaves_nothing_behind(tmp_path):
    deep = tmp_path / "a" / "b" / "out.jsonl"
    assert check_output("--output", deep, folder=False) == deep
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="it is a folder, not a file"):
        check_output("--output", tmp_path, folder=False)


def test_a_write_that_fails_later_is_one_line_and_keeps_what_was_computed(files, capsys):
    out_dir = files / "out"
    (out_dir / "plan.csv").mkdir(parents=True)  # passes the probe, fails at the write
    code, out, err = run(capsys, "plan", "quickstart", "--contexts", "8192", "--parallel",
                         "1,2", *FAKE, "-o", str(out_dir))
    line = one_line(code, err)
    assert line.startswith(f"error: --out: '{out_dir}' — cannot write: ")
    assert str(out_dir / "plan.csv") in line
    assert "recommended: context 8192" in out  # the search's result was still printed


def test_output_errors_names_flag_path_and_reason():
    with pytest.raises(InputError) as exc, output_errors("-o", "x/y"):
        raise PermissionError(13, "Permission denied", "x/y/z.tmp")
    assert exc.value.one_line() == "-o: 'x/y' — cannot write: Permission denied (x/y/z.tmp)"


# ----------------------------------------------------------------- 2. engine-only fit flags

LAYERS = "llama.cpp and ollama have a GPU layer count (-ngl / num_gpu)"
FLASH = "llama.cpp and ollama have a flash-attention switch"
UNIFIED = "llama.cpp has a unified KV pool switch (-kvu)"
FRACTION = "vllm and sglang have a memory fraction (gpu_memory_utilization / mem_fraction_static)"


@pytest.mark.parametrize("engine,args,have", [
    ("vllm", ["--gpu-layers", "10"], LAYERS), ("sglang", ["--gpu-layers", "10"], LAYERS),
    ("vllm", ["--flash-attn"], FLASH), ("sglang", ["--no-flash-attn"], FLASH),
    ("ollama", ["--no-kv-unified"], UNIFIED), ("vllm", ["--kv-unified"], UNIFIED),
    ("llama.cpp", ["--gpu-util", "0.5"], FRACTION),
    ("sglang", ["--hybrid-kv"], "vllm has a hybrid KV cache manager"),
    ("llama.cpp", ["--language-model-only"],
     "vllm has a text-only switch that drops a checkpoint's image encoder"),
])
def test_fit_refuses_flags_the_engine_has_no_setting_for(capsys, engine, args, have):
    code, out, err = run(capsys, "fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                         "--engine", engine, *args)
    assert one_line(code, err) == (f"error: {args[0]}: '{engine}' — {engine} has no such "
                                   f"setting; only {have}")
    assert out == ""


@pytest.mark.parametrize("engine,flag", [("llama.cpp", "--no-kv-unified"),
                                         ("ollama", "--flash-attn"), ("ollama", "--gpu-layers"),
                                         ("vllm", "--gpu-util"), ("vllm", "--no-hybrid-kv"),
                                         ("vllm", "--language-model-only")])
def test_fit_still_takes_flags_the_engine_has(capsys, engine, flag):
    value = {"--gpu-layers": ["20"], "--gpu-util": ["0.8"]}.get(flag, [])
    code, _, err = run(capsys, "fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                       "--engine", engine, flag, *value, "--json")
    assert code == 0, err


# ----------------------------------------------------------------- 3. a bare group

@pytest.mark.parametrize("argv", [[], ["trace"], ["calibrate"], ["profiles"]])
def test_a_bare_group_prints_its_help_on_stdout_and_exits_0(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 0 and err == ""
    assert out.startswith("Usage: kvsim") and "Commands:" in out


# ----------------------------------------------------------------- 4. sweep --jobs with --dask

def test_sweep_refuses_jobs_with_dask(files, capsys):
    out_dir = files / "out"
    code, _, err = run(capsys, "sweep", str(files / "sweep.yaml"), "-o", str(out_dir),
                       "--jobs", "2", "--dask", "tcp://127.0.0.1:9", "--dask-timeout", "1")
    assert one_line(code, err) == ("error: --jobs: 2 — not with --dask tcp://127.0.0.1:9: give "
                                   "--jobs N for local workers or --dask ADDRESS for a "
                                   "cluster, not both")
    assert not out_dir.exists()


# ----------------------------------------------------------------- 5-8. help texts

def _help(*path: str) -> str:
    ctx = click.Context(cli, info_name="kvsim", terminal_width=400, max_content_width=400)
    cmd: click.Command = cli
    for name in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.get_command(ctx, name)  # type: ignore[assignment]
        ctx = click.Context(cmd, info_name=name, parent=ctx, terminal_width=400,
                            max_content_width=400)
    return cmd.get_help(ctx)


def _option(path: tuple[str, ...], flag: str) -> click.Option:
    ctx = click.Context(cli)
    cmd: click.Command = cli
    for name in path:
        cmd = cmd.get_command(ctx, name)  # type: ignore[attr-defined]
    return next(p for p in cmd.params if isinstance(p, click.Option) and flag in p.opts)


def test_fit_weights_help_lists_every_format_the_code_accepts():
    line = next(ln for ln in _help("fit").splitlines() if "--weights" in ln)
    listed = line.split("weight format:")[1].split("[default")[0]
    assert sorted(w.strip() for w in listed.split(",")) == weight_format_names()
    assert "f16" in weight_format_names() and "mxfp4" in weight_format_names()


def test_plan_empty_contexts_hint_uses_binary_suffixes(capsys):
    code, _, err = run(capsys, "plan", "quickstart", "--contexts", ",")
    assert one_line(code, err) == ("error: --contexts: ',' — a comma-separated list, e.g. "
                                   "8Ki,16Ki,32Ki (empty grid)")


@pytest.mark.parametrize("path,flag", [
    (("calibrate", "kernels"), "--batches"), (("calibrate", "kernels"), "--contexts"),
    (("calibrate", "kernels"), "--cache-types"), (("calibrate", "kernels"), "--repeats"),
    (("calibrate", "engine"), "-o"), (("replay",), "-o"),
    (("trace", "generate"), "--seed"), (("trace", "sample"), "--seed"),
])
def test_options_have_help(path, flag):
    assert _option(path, flag).help


def test_kernel_contexts_help_says_cached_tokens():
    assert "cached tokens" in (_option(("calibrate", "kernels"), "--contexts").help or "")


def test_calibrate_help_does_not_promise_to_pin_capacity():
    text = _help("calibrate")
    assert "pin capacity" not in text and "read KV capacity facts from a" in text
    readme = (ROOT / "calibration" / "README.md").read_text(encoding="utf-8")
    assert "Pin KV capacity" not in readme and "Read KV capacity facts" in readme


# ----------------------------------------------------------------- 9-11. profiles

def test_profiles_list_gpus_is_readable_at_100_columns(capsys):
    from kvsim.config.catalog import list_names, load_raw
    from kvsim.config.units import format_bytes

    code, out, _ = run(capsys, "profiles", "list", "gpus")
    assert code == 0 and "…" not in out
    assert max(len(ln) for ln in out.splitlines()) <= 100
    for name in list_names("gpus"):
        d = load_raw("gpus", name)
        row = next(ln for ln in out.splitlines() if f"│ {name} " in ln)
        assert format_bytes(d["memory_bytes"]) in row
        assert f"{d['memory_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s" in row
        assert (d.get("default_link") or "unified") in row


def test_profiles_show_prints_every_kind_of_that_name(capsys):
    code, out, _ = run(capsys, "profiles", "show", "jetson-agx-orin-64gb")
    assert code == 0
    assert "# gpu profile 'jetson-agx-orin-64gb' (also a host profile of this name)" in out
    assert "# host profile 'jetson-agx-orin-64gb' (also a gpu profile of this name)" in out
    docs = list(yaml.safe_load_all(out))
    assert len(docs) == 2 and "fp16_tensor_flops" in docs[0] and "unified_with_gpu" in docs[1]


def test_profiles_engines_show_what_an_unset_context_means(capsys):
    code, out, _ = run(capsys, "profiles", "list", "engines")
    assert code == 0
    rows = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.startswith("│ ")}
    assert "model max" in rows["vllm"] and "32768" not in rows["vllm"]
    assert "model max" in rows["sglang"]
    assert "model max, --fit shrinks" in rows["llama.cpp"] and "4096" not in rows["llama.cpp"]
    assert "4096" in rows["ollama"]
    code, out, _ = run(capsys, "profiles", "show", "vllm")
    assert code == 0 and "# context_tokens unset (a scenario, kvsim fit): model max;" in out


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
