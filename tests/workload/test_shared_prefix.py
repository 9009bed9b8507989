"""A session's ``shared_prefix``: a list of system segments before its system prompt, so a
BOS token every session starts with and a per-persona system prompt need no trick."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvsim.api import simulate
from kvsim.calibrate.wire import TokenSpace, chat_messages, segment_text
from kvsim.core.sessions import chat_segments
from kvsim.scenario import resolve_scenario
from kvsim.workload.io import _META_KEY, SESSION_SCHEMA, read_trace, write_trace
from kvsim.workload.schema import Segment, Session, TraceMeta, Turn, prompt_segments

BOS = Segment(id="bos", tokens=1)
HOUSE = Segment(id="house-rules", tokens=200)


def _persona(sid: str, start_s: float, persona: str) -> Session:
    return Session(session_id=sid, shared_prefix=(BOS, HOUSE), system_prompt_id=persona,
                   system_prompt_tokens=300, turns=(
                       Turn(start_s=start_s, input_tokens=50, output_tokens=20),
                       Turn(think_s=1.0, input_tokens=30, output_tokens=10)))


def test_every_prompt_opens_with_the_shared_prefix_then_the_system_prompt() -> None:
    s = _persona("a", 0.0, "tutor")
    assert [(g.id, g.tokens) for g in prompt_segments(s, 1)] == [
        ("sys/bos", 1), ("sys/house-rules", 200), ("sys/tutor", 300), ("a/t0/in", 50),
        ("a/t0/out", 20), ("a/t1/in", 30)]
    # a new chat after a failure keeps all of the system content
    assert [g.id for g in chat_segments(s, 1, start=1)] == [
        "sys/bos", "sys/house-rules", "sys/tutor", "a/t1/in"]


def test_sessions_of_two_personas_share_only_the_shared_prefix() -> None:
    """One llama.cpp slot: persona B's first prompt finds persona A's conversation in the
    slot and reuses the common head: BOS + house rules = 201 tokens (the system prompts
    differ), where without the shared prefix nothing would match."""
    sc = resolve_scenario({
        "gpu": "rtx-4090", "model": "llama-3.1-8b",
        "engine": {"preset": "llama.cpp", "allocator": "slots", "parallel": 1,
                   "context_tokens": 8192},
        "workload": {"preset": "family-2"}, "latency": {"kind": "constant"}})
    req = simulate(sc, sessions=[_persona("a", 0.0, "tutor"),
                                 _persona("b", 100.0, "coder")]).requests
    cached = req.set_index("request_id")["cached_tokens"].to_dict()
    # a#1 continues its own chat: the slot holds its prompt, 201 + 300 + 50, and 19 of
    # its 20 answer tokens (the last one sampled is never decoded into the cache)
    assert cached == {"a#0": 0, "a#1": 570, "b#0": 201, "b#1": 570}


@pytest.mark.parametrize("ext", [".jsonl", ".parquet"])
def test_round_trip_and_old_traces_unchanged(tmp_path, ext) -> None:
    sessions = [_persona("a", 0.0, "tutor"),
                Session(session_id="b", turns=(Turn(start_s=1.0, input_tokens=5,
                                                    output_tokens=2),))]
    path = tmp_path / f"t{ext}"
    write_trace(path, sessions, TraceMeta(source="test"))
    assert read_trace(path)[1] == sessions
    if ext == ".jsonl":  # a session without one is written as before the key existed
        lines = path.read_text().splitlines()
        assert json.loads(lines[1])["shared_prefix"] == [{"id": "bos", "tokens": 1},
                                                          {"id": "house-rules", "tokens": 200}]
        assert "shared_prefix" not in json.loads(lines[2])


def test_a_parquet_trace_written_before_the_column_existed_reads(tmp_path) -> None:
    old = pa.schema([f for f in SESSION_SCHEMA if f.name != "shared_prefix"])
    rows = [{"session_id": "s", "kind": "chat", "member": "", "system_prompt_id": None,
             "system_prompt_tokens": 0, "history": "full",
             "turns": [{"start_s": 0.0, "think_s": 0.0, "prefix": [], "tool_tokens": 0,
                        "input_tokens": 7, "output_tokens": 3, "references": []}]}]
    meta = TraceMeta(source="old").model_dump_json().encode()
    pq.write_table(pa.Table.from_pylist(rows, schema=old.with_metadata({_META_KEY: meta})),
                   tmp_path / "old.parquet")
    (s,) = read_trace(tmp_path / "old.parquet")[1]
    assert s.shared_prefix == () and s.turns[0].input_tokens == 7


def test_replay_sends_the_whole_system_content_as_one_system_message() -> None:
    space = TokenSpace()
    s = _persona("a", 0.0, "tutor")
    msgs = chat_messages(s, 0, prompt_segments(s, 0), space, {})
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == "".join(
        segment_text(space.segment_ids(g, n))
        for g, n in (("sys/bos", 1), ("sys/house-rules", 200), ("sys/tutor", 300)))
