"""Block states of the KV a session holds, keyed by content span (docs/reference/kv-policies.md
§6.2).

A token's identity is ``(segment id, offset)`` (kvsim.core.requests), so the state
of every token a policy touched is kept exactly as intervals per segment id:

====================  ==========  ===========  =================================
state                 GPU bytes   host copy    readable
====================  ==========  ===========  =================================
FULL (absent)         full        no           exact
FULL_BACKED           full        yes          exact (a promoted span)
QUANT(b)              b-bit       no           with error(b)
QUANT_BACKED(b)       b-bit       yes          with error, promotable by recall
OFFLOADED             0           yes          only after a recall over PCIe
DROPPED               0           no           never (the window moved past it)
====================  ==========  ===========  =================================

*Pinned* tokens — the first ``sink_tokens`` of a sequence, the system prompt and the
turn boundaries (the first ``boundary_tokens`` of every message: the chat template's
role header, §6.2 / §1.8) — are a property of the position, not a state: default
policies never demote or drop them, and a turn whose prompt lost one is scored
COLLAPSE (kvsim.metrics.accuracy).

NOTE: intervals of one segment never overlap; :meth:`Ledger.mark` splits and
replaces, so a span has exactly one state.  DROPPED is absorbing (only a new
recompute could revive it and window policies never recompute dropped spans).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from kvsim.core.requests import Piece, TokenSeq

FULL, FULL_BACKED, QUANT, QUANT_BACKED, OFFLOADED, DROPPED = (
    "FULL", "FULL_BACKED", "QUANT", "QUANT_BACKED", "OFFLOADED", "DROPPED")
ON_HOST = (FULL_BACKED, QUANT_BACKED, OFFLOADED)
GONE = (DROPPED, OFFLOADED)  # not in the sequence the model reads
# ASSUMPTION: a message starts with the chat template's role header; Llama-3's
# <|start_header_id|>role<|end_header_id|>\n\n is 4 tokens.
BOUNDARY_TOKENS = 4
_MESSAGE = re.compile(r"/t\d+/(in|tool|out)$")
Span = tuple[int, int, str, float]  # lo, hi, state, bits


class Ledger:
    """Exact per-segment interval map of non-FULL token states."""

    def __init__(self) -> None:
        self.spans: dict[str, list[Span]] = {}
        self.version = 0

    def mark(self, sid: str, lo: int, hi: int, state: str, bits: float = 16.0,
             only: Iterable[str] | None = None) -> int:
        """Set ``[lo, hi)`` of ``sid`` to ``state``; with ``only``, just the parts whose
        current state is in ``only``.  Returns the number of tokens changed."""
        if hi <= lo:
            return 0
        allowed = set(only) if only is not None else None
        changed = 0
        out: list[Span] = []
        for a, b, st, bt in self.iter_states(sid, lo, hi):
            if allowed is None or st in allowed:
                out.append((a, b, state, bits))
                changed += b - a if st != state else 0
            else:
                out.append((a, b, st, bt))
        if not changed:
            return 0
        keep = [s for s in self.spans.get(sid, []) if s[1] <= lo or s[0] >= hi]
        cut = [s for s in self.spans.get(sid, []) if not (s[1] <= lo or s[0] >= hi)]
        for a, b, st, bt in cut:  # the parts of overlapping spans outside [lo, hi)
            if a < lo:
                keep.append((a, lo, st, bt))
            if b > hi:
                keep.append((hi, b, st, bt))
        keep.extend(s for s in out if s[2] != FULL)
        merged: list[Span] = []
        for span in sorted(keep):  # NOTE: adjacent runs of one state merge: maps stay small
            if merged and merged[-1][1] == span[0] and merged[-1][2:] == span[2:]:
                merged[-1] = (merged[-1][0], span[1], span[2], span[3])
            else:
                merged.append(span)
        self.spans[sid] = merged
        self.version += 1
        return changed

    def iter_states(self, sid: str, lo: int, hi: int) -> list[Span]:
        """``[lo, hi)`` of ``sid`` cut into runs of one state (FULL where unmarked)."""
        out: list[Span] = []
        pos = lo
        for a, b, st, bt in self.spans.get(sid, ()):
            if b <= lo or a >= hi:
                continue
            if a > pos:
                out.append((pos, a, FULL, 16.0))
            out.append((max(a, lo), min(b, hi), st, bt))
            pos = min(b, hi)
        if pos < hi:
            out.append((pos, hi, FULL, 16.0))
        return out

    def count(self, seq: Iterable[Piece], states: tuple[str, ...]) -> int:
        """Tokens of ``seq`` whose state is one of ``states``."""
        n = 0
        for sid, s, e in seq:
            for a, b, st, _ in self.spans.get(sid, ()):
                if st in states:
                    n += max(0, min(b, e) - max(a, s))
        return n

    def dropped_ranges(self) -> dict[str, list[tuple[int, int]]]:
        """Spans no longer in the sequence the model sees (DROPPED or OFFLOADED)."""
        return {sid: [(a, b) for a, b, st, _ in v if st in (DROPPED, OFFLOADED)]
                for sid, v in self.spans.items()
                if any(st in (DROPPED, OFFLOADED) for _, _, st, _ in v)}


def seq_remove(seq: TokenSeq, ranges: dict[str, list[tuple[int, int]]]) -> TokenSeq:
    """``seq`` without the tokens of ``ranges`` (per segment id, content offsets)."""
    if not ranges:
        return seq
    out: list[Piece] = []
    for sid, s, e in seq:
        cuts = sorted(r for r in ranges.get(sid, ()) if r[1] > s and r[0] < e)
        pos = s
        for a, b in cuts:
            if a > pos:
                out.append((sid, pos, a))
            pos = max(pos, b)
        if pos < e:
            out.append((sid, pos, e))
    return tuple(out)


def locate(seq: TokenSeq, sid: str, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """Where content ``[lo, hi)`` of ``sid`` sits in ``seq``: ``(position, lo, hi)`` runs."""
    out = []
    pos = 0
    for psid, s, e in seq:
        if psid == sid and e > lo and s < hi:
            a, b = max(s, lo), min(e, hi)
            out.append((pos + a - s, a, b))
        pos += e - s
    return out


def pinned_len(seq: TokenSeq, sink_tokens: int, pin_system_prompt: bool) -> int:
    """Leading tokens that are pinned: the sinks, and the system prompt when pinned (every
    leading ``sys/`` piece: a session's shared prefix and its system prompt)."""
    n = sink_tokens
    if pin_system_prompt:
        head = 0
        for sid, a, b in seq:
            if not sid.startswith("sys/"):
                break
            head += b - a
        n = max(n, head)
    return n


def session_references(s: Any) -> dict[tuple[str, int], list[tuple[str, int, int, str]]]:
    """A session's reference spans per ``(session, turn)`` as ``(segment id, lo, hi,
    content)``.  (The pinned head is the prompt's as sent: kvsim.policies.recall.)"""
    sid = s.session_id
    refs = {}
    for i, t in enumerate(s.turns):
        spans = [(_span_segment(s, r), r.offset_tokens, r.offset_tokens + r.length_tokens,
                  r.content) for r in t.references]
        if spans:
            refs[(sid, i)] = spans
    return refs


def _span_segment(s: Any, r: Any) -> str:
    """The segment id holding a reference's span (kvsim.workload.schema naming)."""
    if r.turn is None or r.part == "system":
        return f"sys/{s.system_prompt_id}"
    if r.part == "prefix":
        pre = s.turns[r.turn].prefix
        return pre[0].id if pre else f"{s.session_id}/t{r.turn}/in"
    part = {"input": "in", "tool": "tool", "output": "out"}[r.part]
    return f"{s.session_id}/t{r.turn}/{part}"


def is_message(sid: str) -> bool:
    """Whether segment ``sid`` is a turn's message (input, tool result or answer)."""
    return _MESSAGE.search(sid) is not None


def unpinned(pieces: Iterable[tuple[str, int, int]], boundary_tokens: int
             ) -> list[tuple[str, int, int]]:
    """``pieces`` without the first ``boundary_tokens`` of every message (turn boundaries)."""
    if boundary_tokens <= 0:
        return list(pieces)
    out = []
    for sid, a, b in pieces:
        if a < boundary_tokens and is_message(sid):
            a = min(b, boundary_tokens)
        if a < b:
            out.append((sid, a, b))
    return out


def lost_boundary(led: Ledger, seq: TokenSeq) -> bool:
    """A message of ``seq`` whose opening token a policy dropped (or offloaded) while
    later tokens of it are still read: the structure the model relies on is broken."""
    for sid, s, _ in seq:
        if s > 0 and is_message(sid) and any(
                st in GONE for _, _, st, _ in led.iter_states(sid, 0, 1)):
            return True
    return False
