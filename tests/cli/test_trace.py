"""``kvsim trace`` end to end in-process: outputs, exit codes, one-line errors."""

import json
from pathlib import Path

import pytest

from kvsim.cli import main
from kvsim.workload.generator import generate
from kvsim.workload.io import read_trace
from kvsim.workload.preset import load_preset

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
MOONCAKE = (TRACES / "mooncake-fast25" / "synthetic_trace.jsonl").resolve()


def run(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_generate_then_inspect_json(tmp_path, capsys):
    out = tmp_path / "week.parquet"
    code, _, err = run(capsys, "trace", "generate", "family-4", "--days", "2", "--seed", "9",
                       "-o", str(out))
    assert code == 0 and "wrote" in err
    meta, sessions = read_trace(out)
    assert sessions == generate(load_preset("family-4"), 2, 9)
    assert meta.seed == 9 and meta.source == "preset:family-4"
    code, text, _ = run(capsys, "trace", "inspect", str(out), "--json")
    stats = json.loads(text)
    assert code == 0 and stats["sessions"] == len(sessions)
    assert stats["rows"] == sum(len(s.turns) for s in sessions)
    code, text, _ = run(capsys, "trace", "inspect", str(out))
    assert code == 0 and "prefix_reuse" in text


def test_import_sample_inspect_mooncake(tmp_path, capsys):
    assert MOONCAKE.is_file(), f"shared trace missing: {MOONCAKE}"
    full, small = tmp_path / "mc.jsonl", tmp_path / "mc50.parquet"
    assert run(capsys, "trace", "import", "mooncake", str(MOONCAKE), "-o", str(full))[0] == 0
    assert run(capsys, "trace", "sample", str(full), "--sessions", "50", "--seed", "1",
               "-o", str(small))[0] == 0
    _, kept = read_trace(small)
    _, every = read_trace(full)
    assert len(kept) == 50 and all(s in every for s in kept)
    code, text, _ = run(capsys, "trace", "inspect", str(MOONCAKE), "--format", "mooncake",
                        "--json")
    assert code == 0 and json.loads(text)["rows"] == 3993


def _assert_clean_failure(capsys, tmp_path, argv, message):
    out = tmp_path / "out.jsonl"
    code, _, err = run(capsys, *argv, "-o", str(out))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in err
    assert not out.exists()
    assert not any(p.name.startswith(".out.jsonl") for p in tmp_path.iterdir())  # no temp file


@pytest.mark.parametrize("content, message", [
    (('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
      '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1,\n'),
     "bad.jsonl line 2: '{\"timestamp\""),
    ('{"timestamp": 0, "input_length": -10, "output_length": 1, "hash_ids": []}\n',
     "bad.jsonl line 1: input_length: -10 — must be >= 1"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2.5, "hash_ids": [1]}\n',
     "bad.jsonl line 1: output_length: 2.5 — must be a whole number"),
    (('{"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
      '{"timestamp": 3, "input_length": 10, "output_length": 1, "hash_ids": [2]}\n'),
     "bad.jsonl line 2: timestamp: 0.003 — earlier than the previous row"),
    ("", "bad.jsonl: '' — empty file"),
    ('{"timestamp": 0, "input_length": 10, "hash_ids": [1]}\n',
     "bad.jsonl line 1: output_length: None — missing key"),
])
def test_bad_mooncake_input(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    _assert_clean_failure(capsys, tmp_path, ["trace", "import", "mooncake", str(bad)], message)
    bad.unlink()


def test_sort_flag_sorts_with_warning(tmp_path, capsys):
    bad = tmp_path / "late.jsonl"
    bad.write_text('{"timestamp": 9000, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 3000, "input_length": 10, "output_length": 1, "hash_ids": [2]}\n')
    out = tmp_path / "sorted.jsonl"
    code, _, err = run(capsys, "trace", "import", "mooncake", str(bad), "--sort", "-o", str(out))
    assert code == 0 and "warning: late.jsonl: 1 rows had earlier timestamps" in err
    assert [s.turns[0].start_s for s in read_trace(out)[1]] == [0.0, 6.0]


def test_unknown_format_missing_columns_bad_extension(tmp_path, capsys):
    csv = tmp_path / "a.csv"
    csv.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.5,3\n")
    _assert_clean_failure(capsys, tmp_path, ["trace", "import", "vllm", str(csv)],
                          "format: 'vllm' — one of mooncake, azure, burstgpt, sharegpt")
    _assert_clean_failure(capsys, tmp_path, ["trace", "import", "azure", str(csv)],
                          "a.csv: columns: 'TIMESTAMP,ContextTokens' — missing GeneratedTokens")
    code, _, err = run(capsys, "trace", "import", "azure", str(csv), "-o", str(tmp_path / "x.txt"))
    assert code == 2 and "must end in .jsonl or .parquet" in err
    _assert_clean_failure(capsys, tmp_path, ["trace", "generate", "family-9"],
                          "preset: 'family-9' — unknown")


def test_sample_rejects_bad_trace_and_options(tmp_path, capsys):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"trace_meta": {}}\n{"session_id": "s", "turns": [{"start_s": 0, '
                   '"input_tokens": 1, "output_tokens": -3}]}\n')
    _assert_clean_failure(capsys, tmp_path, ["trace", "sample", str(bad), "--sessions", "1"],
                          "t.jsonl line 2: turns.0.output_tokens: -3 — Input should be greater")
    good = tmp_path / "g.jsonl"
    good.write_text('{"trace_meta": {}}\n{"session_id": "s", "turns": [{"start_s": 0, '
                    '"input_tokens": 1, "output_tokens": 3}]}\n')
    _assert_clean_failure(capsys, tmp_path, ["trace", "sample", str(good)], "exactly one")


def test_negative_seed_and_infinite_days_are_one_line_errors(tmp_path, capsys):
    # numpy's SeedSequence rejects negative seeds with a traceback; kvsim says so first
    _assert_clean_failure(capsys, tmp_path, ["trace", "generate", "family-2", "--seed", "-3"],
                          "seed: -3 — a non-negative integer")
    _assert_clean_failure(capsys, tmp_path, ["trace", "generate", "family-2", "--days", "inf"],
                          "days: inf — must be a finite number > 0")
    good = tmp_path / "g.jsonl"
    good.write_text('{"trace_meta": {}}\n{"session_id": "s", "turns": [{"start_s": 0, '
                    '"input_tokens": 1, "output_tokens": 3}]}\n')
    _assert_clean_failure(capsys, tmp_path, ["trace", "sample", str(good), "--sessions", "1",
                                             "--seed", "-1"], "--seed: -1 — a non-negative")


def test_a_span_that_draws_no_session_names_days_and_seed(tmp_path, kvsim_cli):
    # family-4, half a day from Monday 00:00, seed 3: the Poisson draws give no session
    assert list(generate(load_preset("family-4"), 0.5, 3, 0)) == []
    out = tmp_path / "half.jsonl"
    out.write_text("kept\n")  # an earlier trace stays as it was
    code, err, _ = kvsim_cli("trace", "generate", "family-4", "--days", "0.5", "--seed", "3",
                             "-o", out)
    assert (code, err) == (2, "error: --days: '0.5' — a span in which family-4 draws a "
                              "session: seed 3 drew none in it; give more days or another "
                              "--seed")
    assert out.read_text() == "kept\n"
