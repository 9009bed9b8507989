"""Trace files: JSONL/Parquet round trips, streaming, atomic writes, bad input."""

import json

import pytest

from kvsim.errors import InputError
from kvsim.workload.generator import generate
from kvsim.workload.io import count_sessions, iter_sessions, read_meta, read_trace, write_trace
from kvsim.workload.preset import load_preset
from kvsim.workload.schema import Segment, Session, TraceMeta, Turn


@pytest.fixture(scope="module")
def household():
    return generate(load_preset("family-4"), 2, seed=7)


def _mixed() -> list[Session]:
    """Sessions exercising every optional field (prefix, None start_s, system refs)."""
    return [
        Session(session_id="a", kind="imported", history="none", turns=(
            Turn(start_s=0.0, prefix=(Segment(id="mc/1", tokens=512),
                                      Segment(id="mc/2", tokens=7)), input_tokens=0,
                 output_tokens=3),
            Turn(start_s=2.5, prefix=(Segment(id="mc/1", tokens=512),), input_tokens=4,
                 output_tokens=1))),
        Session(session_id="b", system_prompt_id="coder", system_prompt_tokens=100, turns=(
            Turn(start_s=1.0, input_tokens=5, output_tokens=9),
            Turn(think_s=0.5, tool_tokens=40, input_tokens=0, output_tokens=2, references=(
                {"turn": None, "part": "system", "length_tokens": 100},
                {"turn": 0, "part": "input", "offset_tokens": 1, "length_tokens": 3,
                 "content": "gist"})))),
    ]


@pytest.mark.parametrize("ext", [".jsonl", ".parquet"])
def test_round_trip_is_exact(tmp_path, household, ext):
    for name, sessions in (("household", household), ("mixed", _mixed())):
        path = tmp_path / f"{name}{ext}"
        meta = TraceMeta(source="test", seed=7, description=name)
        assert write_trace(path, sessions, meta) == len(sessions)
        got_meta, got = read_trace(path)
        assert got_meta == meta
        assert got == sessions


def test_parquet_streams_in_batches(tmp_path, monkeypatch, household):
    from kvsim.workload import io
    monkeypatch.setattr(io, "ROW_GROUP_SESSIONS", 3)
    path = tmp_path / "t.parquet"
    write_trace(path, iter(household))
    it = iter_sessions(path)
    assert next(it) == household[0]  # a generator, not a list
    assert [household[0], *it] == household


@pytest.mark.parametrize("ext", [".jsonl", ".parquet"])
def test_count_sessions_stops_past_its_limit(tmp_path, household, ext):
    path = tmp_path / f"t{ext}"
    write_trace(path, household)
    n = len(household)
    assert n > 5
    assert count_sessions(path) == n
    # over the limit: limit + 1 (a JSONL file is read no further than that)
    assert [count_sessions(path, limit=k) for k in (0, 4, n - 1, n, n + 10)] == [1, 5, n, n, n]


def test_writer_leaves_nothing_on_error(tmp_path, household):
    def broken():
        yield household[0]
        raise InputError("x", 1, "boom")
    for ext in (".jsonl", ".parquet"):
        with pytest.raises(InputError):
            write_trace(tmp_path / f"out{ext}", broken())
    assert list(tmp_path.iterdir()) == []


def test_unknown_extension_rejected(tmp_path, household):
    with pytest.raises(InputError, match="jsonl or .parquet"):
        write_trace(tmp_path / "out.csv", household)


def _jsonl(tmp_path, lines):
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    return p


HEADER = json.dumps({"trace_meta": {"source": "t"}})
GOOD = {"session_id": "s", "turns": [{"start_s": 1.0, "input_tokens": 2, "output_tokens": 3}]}


def _bad_turn(**kw):
    return json.dumps({**GOOD, "turns": [{**GOOD["turns"][0], **kw}]})


@pytest.mark.parametrize("line, message", [
    (_bad_turn(output_tokens=-3),
     "trace.jsonl line 3: turns.0.output_tokens: -3 — Input should be greater than 0"),
    (_bad_turn(input_tokens=2.5),
     "trace.jsonl line 3: turns.0.input_tokens: 2.5 — Input should be a valid integer"),
    (_bad_turn(input_tokens="many"), "trace.jsonl line 3: turns.0.input_tokens: 'many'"),
    ('{"session_id": "s", "turns": [', "trace.jsonl line 3: '{\"session_id\""),
])
def test_bad_records_name_file_line_field(tmp_path, line, message):
    p = _jsonl(tmp_path, [HEADER, json.dumps(GOOD), line])
    with pytest.raises(InputError) as exc:
        list(iter_sessions(p))
    assert exc.value.one_line().startswith(message)


def test_backwards_sessions_rejected(tmp_path):
    later = {**GOOD, "session_id": "t", "turns": [{**GOOD["turns"][0], "start_s": 0.5}]}
    p = _jsonl(tmp_path, [HEADER, json.dumps(GOOD), json.dumps(later)])
    with pytest.raises(InputError, match="line 3: turns.0.start_s"):
        list(iter_sessions(p))
    assert [s.session_id for s in iter_sessions(p, check_order=False)] == ["s", "t"]


def test_empty_and_headerless_files(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(InputError, match="empty file"):
        list(iter_sessions(empty))
    with pytest.raises(InputError, match="empty file"):
        read_meta(empty)
    only_header = _jsonl(tmp_path, [HEADER])
    with pytest.raises(InputError, match="no sessions"):
        list(iter_sessions(only_header))
    no_header = tmp_path / "n.jsonl"
    no_header.write_text(json.dumps(GOOD) + "\n")
    with pytest.raises(InputError, match="line 1: trace_meta"):
        list(iter_sessions(no_header))


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        list(iter_sessions(tmp_path / "nope.jsonl"))
