"""Damaged results folders: one line naming the file and what is wrong, exit code 2,
for every command that loads them (audit B14, C21: compare, report)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvsim.errors import InputError
from kvsim.metrics.results import Results

DAMAGE = [
    ("summary.json", "{bad", "summary.json' — damaged results folder: not valid JSON"),
    ("meta.json", '"x"', ("meta.json' — damaged results folder: a JSON object expected, "
                         "found str")),
    ("meta.json", json.dumps({"format_version": 1, "source": "nosuch"}),
     "meta.json' — damaged results folder: source 'nosuch' is not one of simulated, measured"),
    ("scenario.json", '{"hash": 1}', ("scenario.json' — damaged results folder: needs "
                                     "'scenario' (an object) and 'hash' (a string)")),
    ("requests.parquet", "junk", ("requests.parquet' — damaged results folder: not a "
                                 "readable Parquet table (ArrowInvalid)")),
]


@pytest.mark.parametrize("name, content, message", DAMAGE)
def test_the_loader_names_the_damaged_file(tmp_path, make_results, name, content, message):
    d = make_results(tmp_path / "r", ["a", "b"])
    (d / name).write_text(content)
    with pytest.raises(InputError, match="damaged results folder"):
        Results.load(d)


@pytest.mark.parametrize("command", ["compare", "report"])
@pytest.mark.parametrize("name, content, message", DAMAGE)
def test_compare_and_report_print_one_line(tmp_path, kvsim_cli, make_results, command,
                                           name, content, message):
    good = make_results(tmp_path / "good", ["a", "b"])
    bad = make_results(tmp_path / "bad", ["a", "b"])
    (bad / name).write_text(content)
    argv = ["compare", bad, good] if command == "compare" else \
        ["report", bad, "-o", tmp_path / "r.html"]
    rc, err, _ = kvsim_cli(*argv)
    assert rc == 2
    assert err == f"error: results: '{bad}/{message} (rerun the command that wrote it)"


def test_a_table_without_its_columns_is_refused(tmp_path, make_results):
    d = make_results(tmp_path / "r", ["a"])
    pd.DataFrame({"x": [1]}).to_parquet(d / "requests.parquet")
    with pytest.raises(InputError, match="missing column\\(s\\) request_id"):
        Results.load(d)


def test_an_older_folder_without_truncated_prompt_tokens_reads_zero(tmp_path, make_results):
    # folders written before the column existed: nothing was recorded as dropped
    d = make_results(tmp_path / "r", ["a", "b"])
    req = pd.read_parquet(d / "requests.parquet")
    req.drop(columns="truncated_prompt_tokens").to_parquet(d / "requests.parquet")
    got = Results.load(d).requests
    assert got["truncated_prompt_tokens"].tolist() == [0, 0]
