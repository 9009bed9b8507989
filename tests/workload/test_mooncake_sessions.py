"""Mooncake session inference on a conversation-shaped trace: every request starts with
the same system block (as in Mooncake's conversation trace, where all 12,031 rows start
with hash block 0), and conversations must still come out as separate sessions."""

import json
import random

import pytest

from kvsim.cli import main
from kvsim.workload.importers import SHARED_PREFIX_FANOUT, import_mooncake
from kvsim.workload.io import read_trace

CONVERSATIONS = 200


def _conversation_trace(path, seed=0):
    """CONVERSATIONS conversations of 1-12 turns; each turn's prompt is the shared system
    block 0, then the conversation's whole history, then the new message.  Turns of
    different conversations interleave in time.  Every prompt holds a full block past the
    system block (else nothing links a turn to its conversation), except in the
    one-turn conversations every fifth one is: a short question, one full block (the
    system block) and a partial one, like the real trace's ``[0, 462]`` of 915 tokens."""
    rng = random.Random(seed)
    rows, next_id = [], 1
    for c in range(CONVERSATIONS):
        t_ms, ids, n_in = rng.randrange(0, 3_600_000), [0], 512
        short = c % 5 == 0
        for turn in range(1 if short else rng.randint(1, 12)):
            grow = rng.randint(1, 511) if short else rng.randint(512 if turn == 0 else 1, 1500)
            n_in += grow
            while len(ids) < -(-n_in // 512):
                ids.append(next_id)
                next_id += 1
            rows.append({"timestamp": t_ms, "input_length": n_in,
                         "output_length": rng.randint(1, 400), "hash_ids": list(ids),
                         "conversation": c})
            t_ms += rng.randrange(10_000, 120_000)
            n_in = 512 * (n_in // 512)  # the answer ends mid-block: next turn re-sends it
            ids = ids[:n_in // 512]
    rows.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "conversation"})
                            + "\n" for r in rows))
    return rows


def test_shared_system_block_does_not_merge_conversations(tmp_path):
    rows = _conversation_trace(tmp_path / "conv.jsonl")
    assert CONVERSATIONS >= SHARED_PREFIX_FANOUT
    sessions = list(import_mooncake(tmp_path / "conv.jsonl")[1])
    assert len(sessions) == CONVERSATIONS
    # each inferred session is exactly one conversation's turns, in order
    by_start: dict[tuple, int] = {}
    for r in rows:
        by_start.setdefault((r["timestamp"] / 1000, tuple(r["hash_ids"])), r["conversation"])
    for s in sessions:
        owners = {by_start[(t.start_s + rows[0]["timestamp"] / 1000,
                            tuple(int(g.id[3:]) for g in t.prefix))] for t in s.turns}
        assert len(owners) == 1


def _kvsim(*argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    assert exc.value.code == 0


def test_sample_sessions_keeps_a_stable_share(tmp_path):
    _conversation_trace(tmp_path / "conv.jsonl")
    full = tmp_path / "full.jsonl"
    _kvsim("trace", "import", "mooncake", str(tmp_path / "conv.jsonl"), "-o", str(full))
    kept = []
    for seed in range(6):
        out = tmp_path / f"s{seed}.jsonl"
        _kvsim("trace", "sample", str(full), "--sessions", "8", "--seed", str(seed), "-o",
               str(out))
        kept.append(sum(len(s.turns) for s in read_trace(out)[1]))
    assert all(8 <= k <= 8 * 12 for k in kept), kept
