"""Household session generator: a preset + days + seed → closed-loop sessions.

Each member, each day, opens a Poisson number of sessions (mean from the weekday or
weekend pattern) at times drawn from that day's activity windows; each session picks
a kind by the member's weights and draws its turns from the kind's distributions:

* every turn after the first arrives ``think_s`` after the previous answer (closed
  loop, ``history: full`` — the prompt grows by each turn's tool output, input and
  answer; see :func:`kvsim.workload.schema.prompt_segments`);
* sessions of one assistant share its system prompt (``system_prompt_id`` = the
  assistant's name), so prefixes are reusable across sessions;
* ``document`` sessions paste a long document as turn 0's input, later questions
  carry ``exact`` references into it; ``agent`` sessions are tool-call loops (turns
  >= 1 carry ``tool_tokens`` and no user input) that re-read their instructions
  every few tool calls — a ``system`` reference event of the whole system prompt.

Determinism: every random draw comes from a named stream, a numpy ``SeedSequence``
built from the run seed and a spawn key hashed from names (``schedule``/member,
``session``/member/day/k), so the same seed gives the same trace and adding a member
never changes another member's sessions.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Iterator

import numpy as np

from kvsim.config.units import check_finite_positive
from kvsim.errors import InputError, capacity_hint
from kvsim.workload.preset import HouseholdPreset, KindSpec, MemberSpec
from kvsim.workload.schema import ReferenceEvent, Session, Turn

DAY_S = 86_400.0


def stream(seed: int, *names: str | int) -> np.random.Generator:
    """A Generator for one named stream of one seed (stable across runs and platforms)."""
    key = tuple(zlib.crc32(str(n).encode("utf-8")) for n in names)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def generate(preset: HouseholdPreset, days: float, seed: int,
             start_weekday: int = 0, field: str = "days") -> list[Session]:
    """All sessions of ``days`` days (day 0 starts Monday 00:00 when start_weekday=0).

    Sessions are sorted by first ``start_s`` (ties by ``session_id``).  ``field`` is how
    an error names ``days``.  The same sessions as :func:`stream_sessions`, in a list.
    """
    return list(stream_sessions(preset, days, seed, start_weekday, field))


def stream_sessions(preset: HouseholdPreset, days: float, seed: int,
                    start_weekday: int = 0, field: str = "days") -> Iterator[Session]:
    """:func:`generate`'s sessions made one day at a time, so a long run holds only the
    sessions about to start (docs/speed.md: a household-year's sessions are ~120 MB as
    objects).  Checks its arguments at once, before the first session is made.

    NOTE: each member's schedule stream is drawn day after day and each session has its
    own stream, so the draws — and the sessions — equal those of one pass over all
    days; a day's sessions start in [day, day + 1) days (windows end by hour 24), and
    a session exactly at midnight waits to be sorted with the next day's.
    """
    check_finite_positive(field, days, "must be a finite number > 0")
    check_days(preset, days, field)
    if not (isinstance(seed, (int, np.integer)) and seed >= 0):
        raise InputError("seed", seed, "a non-negative integer")
    if not 0 <= start_weekday <= 6:
        raise InputError("start_weekday", start_weekday, "0 (Monday) … 6 (Sunday)")
    return _by_day(preset, days, seed, start_weekday)


def _by_day(preset: HouseholdPreset, days: float, seed: int,
            start_weekday: int) -> Iterator[Session]:
    horizon_s = days * DAY_S
    scheds = {name: stream(seed, "schedule", name) for name in preset.members}
    pending: list[tuple[float, str, Session]] = []
    for day in range(math.ceil(days)):
        for name, member in preset.members.items():
            plan = _day_plan(member, day, start_weekday, scheds[name])
            for k, (start_s, kind) in enumerate(plan):
                if start_s >= horizon_s:
                    continue
                rng = stream(seed, "session", name, day, k)
                sid = f"{name}-d{day}-{k:02d}"
                heapq.heappush(pending, (start_s, sid, make_session(preset, kind, name, sid,
                                                                    start_s, rng)))
        next_day_s = (day + 1) * DAY_S
        while pending and pending[0][0] < next_day_s:
            yield heapq.heappop(pending)[2]
    while pending:
        yield heapq.heappop(pending)[2]


def expected_sessions(preset: HouseholdPreset, days: float) -> float:
    """Mean number of sessions :func:`generate` makes over ``days`` (5 weekdays, 2
    weekend days a week)."""
    per_day = sum(m.weekday.sessions * 5 / 7 + m.weekend.sessions * 2 / 7
                  for m in preset.members.values())
    return per_day * days


def check_days(preset: HouseholdPreset, days: float, field: str) -> None:
    """Refuse up front a day count whose sessions (each at least one request) would be
    over twice one run's request cap: generating them alone would take hours."""
    from kvsim.metrics.records import MAX_REQUESTS

    limit = 2 * MAX_REQUESTS
    per_day = expected_sessions(preset, 1.0)
    if per_day * days > limit:
        raise InputError(field, days, f"at most {limit / per_day:,.0f} days of this preset "
                         f"(~{per_day:.1f} sessions a day, at most {limit:,} sessions); "
                         + capacity_hint(MAX_REQUESTS))


def _day_plan(member: MemberSpec, day: int, start_weekday: int,
              rng: np.random.Generator) -> list[tuple[float, str]]:
    weekend = (start_weekday + day) % 7 >= 5
    pattern = member.weekend if weekend else member.weekday
    n = int(rng.poisson(pattern.sessions))
    weights = np.array([w.weight for w in pattern.windows], dtype=float)
    kinds = list(member.kinds)
    kind_w = np.array([member.kinds[k] for k in kinds], dtype=float)
    plan = []
    for _ in range(n):
        w = pattern.windows[int(rng.choice(len(weights), p=weights / weights.sum()))]
        hour = rng.uniform(w.start_h, w.end_h)
        kind = kinds[int(rng.choice(len(kinds), p=kind_w / kind_w.sum()))]
        plan.append((day * DAY_S + hour * 3600.0, kind))
    plan.sort()
    return plan


def make_session(preset: HouseholdPreset, kind: str, member: str, sid: str,
                 start_s: float, rng: np.random.Generator) -> Session:
    """One session of ``kind`` drawn from the preset's distributions."""
    spec: KindSpec = preset.kinds[kind]  # type: ignore[index]
    sys_id = spec.assistant
    sys_tokens = preset.assistants[sys_id].system_prompt_tokens if sys_id else 0
    n_turns = max(1, spec.turns.sample_int(rng))
    sizes = [_turn_sizes(spec, i, rng) for i in range(n_turns)]
    next_reread = _draw_reread(spec, rng)
    tool_calls = 0
    turns = []
    for i, (tool, inp, out) in enumerate(sizes):
        refs = _references(spec, sizes, i, rng)
        if tool:
            tool_calls += 1
            if next_reread is not None and tool_calls >= next_reread and sys_tokens:
                refs.append(ReferenceEvent(turn=None, part="system", offset_tokens=0,
                                           length_tokens=sys_tokens, content="exact"))
                tool_calls = 0
                next_reread = _draw_reread(spec, rng)
        turns.append(Turn(
            start_s=start_s if i == 0 else None,
            think_s=0.0 if i == 0 else spec.think_s.sample(rng),
            tool_tokens=tool, input_tokens=inp, output_tokens=out,
            references=tuple(refs)))
    return Session(session_id=sid, kind=kind, member=member,  # type: ignore[arg-type]
                   system_prompt_id=sys_id, system_prompt_tokens=sys_tokens,
                   history="full", turns=tuple(turns))


def _turn_sizes(spec: KindSpec, i: int, rng: np.random.Generator) -> tuple[int, int, int]:
    """(tool_tokens, input_tokens, output_tokens) of turn ``i``."""
    if i == 0 and spec.first_input_tokens is not None:
        inp = spec.first_input_tokens.sample_int(rng)
    else:
        inp = spec.input_tokens.sample_int(rng)
    tool = spec.tool_tokens.sample_int(rng) if (i > 0 and spec.tool_tokens) else 0
    if tool == 0 and inp == 0:
        inp = 1  # NOTE: a turn always appends something to the prompt
    out = max(1, spec.output_tokens.sample_int(rng))
    return max(0, tool), max(0, inp), out


def _draw_reread(spec: KindSpec, rng: np.random.Generator) -> int | None:
    return None if spec.reread_every is None else max(1, spec.reread_every.sample_int(rng))


def _references(spec: KindSpec, sizes: list[tuple[int, int, int]], i: int,
                rng: np.random.Generator) -> list[ReferenceEvent]:
    """At most one back-reference from turn ``i`` to an earlier turn's tool output or input."""
    ref = spec.references
    if i == 0 or ref.p_per_turn <= 0 or rng.random() >= ref.p_per_turn:
        return []
    j = 0 if ref.target == "first" else int(rng.integers(0, i))
    tool, inp, _ = sizes[j]
    part, length = ("input", inp) if inp > 0 else ("tool", tool)
    span = max(1, min(length, ref.span_tokens.sample_int(rng)))
    offset = int(rng.integers(0, length - span + 1))
    content = "exact" if rng.random() < ref.p_exact else "gist"
    return [ReferenceEvent(turn=j, part=part, offset_tokens=offset,  # type: ignore[arg-type]
                           length_tokens=span, content=content)]  # type: ignore[arg-type]
