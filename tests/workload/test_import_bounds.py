"""Importers that must hold their input stop at a documented bound with one line and
exit 2 (the bounds lowered here so that small files reach them)."""

import json

import pytest

from kvsim.cli import main
from kvsim.workload import importers, sharegpt


def _fails(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1
    return err[0]


def test_mooncake_stops_at_its_row_and_id_bounds(tmp_path, capsys, monkeypatch):
    p = tmp_path / "mc.jsonl"
    p.write_text("".join(json.dumps({"timestamp": k, "input_length": 1000, "output_length": 1,
                                     "hash_ids": [2 * k, 2 * k + 1]}) + "\n" for k in range(3)))
    out = tmp_path / "o.jsonl"
    monkeypatch.setattr(importers, "MOONCAKE_MAX_ROWS", 2)
    assert _fails(capsys, "trace", "import", "mooncake", p, "-o", out) == (
        "error: mc.jsonl line 3: 'over 2 rows' — at most 2 rows in one Mooncake import (it "
        "holds the trace to infer sessions); split the file by time and import the parts")
    monkeypatch.setattr(importers, "MOONCAKE_MAX_ROWS", 10)
    monkeypatch.setattr(importers, "MOONCAKE_MAX_BLOCKS", 5)
    assert "'over 5 hash ids' — at most 5 hash ids in one Mooncake import" in _fails(
        capsys, "trace", "import", "mooncake", p, "-o", out)
    assert not out.exists()


def test_grouped_burstgpt_stops_at_its_bound(tmp_path, capsys, monkeypatch):
    p = tmp_path / "bg.csv"
    p.write_text("Timestamp,Session ID,Request tokens,Response tokens\n"
                 + "".join(f"{k},s{k % 2},10,5\n" for k in range(4)))
    monkeypatch.setattr(importers, "BURSTGPT_MAX_GROUPED_ROWS", 3)
    assert _fails(capsys, "trace", "import", "burstgpt", p, "-o", tmp_path / "o.jsonl") == (
        "error: bg.csv line 5: 'over 3 rows' — at most 3 rows in one BurstGPT import with a "
        "Session ID column (it holds the rows to group them); split the file by time and "
        "import the parts")


def test_sharegpt_stops_at_its_size_bound(tmp_path, capsys, monkeypatch):
    p = tmp_path / "sg.json"
    p.write_text(json.dumps([{"conversations": [{"from": "human", "value": "x" * 3000},
                                                {"from": "gpt", "value": "y"}]}]))
    monkeypatch.setattr(sharegpt, "SHAREGPT_MAX_BYTES", 2**11)
    assert _fails(capsys, "trace", "import", "sharegpt", p, "-o", tmp_path / "o.jsonl") == (
        "error: sg.json: '3.01 KiB' — at most 2.00 KiB in one ShareGPT import (it holds the "
        "file parsed); split it into smaller files")
