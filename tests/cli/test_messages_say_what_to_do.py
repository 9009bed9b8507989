"""Errors that name what was wrong and what is allowed (one line, exit 2): an unknown
``--set`` key lists the keys at that place, a model given as a file kvsim cannot use says
what to give instead, and a GGUF header with values of the wrong shape names the key."""

from pathlib import Path

import gguf
import pytest

from kvsim.cli import main

SCENARIO_KEYS = ("name, description, seed, gpu, more_gpus, gpu_link, model, weights, engine, "
                 "link, host, host_default, driver_reserve_bytes, display_reserve_bytes, "
                 "workload, latency, policies, accuracy, sim, slo")


def _error(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("key,line", [
    ("nonexistent.key=1", "error: nonexistent: 'a mapping with keys key' — not a key here; "
                          f"allowed: {SCENARIO_KEYS}"),
    ("nonexistent=1", f"error: nonexistent: 1 — not a key here; allowed: {SCENARIO_KEYS}"),
    ("sim.tick=1", "error: sim.tick: 1 — not a key here; allowed: fidelity, "
                   "sample_interval_s, max_sim_time_s, max_rss_bytes"),
])
def test_an_unknown_set_key_lists_the_keys_there(capsys, tmp_path, key, line):
    assert _error(capsys, ["simulate", "quickstart", "--set", key, "-o",
                           str(tmp_path / "o")]) == line


def test_a_config_json_for_model_says_to_import_it(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama"}', encoding="utf-8")
    assert _error(capsys, ["fit", "--gpu", "rtx-4090", "--model", str(cfg)]) == (
        f"error: model: '{cfg}' — a model profile slug (kvsim profiles list models) or a "
        "profile .yaml file; a Hugging Face config.json is made into one first: kvsim "
        f"profiles import {cfg} -o config.yaml")


@pytest.mark.parametrize("name,tail", [
    ("x.gguf", "a GGUF file is made into one first: kvsim profiles import x.gguf -o x.yaml "
               "(and this file does not exist)"),
    ("./nope", "a profile .yaml file (file not found)"),
])
def test_a_model_path_that_is_no_profile_says_what_to_give(capsys, name, tail):
    err = _error(capsys, ["fit", "--gpu", "rtx-4090", "--model", name])
    assert err.startswith(f"error: model: '{name}' — a model profile slug") and err.endswith(tail)


def test_a_slug_with_dots_still_gets_the_closest_names(capsys):
    assert _error(capsys, ["fit", "--gpu", "rtx-4090", "--model", "llama-3.1-9b"]) == (
        "error: model: 'llama-3.1-9b' — unknown; closest: llama-3.1-8b, llama-3.1-70b, "
        "llama-3.2-3b")


def _gguf(path: Path, **kv) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_context_length(128)
    w.add_vocab_size(100)
    for key, value in kv.items():
        w.add_array(key, value) if isinstance(value, list) else w.add_string(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("kv,line", [
    ({"llama.attention.head_count_kv": [2]},
     "llama.attention.head_count_kv: [2] — one non-negative integer per layer (2 layers)"),
    ({"llama.attention.sliding_window_pattern": [1, 2]},
     "llama.attention.sliding_window_pattern: [1, 2] — one boolean per layer (2 layers)"),
    ({"llama.rope.dimension_count": "sixty-four"},
     "llama.rope.dimension_count: 'sixty-four' — a positive integer"),
])
def test_a_gguf_header_of_the_wrong_shape_names_the_key(capsys, tmp_path, kv, line):
    path = _gguf(tmp_path / "m.gguf", **kv)
    assert _error(capsys, ["profiles", "import", str(path)]) == f"error: gguf 'm.gguf'.{line}"


def test_a_well_formed_small_gguf_imports(capsys, tmp_path):
    path = _gguf(tmp_path / "m.gguf", **{"llama.attention.sliding_window_pattern": [True, False]})
    with pytest.raises(SystemExit) as exc:
        main(["profiles", "import", str(path), "-o", str(tmp_path / "m.yaml")])
    assert exc.value.code in (0, None) and (tmp_path / "m.yaml").is_file()


def test_running_out_of_memory_is_one_line_not_a_traceback(capsys, monkeypatch):
    import kvsim.engines.budget as budget

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(budget, "memory_budget", exhausted)
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 1 and len(err.splitlines()) == 1
    assert err.startswith("error: out of memory: ") and "sim.max_rss_bytes" in err


@pytest.mark.parametrize("args,what", [
    (["trace", "inspect", "{d}"], "trace: '{d}' — a folder, not a file: give a trace file "
                                  "(.jsonl or .parquet)"),
    (["sweep", "{d}", "-o", "{d}/out"], "sweep: '{d}' — a folder, not a file: give a sweep "
                                         ".yaml file"),
    (["trace", "import", "azure", "{d}", "-o", "{d}/t.jsonl"],
     "file: '{d}' — a folder, not a file: give the trace file to import"),
])
def test_a_folder_where_a_file_belongs_is_named_as_one(capsys, tmp_path, args, what):
    d = str(tmp_path)
    err = _error(capsys, [a.format(d=d) for a in args])
    assert err.startswith("error: " + what.format(d=d)), err
