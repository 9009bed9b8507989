"""Trace statistics without a simulator: sizes, arrivals, concurrency, reuse, references.

Service model (stated in every result): each request is busy from its arrival for
``prompt_tokens / prefill_tok_s + output_tokens / decode_tok_s`` seconds on an infinite
server (no queueing, batching or cache); closed-loop turns arrive ``think_s`` after the
previous one finished under that model, open-loop turns at ``start_s``.

NOTE: the default rates are an ASSUMPTION (about half an RTX 4070's bound for an 8B model at
4-bit); input tokens are whole prompts, prefix reuse is token-exact over :func:`prompt_segments`.
Design: docs/design/workload-inspect.md (every statistic's definition).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvsim.errors import InputError
from kvsim.metrics.summary import PERCENTILE_METHOD
from kvsim.workload.schema import Segment, Session, output_segment, prompt_segments
from kvsim.workload.tally import Counts, Overlap, PerMinute

_PART_SUFFIX = {"tool": "tool", "input": "in", "output": "out"}


@dataclass(frozen=True)
class ServiceModel:
    prefill_tok_s: float = 2000.0
    decode_tok_s: float = 50.0

    def __post_init__(self) -> None:
        for name, v in asdict(self).items():
            if not v > 0:
                raise InputError(name, v, "must be > 0")

    def busy_s(self, prompt_tokens: int, output_tokens: int) -> float:
        return prompt_tokens / self.prefill_tok_s + output_tokens / self.decode_tok_s

    def describe(self) -> str:
        return (f"each request busy prompt/{self.prefill_tok_s:g} + output/"
                f"{self.decode_tok_s:g} tok/s from arrival; no queueing (infinite server)")


MAX_SHARED_CHAINS = 2_000_000  # NOTE: ≈ 100 bytes each; past it inspect stops (PrefixIndex)


class PrefixIndex:
    """Unlimited token-exact prefix cache over segment lists, in bounded memory.

    A chain that has passed content of one session's own (ids ``<session>/…``) only
    that session can meet again, so :meth:`insert` keeps it in the ``local`` store the
    caller passes (dropped with the session); the trace-wide store holds the shared
    chains only (system prompts, explicit prefixes) — at most :data:`MAX_SHARED_CHAINS`,
    else a one-line InputError naming the bound.

    NOTE: a chain is stored under one 64-bit hash of (the chain before it, its id): as
    the chain key itself already is, equal hashes are taken as equal chains.
    """

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}

    def insert(self, segs: Iterable[Segment], h: int = 0, matching: bool = True,
               local: dict[int, int] | None = None, own: str = "") -> tuple[int, int]:
        """Insert a token sequence after chain key ``h``; return (hit tokens, end key).
        With ``local``, chains from the first segment whose id starts with ``own`` on
        go there."""
        hit = 0
        store = self._seen
        for seg in segs:
            if local is not None and store is not local and seg.id.startswith(own):
                store = local
            key = hash((h, seg.id))
            cached = store.get(key, 0)
            if matching:
                hit += min(cached, seg.tokens)
                matching = cached >= seg.tokens
            if seg.tokens > cached:
                store[key] = seg.tokens
                if store is self._seen and len(store) > MAX_SHARED_CHAINS:
                    raise InputError("prefix_reuse", f"over {MAX_SHARED_CHAINS:,} shared "
                                     "prefix chains", f"at most {MAX_SHARED_CHAINS:,} (the "
                                     "trace-wide prefix index of trace inspect); inspect a "
                                     "sample (kvsim trace sample --sessions N)")
            h = hash((h, seg.id, seg.tokens))
        return hit, h


def _span_start(segs: list[Segment], target: str) -> int | None:
    pos = 0
    for seg in segs:
        if seg.id == target:
            return pos
        pos += seg.tokens
    return None


class _Acc:
    """Accumulates the statistics session by session (sessions sorted by first arrival)."""

    def __init__(self, service: ServiceModel) -> None:
        self.service = service
        self.tokens = {k: Counts() for k in ("prompt", "new", "output")}
        self.first, self.last = math.inf, -math.inf
        self.sessions = 0
        self.minutes: PerMinute | None = None
        self.requests = Overlap(self._request_level)
        self.live_sessions = Overlap(lambda t, level: None)
        self.kinds: Counter[str] = Counter()
        self.index = PrefixIndex()
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.requests_with_hit = 0
        self.refs: Counter[str] = Counter()
        self.ref_parts: Counter[str] = Counter()
        self.ref_turns = Counts()
        self.ref_tokens = Counts()

    def _request_level(self, t: float, level: int) -> None:
        assert self.minutes is not None
        self.minutes.level(t, level)

    def add(self, s: Session) -> None:
        start = s.turns[0].start_s or 0.0
        if self.minutes is None:
            self.minutes = PerMinute(start)
        self.requests.flush(before=start)  # NOTE: later sessions start at or after it
        self.live_sessions.flush(before=start)
        self.kinds[s.kind] += 1
        self.sessions += 1
        local: dict[int, int] = {}  # the chains only this session can meet (PrefixIndex)
        own = f"{s.session_id}/"
        end = 0.0
        for i, t in enumerate(s.turns):
            segs = prompt_segments(s, i)
            prompt = sum(g.tokens for g in segs)
            arrival = t.start_s if t.start_s is not None else end + t.think_s
            end = arrival + self.service.busy_s(prompt, t.output_tokens)
            self._request(arrival, end, prompt, prompt - self._history_tokens(s, i, segs),
                          t.output_tokens)
            hit, h = self.index.insert(segs, local=local, own=own)
            if s.history == "full":
                self.index.insert([output_segment(s, i)], h=h, matching=False, local=local,
                                  own=own)
            self.hit_tokens += hit
            self.requests_with_hit += hit > 0
            self._add_refs(s, i, segs, prompt)
        self.live_sessions.add(start, end)

    def _request(self, arrival: float, end: float, prompt: int, new: int, output: int) -> None:
        assert self.minutes is not None
        self.first, self.last = min(self.first, arrival), max(self.last, arrival)
        self.minutes.arrive(arrival)
        self.requests.add(arrival, end)
        for k, v in (("prompt", prompt), ("new", new), ("output", output)):
            self.tokens[k].add(v)
        self.prompt_tokens += prompt

    @staticmethod
    def _history_tokens(s: Session, i: int, segs: list[Segment]) -> int:
        own = {f"{s.session_id}/t{i}/tool", f"{s.session_id}/t{i}/in"}
        own.update(g.id for g in s.turns[i].prefix)
        return sum(g.tokens for g in segs if g.id not in own)

    def _add_refs(self, s: Session, i: int, segs: list[Segment], prompt: int) -> None:
        for ref in s.turns[i].references:
            self.refs[ref.content] += 1
            self.ref_parts[ref.part] += 1
            if ref.turn is None:
                target = f"sys/{s.system_prompt_id}"
            else:
                self.ref_turns.add(i - ref.turn)
                if ref.part in _PART_SUFFIX:
                    target = f"{s.session_id}/t{ref.turn}/{_PART_SUFFIX[ref.part]}"
                else:
                    prefix = s.turns[ref.turn].prefix
                    target = prefix[0].id if prefix else ""
            start = _span_start(segs, target)
            if start is not None:
                self.ref_tokens.add(prompt - start - ref.offset_tokens)


def inspect_sessions(sessions: Iterable[Session],
                     service: ServiceModel | None = None) -> dict[str, Any]:
    """Statistics of a trace as a plain dict (see the module docstring).

    NOTE: streams ``sessions`` (sorted by first ``start_s``, as every trace reader gives
    them) in memory that does not grow with the trace's length: besides the sessions
    whose requests are still open, one entry per distinct token count, 16 bytes a minute
    of span and the trace-wide prefix index (at most :data:`MAX_SHARED_CHAINS`).
    """
    acc = _Acc(service or ServiceModel())
    for s in sessions:
        acc.add(s)
    if acc.minutes is None:
        raise InputError("trace", "", "no sessions to inspect")
    peak = acc.requests.finish()
    per_minute, minute_peak = acc.minutes.arrays()
    span = acc.last - acc.first
    rows = acc.tokens["prompt"].total
    return {
        "rows": rows,
        "sessions": acc.sessions,
        "sessions_by_kind": dict(sorted(acc.kinds.items())),
        "first_arrival_s": acc.first,
        "span_s": span,
        "arrival_rate_per_s": (rows / span) if span > 0 else None,
        "input_tokens": acc.tokens["prompt"].summary(),
        "new_input_tokens": acc.tokens["new"].summary(),
        "output_tokens": acc.tokens["output"].summary(),
        "requests_per_minute": {"min": int(per_minute.min()),
                                "p50": float(np.percentile(per_minute, 50,
                                                           method=PERCENTILE_METHOD)),
                                "max": int(per_minute.max())},
        "concurrency": {
            "service_model": {**asdict(acc.service), "rule": acc.service.describe()},
            "peak_requests": peak,
            "per_minute_peak_requests": {
                "p50": float(np.percentile(minute_peak, 50, method=PERCENTILE_METHOD)),
                "p95": float(np.percentile(minute_peak, 95, method=PERCENTILE_METHOD)),
                "max": int(minute_peak.max())},
            "peak_sessions": acc.live_sessions.finish(),
        },
        "prefix_reuse": {"prompt_tokens": acc.prompt_tokens, "hit_tokens": acc.hit_tokens,
                         "fraction": (acc.hit_tokens / acc.prompt_tokens
                                      if acc.prompt_tokens else 0.0),
                         "requests_with_hit": acc.requests_with_hit},
        "references": {
            "total": sum(acc.refs.values()),
            "by_class": {k: acc.refs.get(k, 0) for k in ("exact", "gist")},
            "by_part": dict(sorted(acc.ref_parts.items())),
            "distance_turns": acc.ref_turns.summary(),
            "distance_tokens": acc.ref_tokens.summary(),
        },
    }
