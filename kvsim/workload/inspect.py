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

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvsim.errors import InputError
from kvsim.workload.schema import Segment, Session, output_segment, prompt_segments

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


class PrefixIndex:
    """Unlimited token-exact prefix cache over segment lists."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, str], int] = {}

    def insert(self, segs: Iterable[Segment], h: int = 0,
               matching: bool = True) -> tuple[int, int]:
        """Insert a token sequence after chain key ``h``; return (hit tokens, end key)."""
        hit = 0
        for seg in segs:
            key = (h, seg.id)
            cached = self._seen.get(key, 0)
            if matching:
                hit += min(cached, seg.tokens)
                matching = cached >= seg.tokens
            if seg.tokens > cached:
                self._seen[key] = seg.tokens
            h = hash((h, seg.id, seg.tokens))
        return hit, h


def _pcts(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0}
    return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
            "p95": float(np.percentile(values, 95)), "max": float(values.max())}


def _levels(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Number of intervals [start, end) containing each start."""
    s, e = np.sort(starts), np.sort(ends)
    return np.searchsorted(s, starts, side="right") - np.searchsorted(e, starts, side="right")


def _span_start(segs: list[Segment], target: str) -> int | None:
    pos = 0
    for seg in segs:
        if seg.id == target:
            return pos
        pos += seg.tokens
    return None


class _Acc:
    """Accumulates per-request columns and reference statistics."""

    def __init__(self, service: ServiceModel) -> None:
        self.service = service
        self.cols: dict[str, list[float]] = {k: [] for k in
                                             ("arrival", "end", "prompt", "new", "output")}
        self.sess_start: list[float] = []
        self.sess_end: list[float] = []
        self.kinds: Counter[str] = Counter()
        self.index = PrefixIndex()
        self.hit_tokens = 0
        self.requests_with_hit = 0
        self.refs: Counter[str] = Counter()
        self.ref_parts: Counter[str] = Counter()
        self.ref_turns: list[int] = []
        self.ref_tokens: list[int] = []

    def add(self, s: Session) -> None:
        self.kinds[s.kind] += 1
        end = 0.0
        for i, t in enumerate(s.turns):
            segs = prompt_segments(s, i)
            prompt = sum(g.tokens for g in segs)
            arrival = t.start_s if t.start_s is not None else end + t.think_s
            end = arrival + self.service.busy_s(prompt, t.output_tokens)
            for k, v in (("arrival", arrival), ("end", end), ("prompt", prompt),
                         ("new", prompt - self._history_tokens(s, i, segs)),
                         ("output", t.output_tokens)):
                self.cols[k].append(v)
            hit, h = self.index.insert(segs)
            if s.history == "full":
                self.index.insert([output_segment(s, i)], h=h, matching=False)
            self.hit_tokens += hit
            self.requests_with_hit += hit > 0
            self._add_refs(s, i, segs, prompt)
        self.sess_start.append(self.cols["arrival"][-len(s.turns)])
        self.sess_end.append(end)

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
                self.ref_turns.append(i - ref.turn)
                if ref.part in _PART_SUFFIX:
                    target = f"{s.session_id}/t{ref.turn}/{_PART_SUFFIX[ref.part]}"
                else:
                    prefix = s.turns[ref.turn].prefix
                    target = prefix[0].id if prefix else ""
            start = _span_start(segs, target)
            if start is not None:
                self.ref_tokens.append(prompt - start - ref.offset_tokens)


def inspect_sessions(sessions: Iterable[Session],
                     service: ServiceModel | None = None) -> dict[str, Any]:
    """Statistics of a trace as a plain dict (see the module docstring)."""
    acc = _Acc(service or ServiceModel())
    for s in sessions:
        acc.add(s)
    if not acc.sess_start:
        raise InputError("trace", "", "no sessions to inspect")
    c = {k: np.asarray(v, dtype=float) for k, v in acc.cols.items()}
    t0, t1 = float(c["arrival"].min()), float(c["arrival"].max())
    span = t1 - t0
    minute = np.floor((c["arrival"] - t0) / 60.0).astype(np.int64)
    per_minute = np.bincount(minute)
    levels = _levels(c["arrival"], c["end"])
    minute_peak = np.zeros(per_minute.size, dtype=np.int64)
    np.maximum.at(minute_peak, minute, levels)
    s_start, s_end = np.asarray(acc.sess_start), np.asarray(acc.sess_end)
    total_prompt = int(c["prompt"].sum())
    return {
        "rows": int(c["arrival"].size),
        "sessions": len(acc.sess_start),
        "sessions_by_kind": dict(sorted(acc.kinds.items())),
        "first_arrival_s": t0,
        "span_s": span,
        "arrival_rate_per_s": (c["arrival"].size / span) if span > 0 else None,
        "input_tokens": _pcts(c["prompt"]),
        "new_input_tokens": _pcts(c["new"]),
        "output_tokens": _pcts(c["output"]),
        "requests_per_minute": {"min": int(per_minute.min()),
                                "p50": float(np.percentile(per_minute, 50)),
                                "max": int(per_minute.max())},
        "concurrency": {
            "service_model": {**asdict(acc.service), "rule": acc.service.describe()},
            "peak_requests": int(levels.max()),
            "per_minute_peak_requests": {"p50": float(np.percentile(minute_peak, 50)),
                                         "p95": float(np.percentile(minute_peak, 95)),
                                         "max": int(minute_peak.max())},
            "peak_sessions": int(_levels(s_start, s_end).max()),
        },
        "prefix_reuse": {"prompt_tokens": total_prompt, "hit_tokens": acc.hit_tokens,
                         "fraction": acc.hit_tokens / total_prompt if total_prompt else 0.0,
                         "requests_with_hit": acc.requests_with_hit},
        "references": {
            "total": sum(acc.refs.values()),
            "by_class": {k: acc.refs.get(k, 0) for k in ("exact", "gist")},
            "by_part": dict(sorted(acc.ref_parts.items())),
            "distance_turns": _pcts(np.asarray(acc.ref_turns, dtype=float)),
            "distance_tokens": _pcts(np.asarray(acc.ref_tokens, dtype=float)),
        },
    }
