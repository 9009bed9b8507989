"""Trace schema: sessions → turns → reference events (pydantic-validated).

A *session* is one conversation (or one agent run, or one imported request).  Its
turns arrive closed-loop: the first at ``start_s``, every later one ``think_s``
after the previous answer ended — or, for open-loop imports, at its own
``start_s``.  The prompt of turn *i* is the session's whole history (system
prompt, every earlier turn's tool output, input and answer) plus turn *i*'s new
tool output and input, unless the session is ``history: none`` (independent
requests that share only explicit ``prefix`` segments, as in Mooncake traces).
A session's ``shared_prefix`` opens every one of its prompts, before the system prompt:
a list of system segments several sessions may share in part (a BOS token every session
starts with, then a preamble some personas share, then each persona's own system prompt).

Token *identity* matters for prefix reuse, so a prompt is described as a list of
:class:`Segment` (a content id and a length): two prompts share a KV prefix
exactly as far as their segment lists agree token by token.

A :class:`ReferenceEvent` says "this turn depends on that earlier span": the
accuracy proxy scores it from the state of the KV blocks holding the span.

NOTE: segment ids are deterministic strings — ``sys/<id>`` (the system prompt and each
``shared_prefix`` segment), ``<session>/t<i>/tool``, ``<session>/t<i>/in``,
``<session>/t<i>/out`` — so the same trace always yields the same prefix-hash chain;
every ``sys/`` segment is system content (kept when a prompt is fitted, sent as the
system message by ``kvsim replay``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from kvsim.config.units import FrozenModel
from kvsim.errors import InputError

_FROZEN = ConfigDict(frozen=True, extra="forbid")
SCHEMA_VERSION = 1
SpanPart = Literal["system", "prefix", "tool", "input", "output"]
SessionKind = Literal["chat", "homework", "agent", "voice", "document", "imported"]


class Segment(FrozenModel):
    """A run of tokens with one content identity."""

    model_config = _FROZEN
    id: str = Field(min_length=1)
    tokens: int = Field(gt=0)


class ReferenceEvent(FrozenModel):
    """The turn that carries this event depends on a span of earlier content."""

    model_config = _FROZEN
    turn: int | None = Field(None, ge=0, description="earlier turn index; None = system prompt")
    part: SpanPart = "input"
    offset_tokens: int = Field(0, ge=0, description="start of the span within that part")
    length_tokens: int = Field(gt=0)
    content: Literal["exact", "gist"] = "exact"


class Turn(FrozenModel):
    model_config = _FROZEN
    start_s: float | None = Field(None, ge=0, description="absolute arrival (first/open-loop)")
    think_s: float = Field(0.0, ge=0, description="delay after the previous answer ended")
    prefix: tuple[Segment, ...] = Field((), description="shared content before this turn's input")
    tool_tokens: int = Field(0, ge=0, description="tool output appended before the input")
    input_tokens: int = Field(ge=0, description="new user tokens")
    output_tokens: int = Field(gt=0, description="tokens the model answers with")
    references: tuple[ReferenceEvent, ...] = ()


class Session(FrozenModel):
    model_config = _FROZEN
    session_id: str = Field(min_length=1)
    kind: SessionKind = "chat"
    member: str = ""
    shared_prefix: tuple[Segment, ...] = Field(
        (), description="system segments every prompt of the session opens with, before "
        "its system prompt (ids are content: sessions that list the same ids share them)")
    system_prompt_id: str | None = None
    system_prompt_tokens: int = Field(0, ge=0)
    history: Literal["full", "none"] = Field("full", description=(
        "full: a turn's prompt holds its chat so far; none: each turn is an independent "
        "request with its own content only, sent at its start_s (open loop) or think_s "
        "after the previous answer (a closed loop, as a benchmark client at a fixed "
        "concurrency sends them)"))
    turns: tuple[Turn, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Session:
        if self.turns[0].start_s is None:
            raise InputError("turns.0.start_s", None, "the first turn needs start_s")
        if (self.system_prompt_id is None) != (self.system_prompt_tokens == 0):
            raise InputError("system_prompt_tokens", self.system_prompt_tokens,
                             "goes with system_prompt_id: give both or neither")
        last_start, last_i = self.turns[0].start_s, 0
        for i, turn in enumerate(self.turns):
            for k, ref in enumerate(turn.references):
                _check_reference(self, i, k, ref)
            if turn.start_s is not None:
                if turn.start_s < last_start:
                    raise InputError(f"turns.{i}.start_s", turn.start_s,
                                     f"not before turn {last_i}'s start_s ({last_start}): "
                                     "a session's turns arrive in order")
                last_start, last_i = turn.start_s, i
        return self

    @model_serializer(mode="wrap")
    def _drop_empty_prefix(self, handler: SerializerFunctionWrapHandler) -> Any:
        """NOTE: a session without ``shared_prefix`` is written as before the key
        existed (traces and their hashes unchanged)."""
        out = handler(self)
        if isinstance(out, dict) and not out.get("shared_prefix"):
            out.pop("shared_prefix", None)
        return out


def _part_tokens(session: Session, ref: ReferenceEvent) -> int:
    """Length of the span a reference points into."""
    if ref.turn is None or ref.part == "system":
        return session.system_prompt_tokens
    t = session.turns[ref.turn]
    return {"prefix": sum(p.tokens for p in t.prefix), "tool": t.tool_tokens,
            "input": t.input_tokens, "output": t.output_tokens}[ref.part]


def _check_reference(session: Session, i: int, k: int, ref: ReferenceEvent) -> None:
    where = f"turns.{i}.references.{k}"
    if ref.turn is not None and ref.turn > i:
        raise InputError(f"{where}.turn", ref.turn, f"at most {i}: a turn refers to itself "
                         "or an earlier turn")
    if ref.turn is None and ref.part == "system" and not session.system_prompt_tokens:
        raise InputError(f"{where}.part", "system", "the session has no system prompt")
    size = _part_tokens(session, ref)
    if ref.offset_tokens + ref.length_tokens > size:
        raise InputError(f"{where}.offset_tokens", ref.offset_tokens,
                         f"offset_tokens + length_tokens ({ref.length_tokens}) must be at most "
                         f"the {size} tokens of the {ref.part} it refers to")


class TraceMeta(FrozenModel):
    model_config = _FROZEN
    source: str = "generated"
    description: str = ""
    seed: int | None = Field(None, ge=0)
    schema_version: int = Field(SCHEMA_VERSION, description="trace format version")

    @model_validator(mode="after")
    def _version(self) -> TraceMeta:
        if self.schema_version != SCHEMA_VERSION:
            raise InputError("schema_version", self.schema_version,
                             f"{SCHEMA_VERSION}: the only trace schema this kvsim reads")
        return self


def turn_segment_id(session_id: str, i: int, part: str) -> str:
    """The id of turn *i*'s ``part`` segment (``tool``, ``in`` or ``out``; module doc)."""
    return f"{session_id}/t{i}/{part}"


def turn_segments(session: Session, i: int) -> list[Segment]:
    """The new content turn *i* appends: its prefix, tool output and input."""
    t = session.turns[i]
    sid = session.session_id
    segs = list(t.prefix)
    if t.tool_tokens:
        segs.append(Segment(id=turn_segment_id(sid, i, "tool"), tokens=t.tool_tokens))
    if t.input_tokens:
        segs.append(Segment(id=turn_segment_id(sid, i, "in"), tokens=t.input_tokens))
    return segs


def system_segments(session: Session) -> list[Segment]:
    """The system content every prompt of ``session`` opens with: its ``shared_prefix``,
    then its system prompt (each as a ``sys/<id>`` segment; empty when it has neither)."""
    segs = [Segment(id=f"sys/{g.id}", tokens=g.tokens) for g in session.shared_prefix]
    if session.system_prompt_id is not None:
        segs.append(Segment(id=f"sys/{session.system_prompt_id}",
                            tokens=session.system_prompt_tokens))
    return segs


def prompt_segments(session: Session, i: int) -> list[Segment]:
    """Every segment of turn *i*'s prompt, in order (history included)."""
    segs = system_segments(session)
    first = 0 if session.history == "full" else i
    for j in range(first, i):
        segs.extend(turn_segments(session, j))
        segs.append(output_segment(session, j))
    segs.extend(turn_segments(session, i))
    return segs


def output_segment(session: Session, i: int) -> Segment:
    return Segment(id=turn_segment_id(session.session_id, i, "out"),
                   tokens=session.turns[i].output_tokens)


def iter_turns(sessions: list[Session]) -> Iterator[tuple[Session, int]]:
    for s in sessions:
        for i in range(len(s.turns)):
            yield s, i
