"""How a session's turns reach the engine: prompts, requests, and what a failure does.

Turn ``i`` is sent with the whole history of its *chat* as the prompt (system prompt, every
earlier turn of the chat, then its own content), or only its own content for ``history:
none``. After a failure the client follows the workload's ``after_failure`` rule
(:class:`~kvsim.config.workload.WorkloadConfig`): ``new_chat`` (default), ``end_session`` or
``continue``. A failure counts when seen: a request of the current chat failed by the time
the next turn is sent.

NOTE: the rule applies to ``history: full`` sessions only.
NOTE: the engine (:mod:`kvsim.core.engine`) and ``kvsim replay`` (:mod:`kvsim.calibrate.replay`)
both drive sessions through :class:`SessionChat`, so measured and predicted runs send the
same turns.
Design: docs/design/sim-engine.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kvsim.config.workload import AfterFailure
from kvsim.core.requests import Request, TokenSeq, seq_from_segments
from kvsim.metrics.records import NEW_CHAT_EVENT
from kvsim.workload.schema import (
    Segment,
    Session,
    output_segment,
    prompt_segments,
    system_segments,
    turn_segment_id,
    turn_segments,
)


def _seq(segs: Iterable[Segment]) -> TokenSeq:
    return seq_from_segments([(g.id, g.tokens) for g in segs])


def chat_segments(session: Session, i: int, start: int = 0) -> list[Segment]:
    """Turn ``i``'s prompt segments when its chat began at turn ``start``.

    ``start == 0`` is :func:`~kvsim.workload.schema.prompt_segments` itself.
    """
    if start == 0 or session.history != "full":
        return prompt_segments(session, i)
    segs = system_segments(session)
    for j in range(start, i):
        segs.extend(turn_segments(session, j))
        segs.append(output_segment(session, j))
    segs.extend(turn_segments(session, i))
    return segs


def _turn_pieces(session: Session, i: int) -> TokenSeq:
    """``_seq(turn_segments(session, i))`` without building the pydantic segments.

    NOTE: the same ids as :func:`~kvsim.workload.schema.turn_segments` (its prefix, then
    :func:`~kvsim.workload.schema.turn_segment_id`); empty ones are left out as ``_seq`` does."""
    t = session.turns[i]
    sid = session.session_id
    out = [(g.id, 0, g.tokens) for g in t.prefix if g.tokens > 0]
    if t.tool_tokens > 0:
        out.append((turn_segment_id(sid, i, "tool"), 0, t.tool_tokens))
    if t.input_tokens > 0:
        out.append((turn_segment_id(sid, i, "in"), 0, t.input_tokens))
    return tuple(out)


def make_request(session: Session, i: int, now_s: float,
                 prompt: TokenSeq | None = None) -> Request:
    """Turn ``i`` of ``session`` arriving at ``now_s`` (``prompt``: see session_prompts)."""
    turn = session.turns[i]
    if prompt is None:
        prompt = _seq(prompt_segments(session, i))
    sid = session.session_id
    # NOTE: output_segment(session, i).id, without building the segment
    return Request(request_id=f"{sid}#{i}", session_id=sid, turn=i, arrival_s=now_s,
                   prompt=prompt, output_id=turn_segment_id(sid, i, "out"),
                   max_output_tokens=turn.output_tokens, member=session.member,
                   kind=session.kind)


def session_prompts(session: Session) -> Iterator[TokenSeq]:
    """Each turn's prompt, equal to ``prompt_segments`` but built incrementally
    (one chat from the first turn to the last: the ``continue`` rule)."""
    chat = SessionChat(session, "continue")
    for i in range(len(session.turns)):
        yield chat.prompt(i)


def request_outcome(req: Request, now_s: float) -> str | None:
    """What the client knows of ``req`` at ``now_s``: None while it runs, ``""`` when it
    finished, else its failure reason (:class:`SessionChat`'s ``outcome``)."""
    if not req.done or req.finish_s > now_s:
        return None
    return req.failure_reason


def seed_block_hashes(req: Request, before: Request | None) -> None:
    """Start ``req``'s prefix-hash chain with the previous turn's, when its prompt
    begins with that turn's whole token sequence (prompt + answer).

    NOTE: a block's chained hash depends only on the pieces of the tokens up to its
    end, so the previous turn's full-block hashes are this prompt's first ones.
    """
    if before is None or not before.block_hashes:
        return
    head = before.all_tokens()
    if req.prompt[:len(head)] == head:
        req.block_hashes = list(before.block_hashes)


class SessionChat:
    """One session's conversation state under an ``after_failure`` rule.

    ``outcome(handle, now_s)`` tells what became of a sent turn by ``now_s``: None
    while it runs, ``""`` when it finished, else its failure reason.  The caller
    reports each turn it sends (:meth:`sent`), asks before sending the next one
    (:meth:`begin`; ``opened`` then names the failure a new chat follows) and builds
    its prompt (:meth:`prompt` or :meth:`segments`).

    NOTE: ``start`` is the turn that began the current chat; every turn sent since
    belongs to it, and only their failures (``failure``) restart or end the session.
    """

    def __init__(self, session: Session, rule: AfterFailure = "new_chat",
                 outcome: Callable[[Any, float], str | None] | None = None) -> None:
        self.session = session
        self.rule = rule if session.history == "full" else "continue"
        self.outcome = outcome
        self.start = 0
        self.new_chats = 0
        self.abandoned: range = range(0)  # turns dropped by end_session
        self.failure: tuple[str, str] | None = None  # (request id, reason) seen in this chat
        self.opened: tuple[str, str] | None = None  # the turn begun last opened a new chat
        self._pending: list[tuple[int, str, Any]] = []
        self._head = _seq(system_segments(session))
        self._sys = self._head

    def sent(self, i: int, handle: Any) -> None:
        """Turn ``i`` went out; ``handle`` is what ``outcome`` reads."""
        if self.rule != "continue":
            self._pending.append((i, f"{self.session.session_id}#{i}", handle))

    def poll(self, now_s: float) -> bool:
        """Note the current chat's failures seen by ``now_s``; True when the session
        ends here (``end_session`` after a failure)."""
        if self._pending and self.outcome is not None:
            still = []
            for i, rid, handle in self._pending:
                why = self.outcome(handle, now_s)
                if why is None:
                    still.append((i, rid, handle))
                elif why and i >= self.start and self.failure is None:
                    self.failure = (rid, why)
            self._pending = still
        return self.failure is not None and self.rule == "end_session"

    def begin(self, i: int, now_s: float) -> bool:
        """Turn ``i`` is about to be sent: False when the session ends before it (turns
        ``i..`` are then ``abandoned``); a failure seen under ``new_chat`` makes ``i``
        the first turn of a new chat."""
        self.opened = None
        if self.poll(now_s):
            self.abandoned = range(i, len(self.session.turns))
            return False
        if self.failure is not None:  # NOTE: only new_chat gets here with a failure
            self.start, self._head = i, self._sys
            self.new_chats += 1
            self.opened, self.failure = self.failure, None
        return True

    def notes(self, kind: str) -> list[tuple[str, str]]:
        """``(request id, detail)`` of the events for the turn that opened a new chat
        (``NEW_CHAT_EVENT``) or for each turn an ended session dropped (``ABANDON_EVENT``)."""
        sid = self.session.session_id
        if kind == NEW_CHAT_EVENT:
            rid, why = self.opened or ("", "")
            return [(f"{sid}#{self.start}", f"after {rid} failed: {why}")]
        rid, why = self.failure or ("", "")
        return [(f"{sid}#{j}", f"session ended after {rid} failed: {why}")
                for j in self.abandoned]

    def prompt(self, i: int) -> TokenSeq:
        """Turn ``i``'s prompt in the current chat, built incrementally (call once per
        turn, in order).

        NOTE: ``prompt_segments(s, i)`` rebuilds the whole history (O(i) pydantic
        segments) for every turn; here turn ``i`` adds only its own segments and the
        previous answer.
        """
        out = self._head + _turn_pieces(self.session, i)  # NOTE: pieces concatenate
        if self.session.history == "full":
            n = self.session.turns[i].output_tokens  # NOTE: > 0 (the schema's rule)
            self._head = out + ((turn_segment_id(self.session.session_id, i, "out"), 0, n),)
        return out

    def segments(self, i: int) -> list[Segment]:
        """Turn ``i``'s prompt segments in the current chat."""
        return chat_segments(self.session, i, self.start)
