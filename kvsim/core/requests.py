"""Requests and token identity: what the engine schedules and what the KV holds.

A *request* is one turn of a session.  Its prompt is a :data:`TokenSeq` — a tuple
of pieces ``(content_id, start, end)`` — so two sequences share a KV prefix exactly
as far as their pieces agree token by token (``prompt_segments`` in the trace
schema gives segment ids; a token's identity is ``(segment id, offset)``).  Pieces
(rather than whole segments) let a sequence hold a *slice* of a segment, which is
what remains after a llama.cpp context shift or a truncated answer.

Progress follows vLLM v1: ``num_computed_tokens`` chases ``num_tokens`` (prompt +
sampled output).  A step that brings the two level samples one token; the last
sampled token is never decoded into the KV, so a finished request's KV holds
``prompt + output − 1`` tokens (llama.cpp reuses exactly that many on the next
turn, docs/reference/engines.md §3.4).

NOTE: requests are plain mutable state owned by one scheduler; everything crossing
module boundaries (plans, snapshots) is a frozen value type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from kvsim.core.itl import GapRuns, token_gap

Piece = tuple[str, int, int]
TokenSeq = tuple[Piece, ...]


def seq_from_segments(segments: list[tuple[str, int]]) -> TokenSeq:
    """``[(segment id, tokens), ...]`` → a token sequence of whole segments."""
    return tuple((sid, 0, n) for sid, n in segments if n > 0)


def seq_len(seq: TokenSeq) -> int:
    return sum(e - s for _, s, e in seq)


def common_prefix(a: TokenSeq, b: TokenSeq) -> int:
    """Number of leading tokens two sequences share (token-exact)."""
    n = 0
    for (ia, sa, ea), (ib, sb, eb) in zip(a, b):
        if ia != ib or sa != sb:
            return n
        n += min(ea, eb) - sa
        if ea != eb:
            return n
    return n


def seq_head(seq: TokenSeq, n: int) -> TokenSeq:
    """The first ``n`` tokens of ``seq``."""
    out: list[Piece] = []
    left = n
    for sid, s, e in seq:
        if left <= 0:
            break
        take = min(e - s, left)
        out.append((sid, s, s + take))
        left -= take
    return tuple(out)


def seq_drop(seq: TokenSeq, start: int, end: int) -> TokenSeq:
    """``seq`` without tokens ``[start, end)`` (a context shift / prompt truncation)."""
    head = seq_head(seq, start)
    tail: list[Piece] = []
    pos = 0
    for sid, s, e in seq:
        n = e - s
        lo = max(end - pos, 0)
        if lo < n:
            tail.append((sid, s + lo, e))
        pos += n
    return head + tuple(tail)


def fit_chat_prompt(seq: TokenSeq, limit: int, keep: int) -> tuple[TokenSeq, int, int]:
    """Ollama's fit of a chat prompt into ``limit`` tokens (docs/reference/engines.md §4.5):
    ``(prompt, tokens of dropped messages, tokens truncated)``.

    Messages (a piece each: a system prompt, a turn's input or tool output, an answer)
    are dropped oldest first, always keeping the system messages and the latest one,
    until the prompt fits; a prompt still too long keeps its first ``keep`` tokens and
    drops the oldest after them.
    """
    total = seq_len(seq)
    drop: set[int] = set()
    dropped = 0
    for i, (sid, s, e) in enumerate(seq[:-1]):
        if total - dropped <= limit:
            break
        if not sid.startswith("sys/"):
            drop.add(i)
            dropped += e - s
    fitted = tuple(p for i, p in enumerate(seq) if i not in drop)
    excess = total - dropped - limit
    if excess > 0:
        fitted = seq_drop(fitted, keep, keep + excess)
    return fitted, dropped, max(excess, 0)


def seq_append(seq: list[Piece], sid: str, start: int, end: int) -> None:
    """Append ``(sid, start, end)`` in place, merging with a contiguous last piece."""
    if seq and seq[-1][0] == sid and seq[-1][2] == start:
        seq[-1] = (sid, seq[-1][1], end)
    else:
        seq.append((sid, start, end))


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(eq=False, slots=True)
class Request:
    """One turn of one session as the engine sees it (mutable, scheduler-owned)."""

    request_id: str
    session_id: str
    turn: int
    arrival_s: float
    prompt: TokenSeq
    output_id: str
    max_output_tokens: int
    member: str = ""
    kind: str = ""
    prompt_tokens: int = 0
    # progress
    status: Status = Status.WAITING
    num_computed_tokens: int = 0
    num_output: int = 0
    high_water: int = 0  # most tokens ever held in KV (recompute accounting)
    output_start: int = 0  # offset of the next generated token within output_id
    # metrics
    first_scheduled_s: float = float("nan")
    first_token_s: float = float("nan")
    last_token_s: float = float("nan")
    finish_s: float = float("nan")
    cached_tokens: int = 0
    computed_prompt_tokens: int = 0
    recomputed_tokens: int = 0
    preemptions: int = 0
    # NOTE: the engine's own cut of the context (llama.cpp's response flag, §3.4): the
    # prompt truncated to fit (Ollama, §4.5), a context shift, or a stop at the slot end
    truncated: bool = False
    truncated_prompt_tokens: int = 0  # prompt tokens the engine dropped to fit its context
    failure_reason: str = ""
    itl: GapRuns = field(default_factory=GapRuns)  # affine runs of gaps (kvsim.core.itl)
    block_hashes: list[int] = field(default_factory=list)  # paged: chained full-block keys
    slot_id: int = -1  # slot engines: the slot serving this request

    def __post_init__(self) -> None:
        if not self.prompt_tokens:
            self.prompt_tokens = seq_len(self.prompt)

    @property
    def sent_prompt_tokens(self) -> int:
        """The prompt as it reached the engine, before the engine truncated it to fit
        (``prompt_tokens`` is what it kept; a KV policy's own evictions, made before
        this, are not counted: :mod:`kvsim.policies`)."""
        return self.prompt_tokens + self.truncated_prompt_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt plus every sampled output token."""
        return self.prompt_tokens + self.num_output

    @property
    def remaining_tokens(self) -> int:
        """Tokens still to compute before the next sample."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decode(self) -> bool:
        return self.num_output > 0 and self.remaining_tokens == 1

    @property
    def done(self) -> bool:
        return self.status in (Status.FINISHED, Status.FAILED)

    def all_tokens(self) -> TokenSeq:
        """Prompt + sampled output as a token sequence."""
        if not self.num_output:
            return self.prompt
        return self.prompt + ((self.output_id, 0, self.num_output),)

    def record_compute(self, n: int) -> None:
        """Account ``n`` newly computed tokens starting at ``num_computed_tokens``."""
        a = self.num_computed_tokens
        b = a + n
        if a >= self.high_water and a >= self.prompt_tokens:  # plain decode (hot path)
            self.num_computed_tokens = self.high_water = b
            return
        self.recomputed_tokens += max(0, min(b, self.high_water) - a)
        self.computed_prompt_tokens += max(0, min(b, self.prompt_tokens) - a)
        self.num_computed_tokens = b
        self.high_water = max(self.high_water, b)

    def sample(self, now_s: float, dt_s: float = math.nan) -> None:
        """One output token is emitted at ``now_s`` by a step of ``dt_s`` seconds."""
        if self.num_output == 0:
            self.first_token_s = now_s
        else:
            self.itl.add(token_gap(now_s, self.last_token_s, dt_s))
        self.last_token_s = now_s
        self.num_output += 1

    def finish(self, now_s: float, truncated: bool = False) -> None:
        self.status = Status.FINISHED
        self.finish_s = now_s
        self.truncated = self.truncated or truncated

    def fail(self, now_s: float, reason: str) -> None:
        self.status = Status.FAILED
        self.finish_s = now_s
        self.failure_reason = reason

    def preempt(self) -> None:
        """Recompute preemption: the KV is gone, progress restarts from zero."""
        self.num_computed_tokens = 0
        self.preemptions += 1
        self.status = Status.WAITING
