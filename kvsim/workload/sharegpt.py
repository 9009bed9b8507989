"""ShareGPT-style conversation import → closed-loop multi-turn sessions.

Input: a JSON array of conversations, or JSON Lines with one conversation per line.
A conversation is an object with a message list under ``conversations`` (ShareGPT),
``messages`` (OpenAI style) or ``conversation`` (LMSYS style); a message has a role
under ``from`` or ``role`` and text under ``value`` or ``content``, and may give its
token count directly under ``tokens`` or ``num_tokens``.

Roles: ``system`` → the session's system prompt (``system_prompt_id`` is a digest of
the text, so conversations with the same system prompt share a reusable prefix);
``human``/``user`` → turn input (consecutive ones are merged); ``tool``/``function``/
``observation`` → ``tool_tokens`` of the next turn; ``gpt``/``assistant``/``chatgpt``/
``bard``/``model`` → the answer that closes a turn.  An assistant message before any
user message, and a trailing user message with no answer, are dropped (no turn to
attach them to).

Token counts, when not given: ``ceil(characters / 4)`` — the rule of thumb OpenAI
publishes for English text with its tokenizers (~4 characters per token).  It is an
estimate; give ``tokens`` for exact counts.

Arrivals: a conversation's ``timestamp`` (seconds) when every conversation has one;
otherwise sessions arrive as a Poisson process of ``session_rate_per_s`` (default one
per 300 s — ASSUMPTION, a household-scale rate) from a seeded stream.  Later turns
are closed-loop, ``think_s`` (default 30 s — ASSUMPTION) after the previous answer.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.config.files import read_text
from kvsim.config.units import format_bytes
from kvsim.errors import InputError
from kvsim.workload.importers import as_int, as_time, open_text
from kvsim.workload.schema import Session, TraceMeta, Turn

CHARS_PER_TOKEN = 4
USER = {"human", "user"}
ASSISTANT = {"gpt", "assistant", "chatgpt", "bard", "model"}
TOOL = {"tool", "function", "observation", "ipython"}


def estimate_tokens(text: str) -> int:
    """``ceil(len(text) / 4)``, the documented estimate (0 for empty text)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


# NOTE: the importer holds the whole file parsed (a JSON array cannot be read in parts):
# ≈ 2.3x its size on top of the interpreter (a 76 MB file peaked at 247 MiB); a larger
# file is refused with a one-line message naming this bound
SHAREGPT_MAX_BYTES = 256 * 2**20


def _load(p: Path) -> list[tuple[str, Any]]:
    size = p.stat().st_size
    if size > SHAREGPT_MAX_BYTES:
        raise InputError(p.name, format_bytes(size), f"at most "
                         f"{format_bytes(SHAREGPT_MAX_BYTES)} in one ShareGPT import (it "
                         "holds the file parsed); split it into smaller files")
    text = read_text(p, p.name)
    if not text.strip():
        raise InputError(p.name, "", "empty file — no conversations")
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{p.name} line {exc.lineno}", exc.doc[exc.pos:exc.pos + 40],
                             f"not valid JSON ({exc.msg})") from None
        return [(f"{p.name} conversation {k}", c) for k, c in enumerate(data)]
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((f"{p.name} line {lineno}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise InputError(f"{p.name} line {lineno}", line.strip()[:40],
                                 f"not valid JSON ({exc.msg})") from None
    return out


def _messages(conv: Any, where: str) -> list[Any]:
    if isinstance(conv, dict):
        for key in ("conversations", "messages", "conversation"):
            if isinstance(conv.get(key), list):
                return conv[key]
    raise InputError(f"{where}: conversations", type(conv).__name__,
                     "expected an object with a 'conversations' or 'messages' list")


def _message(msg: Any, where: str) -> tuple[str, int]:
    if not isinstance(msg, dict):
        raise InputError(where, msg, "a message must be an object")
    role = str(msg.get("from", msg.get("role", ""))).lower()
    if role not in USER | ASSISTANT | TOOL | {"system"}:
        raise InputError(f"{where}: from", role, "one of human, gpt, system, tool (or aliases)")
    for key in ("tokens", "num_tokens"):
        if key in msg:
            return role, as_int(msg[key], where, key, 0)
    text = msg.get("value", msg.get("content", ""))
    if not isinstance(text, str):
        raise InputError(f"{where}: value", text, "message text must be a string")
    return role, estimate_tokens(text)


def _session_parts(conv: Any, where: str) -> tuple[str | None, int, list[tuple[int, int, int]]]:
    """(system_prompt_id, system tokens, [(tool, input, output) per turn])."""
    sys_tokens, sys_text, turns = 0, "", []
    tool = inp = 0
    for m, msg in enumerate(_messages(conv, where)):
        role, n = _message(msg, f"{where}: conversations.{m}")
        if role == "system":
            sys_tokens += n
            sys_text += str(msg.get("value", msg.get("content", ""))) + str(n)
        elif role in TOOL:
            tool += n
        elif role in USER:
            inp += n
        elif tool or inp:  # assistant answer closes the turn
            turns.append((tool, inp, max(1, n)))
            tool = inp = 0
    sys_id = None
    if sys_tokens:
        sys_id = "sg-" + hashlib.sha1(sys_text.encode("utf-8")).hexdigest()[:12]
    return sys_id, sys_tokens, turns


def import_sharegpt(path: str | Path, session_rate_per_s: float = 1 / 300, think_s: float = 30.0,
                    seed: int = 0) -> tuple[TraceMeta, Iterator[Session]]:
    """ShareGPT-style JSON/JSONL → sessions sorted by arrival (see module docstring)."""
    p = open_text(path)
    convs = _load(p)
    if not convs:
        raise InputError(p.name, "", "no conversations")
    stamps = [c.get("timestamp") if isinstance(c, dict) else None for _, c in convs]
    if all(s is not None for s in stamps):
        starts = [as_time(s, w, "timestamp") for s, (w, _) in zip(stamps, convs)]
        t0 = min(starts)
        starts = [s - t0 for s in starts]
    else:
        gaps = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,))).exponential(
            1.0 / session_rate_per_s, size=len(convs))
        starts = list(np.cumsum(gaps) - gaps[0])
    sessions = []
    for k, ((where, conv), start) in enumerate(zip(convs, starts)):
        sys_id, sys_tokens, parts = _session_parts(conv, where)
        if not parts:
            continue
        cid = str(conv.get("id", k)) if isinstance(conv, dict) else str(k)
        turns = tuple(Turn(start_s=float(start) if i == 0 else None,
                           think_s=0.0 if i == 0 else think_s,
                           tool_tokens=tool, input_tokens=inp, output_tokens=out)
                      for i, (tool, inp, out) in enumerate(parts))
        sessions.append(Session(session_id=f"sg{k:06d}-{cid}", kind="imported", system_prompt_id=sys_id,
                                system_prompt_tokens=sys_tokens, turns=turns))
    if not sessions:
        raise InputError(p.name, "", "no conversation has a user message with an answer")
    sessions.sort(key=lambda s: (s.turns[0].start_s, s.session_id))
    meta = TraceMeta(source=f"sharegpt:{p.name}", seed=seed,
                     description="token counts estimated as ceil(chars/4) where not given")
    return meta, iter(sessions)
