"""Importers against the real shared traces and against small hand-made files."""

import json
import math
import warnings

import pytest

from kvsim.errors import InputError
from kvsim.workload.importers import (
    TraceWarning,
    import_azure,
    import_burstgpt,
    import_mooncake,
    import_trace,
)
from kvsim.workload.schema import prompt_segments
from kvsim.workload.sharegpt import import_sharegpt


def test_mooncake_gives_every_request_with_exact_blocks(mooncake_sessions, mooncake_path):
    rows = [json.loads(line) for line in mooncake_path.read_text().splitlines()]
    turns = [(s, i) for s in mooncake_sessions for i in range(len(s.turns))]
    assert len(turns) == 3993 == len(rows)
    # every request keeps its token count, its block ids and its output length
    by_time = sorted(((s.turns[i].start_s, [g.id for g in s.turns[i].prefix],
                       sum(g.tokens for g in prompt_segments(s, i)), s.turns[i].output_tokens)
                      for s, i in turns), key=lambda r: (r[0], r[1]))
    raw = sorted(((r["timestamp"] / 1000, [f"mc/{h}" for h in r["hash_ids"]],
                   r["input_length"], r["output_length"]) for r in rows),
                 key=lambda r: (r[0], r[1]))
    assert by_time == raw
    assert all(s.history == "none" for s in mooncake_sessions)


def test_mooncake_chains_are_prefix_extensions(mooncake_sessions):
    # inferred follow-ups (README: ~1,444 by its rule; ours: 1,455 in 2,538 sessions)
    assert len(mooncake_sessions) == 2538
    assert max(len(s.turns) for s in mooncake_sessions) == 24
    for s in mooncake_sessions:
        first = [g.id for g in s.turns[0].prefix]
        n_full = sum(g.tokens == 512 for g in s.turns[0].prefix)
        for t in s.turns[1:]:
            # every later turn shares at least one full block with the session's root
            assert n_full == 0 or [g.id for g in t.prefix][:1] == first[:1]
    starts = [s.turns[0].start_s for s in mooncake_sessions]
    assert starts == sorted(starts)


def test_mooncake_block_count_checked(tmp_path):
    p = tmp_path / "mc.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'
                 '{"timestamp": 5, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}\n')
    with pytest.raises(InputError) as exc:
        import_mooncake(p)
    assert exc.value.one_line() == (
        "mc.jsonl line 2: hash_ids: '2 ids' — expected ceil(input_length/512) = 3")


def test_azure_gives_every_request(azure_sessions):
    assert len(azure_sessions) == 19366
    first, last = azure_sessions[0].turns[0], azure_sessions[-1].turns[0]
    assert (first.start_s, first.input_tokens, first.output_tokens) == (0.0, 374, 44)
    # 2023-11-16 18:15:46.6805900 → 19:14:08.xxx ; README: 3,502 s
    assert last.start_s == pytest.approx(3501.72, abs=0.01)


def _csv(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


AZ_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize("body, message", [
    ("2023-11-16 18:15:46.5,10,-3\n", "t.csv line 2: GeneratedTokens: '-3' — must be >= 1"),
    ("2023-11-16 18:15:46.5,1.5,3\n", "t.csv line 2: ContextTokens: '1.5' — must be a whole"),
    ("2023-11-16 18:15:46.5,ten,3\n", "t.csv line 2: ContextTokens: 'ten' — not a number"),
    ("yesterday,10,3\n", "t.csv line 2: TIMESTAMP: 'yesterday' — expected YYYY-MM-DD"),
    ("2023-11-16 18:15:46.5,10,3\n2023-11-16 18:15:40.0,10,3\n",
     "t.csv line 3: timestamp: 1700158540.0 — earlier than the previous row (1700158546.5)"),
])
def test_azure_bad_rows(tmp_path, body, message):
    with pytest.raises(InputError) as exc:
        list(import_azure(_csv(tmp_path, AZ_HEAD + body))[1])
    assert exc.value.one_line().startswith(message)


def test_azure_sort_flag_sorts_with_warning(tmp_path):
    p = _csv(tmp_path, AZ_HEAD + "2023-11-16 18:15:46.5,10,3\n2023-11-16 18:15:40.0,20,4\n")
    with pytest.warns(TraceWarning, match="1 rows had earlier timestamps"):
        got = list(import_azure(p, sort=True)[1])
    assert [(s.turns[0].start_s, s.turns[0].input_tokens) for s in got] == [(0.0, 20), (6.5, 10)]


def test_missing_columns_and_empty_files(tmp_path):
    with pytest.raises(InputError, match="missing GeneratedTokens"):
        list(import_azure(_csv(tmp_path, "TIMESTAMP,ContextTokens\nx,1\n"))[1])
    with pytest.raises(InputError, match="empty file"):
        import_azure(_csv(tmp_path, "", "e.csv"))
    with pytest.raises(InputError, match="empty file"):
        list(import_azure(_csv(tmp_path, AZ_HEAD, "h.csv"))[1])
    with pytest.raises(InputError, match="format: 'parquet' — one of mooncake"):
        import_trace("parquet", tmp_path / "t.csv")


def test_burstgpt_with_and_without_sessions(tmp_path):
    head = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
    plain = _csv(tmp_path, head + "\n5,ChatGPT,100,20,120,Conversation log\n"
                 "7,GPT-4,50,0,50,Conversation log\n9,ChatGPT,30,5,35,API log\n")
    with pytest.warns(TraceWarning, match="skipped 1 rows with 0 response tokens"):
        got = list(import_burstgpt(plain)[1])
    assert [(s.turns[0].start_s, s.turns[0].input_tokens, s.turns[0].output_tokens)
            for s in got] == [(0.0, 100, 20), (4.0, 30, 5)]
    grouped = _csv(tmp_path, "Session ID,Timestamp,Request tokens,Response tokens\n"
                   "a,1,10,2\nb,2,20,3\na,4,30,4\n", "g.csv")
    got = list(import_burstgpt(grouped)[1])
    assert [(s.session_id, [t.start_s for t in s.turns]) for s in got] == [
        ("bg-a", [0.0, 3.0]), ("bg-b", [1.0])]


def test_sharegpt_counts_and_estimates(tmp_path):
    convs = [
        {"id": "x", "conversations": [
            {"from": "system", "value": "s" * 40},
            {"from": "human", "value": "a" * 9},          # ceil(9/4) = 3
            {"from": "gpt", "value": "b" * 8},            # 2
            {"from": "human", "value": "hi", "tokens": 7},
            {"from": "gpt", "value": "", "tokens": 11},
            {"from": "human", "value": "dangling"}]},
        {"id": "y", "messages": [{"role": "user", "content": "q"},
                                 {"role": "assistant", "content": "r" * 5}]},
    ]
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(convs))
    _, it = import_sharegpt(p, session_rate_per_s=0.1, think_s=12.0, seed=3)
    got = {s.session_id: s for s in it}
    x = got["sg000000-x"]
    assert x.system_prompt_tokens == 10
    assert [(t.input_tokens, t.output_tokens, t.think_s) for t in x.turns] == [
        (3, 2, 0.0), (7, 11, 12.0)]
    assert [(t.input_tokens, t.output_tokens) for t in got["sg000001-y"].turns] == [(1, 2)]
    assert min(s.turns[0].start_s for s in got.values()) == 0.0


def test_sharegpt_bad_role(tmp_path):
    p = tmp_path / "sg.jsonl"
    p.write_text(json.dumps({"conversations": [{"from": "robot", "value": "x"}]}) + "\n")
    with pytest.raises(InputError, match=r"sg.jsonl line 1: conversations.0: from: 'robot'"):
        import_sharegpt(p)


def test_no_warnings_on_clean_real_traces(mooncake_path, azure_path):
    # Import (and fully consume: the importers are lazy) inside the recording block, both
    # with and without --sort: the real traces are clean and time-ordered, so neither path
    # may repair, sort or drop anything — i.e. no TraceWarning at all.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for sort in (False, True):
            mc = list(import_mooncake(mooncake_path, sort=sort)[1])
            az = list(import_azure(azure_path, sort=sort)[1])
            assert sum(len(s.turns) for s in mc) == 3993
            assert len(az) == 19366  # rows per the trace README
            assert math.isfinite(mc[-1].turns[-1].start_s)
    trace_warnings = [w for w in caught if issubclass(w.category, TraceWarning)]
    assert trace_warnings == [], [str(w.message) for w in trace_warnings]
