"""Fuzz: kvsim traces (.jsonl lines from the schema, mutated; parquet files cut short or
with bytes flipped) through ``trace inspect``, ``trace sample`` and, for some, ``simulate``.

Each run must exit 0 or print one ``error:`` line and exit 2 (tests/fuzz/conftest.py).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvsim.workload.schema import ReferenceEvent, Segment, Session, TraceMeta, Turn
from tests.fuzz.helpers import FUZZ

META = {"trace_meta": {"source": "fuzz", "description": "", "seed": 0, "schema_version": 1}}
TURN = {"start_s": 10.0, "think_s": 0.0, "prefix": [], "tool_tokens": 0, "input_tokens": 64,
        "output_tokens": 16, "references": []}
SESSION = {"session_id": "s0", "kind": "chat", "member": "a", "system_prompt_id": "general",
           "system_prompt_tokens": 100, "history": "full", "turns": [TURN]}
REF = {"turn": 0, "part": "input", "offset_tokens": 0, "length_tokens": 8, "content": "exact"}
FIELDS = {"session": list(Session.model_fields), "turn": list(Turn.model_fields),
          "ref": list(ReferenceEvent.model_fields), "segment": list(Segment.model_fields),
          "meta": list(TraceMeta.model_fields)}
EDGE: list[Any] = [0, -1, 1, 2**31, 2**63, 10**30, -(10**30), 0.5, 1e-9, 1e308, math.nan,
                   math.inf, -math.inf, "", "x", "ünï ✓\u2028", True, None, [], {}, [1],
                   {"id": "a", "tokens": 1}, "system", "none", "gist"]


def _value(field: str) -> st.SearchStrategy[Any]:
    good = {"start_s": [0.0, 5.0, 1e6], "think_s": [0.0, 3.0], "prefix": [
        [{"id": "p", "tokens": 32}], [{"id": "", "tokens": 0}]], "turns": [[], [TURN, TURN]],
        "references": [[REF], [{**REF, "turn": 5}], [{**REF, "part": "system"}]]}
    return st.sampled_from(good.get(field, [1, 8])) | st.sampled_from(EDGE) | st.integers() \
        | st.text(max_size=6)


def _mutated(base: dict[str, Any], fields: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    keys = st.sampled_from(fields + ["no_such_key"])
    sets = st.dictionaries(keys, st.deferred(lambda: st.sampled_from(fields)).flatmap(_value),
                           max_size=2)
    drops = st.lists(st.sampled_from(fields), max_size=1)
    changed = st.tuples(sets, drops).map(
        lambda sd: {k: v for k, v in {**base, **sd[0]}.items() if k not in sd[1]})
    return st.one_of(st.just(base), st.just(base), st.just(base), changed)


@st.composite
def session_line(draw: st.DrawFn, i: int) -> Any:
    turns = draw(st.lists(_mutated(TURN, FIELDS["turn"]), min_size=1, max_size=3))
    turns = [dict(t, start_s=None) if k and draw(st.booleans()) else t
             for k, t in enumerate(turns)]
    s = draw(_mutated({**SESSION, "session_id": f"s{i}"}, FIELDS["session"]))
    return {**s, "turns": turns} if draw(st.booleans()) else s


@st.composite
def jsonl_trace(draw: st.DrawFn) -> bytes:
    """A header and a few sessions, some mutated, then line-level damage."""
    meta = draw(st.sampled_from([META, {"trace_meta": {}}]) |
                _mutated(META["trace_meta"], FIELDS["meta"]).map(lambda m: {"trace_meta": m}))
    if draw(st.integers(0, 3)) < 3:
        meta = META
    lines = [json.dumps(meta, allow_nan=True)]
    for i in range(draw(st.integers(0, 3))):
        lines.append(json.dumps(draw(session_line(i)), allow_nan=True))
    damage = draw(st.sampled_from(["none", "none", "cut", "junk", "blank", "dup", "bytes"]))
    if damage == "cut":
        lines[-1] = lines[-1][: draw(st.integers(0, len(lines[-1])))]
    elif damage == "junk":
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(
            ["[1, 2]", "42", "null", "{", '"s"', "{}", "NaN", '{"trace_meta": 1}'])))
    elif damage == "blank":
        lines.insert(draw(st.integers(0, len(lines))), "")
    elif damage == "dup" and len(lines) > 1:
        lines.append(lines[1])
    data = ("\n".join(lines) + "\n").encode()
    return data + b"\xff\xfe\x00" if damage == "bytes" else data


def _commands(path: Path, out: Path) -> list[list[str]]:
    return [["trace", "inspect", str(path)], ["trace", "inspect", str(path), "--json"],
            ["trace", "sample", str(path), "--sessions", "1", "-o", str(out / "s.jsonl")]]


@settings(FUZZ, max_examples=80)
@given(data=jsonl_trace(), simulate=st.integers(0, 3))
@example(data=(json.dumps(META) + "\n" + json.dumps(SESSION) + "\n").encode(), simulate=0)
def test_jsonl_traces(clean_exit, tmp_path, data, simulate):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path, out = Path(d) / "t.jsonl", Path(d)
        path.write_bytes(data)
        for argv in _commands(path, out):
            clean_exit(argv)
        if simulate == 0:  # a quarter of the cases also run the trace
            scenario = Path(d) / "sc.yaml"
            scenario.write_text(yaml.safe_dump({
                "gpu": "rtx-4090", "model": "llama-3.2-1b",
                "engine": {"preset": "llama.cpp", "context_tokens": 8192, "parallel": 2},
                "workload": {"trace": str(path)}}), encoding="utf-8")
            clean_exit(["simulate", str(scenario), "-o", str(out / "run"), "--no-report"])


@pytest.fixture(scope="module")
def parquet_bytes(tmp_path_factory) -> bytes:
    """A small valid parquet trace (the generator's, two sessions)."""
    from kvsim.cli import main

    path = tmp_path_factory.mktemp("pq") / "t.parquet"
    with pytest.raises(SystemExit):
        main(["trace", "generate", "family-2", "--days", "0.5", "-o", str(path)])
    return path.read_bytes()


@settings(FUZZ, max_examples=40)
@given(cut=st.floats(0, 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)),
                                            max_size=3))
@example(cut=0.5, flips=[])
@example(cut=1.0, flips=[])
def test_parquet_traces_cut_or_flipped(clean_exit, tmp_path, parquet_bytes, cut, flips):
    data = bytearray(parquet_bytes[: int(len(parquet_bytes) * cut)])
    for where, byte in flips:
        if data:
            data[min(int(where * len(data)), len(data) - 1)] = byte
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = Path(d) / "t.parquet"
        path.write_bytes(bytes(data))
        for argv in _commands(path, Path(d)):
            clean_exit(argv)


RAW_VALUES = st.sampled_from([0, 1, 512, 513, -1, 1e308, math.nan, "", "x", None, True, [],
                              [0], [0, 1], 2**63, "2024-01-01 00:00:00.0000000"])


@st.composite
def raw_trace(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """(format, file name, bytes) of a small raw public trace, some cells mutated."""
    fmt = draw(st.sampled_from(["mooncake", "azure", "burstgpt", "sharegpt"]))
    n = draw(st.integers(1, 3))
    if fmt == "mooncake":
        rows = [{"timestamp": 1000 * i, "input_length": 600, "output_length": 20,
                 "hash_ids": [0, i + 1]} for i in range(n)]
        for r in rows:
            if draw(st.integers(0, 3)) == 3:
                r[draw(st.sampled_from(sorted(r)))] = draw(RAW_VALUES)
        return fmt, "t.jsonl", "\n".join(json.dumps(r, allow_nan=True) for r in rows).encode()
    if fmt == "sharegpt":
        conv = [{"id": f"c{i}", "conversations": [{"from": "human", "value": "hi " * 5},
                                                  {"from": "gpt", "value": "yo"}]}
                for i in range(n)]
        if draw(st.integers(0, 3)) == 3:
            conv[0][draw(st.sampled_from(["id", "conversations"]))] = draw(RAW_VALUES)
        return fmt, "t.json", json.dumps(conv, allow_nan=True).encode()
    head = "TIMESTAMP,ContextTokens,GeneratedTokens" if fmt == "azure" else \
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
    cells = [[f"2024-01-01 00:00:0{i}.0000000", "100", "20"] if fmt == "azure" else
             [str(i), "ChatGPT", "100", "20", "120", "Conversation log"] for i in range(n)]
    for row in cells:
        if draw(st.integers(0, 3)) == 3:
            row[draw(st.integers(0, len(row) - 1))] = str(draw(RAW_VALUES))
    return fmt, "t.csv", "\n".join([head] + [",".join(r) for r in cells]).encode()


@settings(FUZZ, max_examples=60)
@given(raw=raw_trace())
def test_raw_public_traces(clean_exit, tmp_path, raw):
    fmt, name, data = raw
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = Path(d) / name
        path.write_bytes(data)
        clean_exit(["trace", "import", fmt, str(path), "-o", str(Path(d) / "out.jsonl")])
        clean_exit(["trace", "inspect", "--format", fmt, str(path)])


_BURST = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
          "0,ChatGPT,100,20,120,Conversation log\n1e308,ChatGPT,100,20,120,Conversation log\n")
_MOONCAKE = ('{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]}\n'
             '{"timestamp": 9223372036854775808, "input_length": 600, "output_length": 20, '
             '"hash_ids": [0, 2]}\n')


@pytest.mark.parametrize("fmt,name,text", [
    ("burstgpt", "t.csv", _BURST),      # a 1e308 s arrival: a per-minute span past any
    ("mooncake", "t.jsonl", _MOONCAKE),  # buffer; a 2**63 ms timestamp, beyond int64
], ids=["burstgpt-1e308s", "mooncake-2**63ms"])
def test_inspect_a_trace_spanning_absurd_times(clean_exit, tmp_path, fmt, name, text):
    # found by the fuzzer (test_raw_public_traces without derandomize)
    (tmp_path / name).write_text(text)
    clean_exit(["trace", "inspect", "--format", fmt, str(tmp_path / name)])
    clean_exit(["trace", "import", fmt, str(tmp_path / name), "-o", str(tmp_path / "o.jsonl")])
    clean_exit(["trace", "inspect", str(tmp_path / "o.jsonl")])
