"""Down-sampling and time scaling that keep whole sessions.

A session (a conversation, an agent run, an inferred Mooncake prefix chain) is the
unit: sampling picks whole sessions, never rows, so history growth and prefix
sharing inside a session survive.  Time scaling multiplies every absolute
``start_s`` (first turns and open-loop turns); closed-loop ``think_s`` are human
or tool delays and stay as they are.

NOTE: every function returns sessions sorted by first ``start_s`` (ties by id).
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Iterable, Iterator, Sized
from typing import Protocol

import numpy as np

from kvsim.config.units import check_finite_positive
from kvsim.errors import InputError
from kvsim.workload.schema import Session, Turn


def _key(s: Session) -> tuple[float, str]:
    return (s.turns[0].start_s or 0.0, s.session_id)


class SessionSource(Protocol):
    """Sessions that can be read more than once, and counted: a list, or a trace file
    read anew on each pass (:class:`kvsim.workload.io.TraceSessions`)."""

    def __iter__(self) -> Iterator[Session]: ...

    def __len__(self) -> int: ...


def request_rate(sessions: Iterable[Session]) -> float:
    """Requests per second over the span of the absolute arrival times: every session's
    first ``start_s`` (0 when unset) and every open-loop turn's — the times
    :func:`scale_time` scales; 0 if they all fall at one instant.  One pass."""
    first, last, requests = math.inf, -math.inf, 0
    for s in sessions:
        requests += len(s.turns)
        for i, t in enumerate(s.turns):
            if i == 0 or t.start_s is not None:
                start = t.start_s or 0.0
                first, last = min(first, start), max(last, start)
    span = last - first if requests else 0.0
    return requests / span if span > 0 else 0.0


def sample(sessions: Iterable[Session], n_sessions: int | None = None,
           rate: float | None = None, seed: int = 0) -> list[Session]:
    """Keep a uniform random subset of whole sessions (in memory; sorted by first
    ``start_s``, ties by id): the sessions :func:`kept_sessions` keeps."""
    pool = sessions if isinstance(sessions, Sized) else list(sessions)
    return sorted(kept_sessions(pool, n_sessions, rate, seed), key=_key)  # type: ignore[arg-type]


def kept_sessions(source: SessionSource, n_sessions: int | None = None,
                  rate: float | None = None, seed: int = 0) -> SessionSource:
    """The sessions a uniform random down-sampling keeps, read from ``source`` as they
    are iterated (two passes at most: the rate, then the choice).

    ``n_sessions``: exactly that many (all if fewer).  ``rate``: a target request rate
    (requests/s, see :func:`request_rate`); keeps ``round(n * rate / current)``
    sessions — down-sampling only, so a rate above the current one is an error.

    NOTE: memory: the chosen indices (8 bytes a kept session) and, while iterating, the
    sessions that share one first ``start_s`` (sorted by id); ``source`` must come
    sorted by first ``start_s`` for the result to be (as trace readers give them).
    """
    if not (isinstance(seed, (int, np.integer)) and seed >= 0):
        raise InputError("--seed", seed, "a non-negative integer")
    if (n_sessions is None) == (rate is None):
        raise InputError("--sessions / --rate", "both" if rate is not None else "neither",
                         "give exactly one of --sessions or --rate")
    total = len(source)
    if not total:
        raise InputError("sample", 0, "no sessions to sample from")
    if rate is not None:
        current = request_rate(source)
        if not rate > 0 or current == 0 or rate > current:
            raise InputError("--rate", rate, f"must be > 0 and <= the trace's {current:.6g} "
                             "requests/s (sampling only removes sessions)")
        n_sessions = max(1, round(total * rate / current))
    assert n_sessions is not None
    if n_sessions <= 0:
        raise InputError("--sessions", n_sessions, "must be > 0")
    if n_sessions >= total:
        return _Kept(source, None)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x5A11,)))
    return _Kept(source, np.sort(rng.choice(total, size=n_sessions, replace=False)))


class _Kept:
    """The sessions of ``source`` at sorted positions ``keep`` (all when None), each
    run of equal first ``start_s`` sorted by id."""

    def __init__(self, source: SessionSource, keep: np.ndarray | None) -> None:
        self.source, self.keep = source, keep

    def __len__(self) -> int:
        return len(self.source) if self.keep is None else int(self.keep.size)

    def __iter__(self) -> Iterator[Session]:
        tie: list[Session] = []
        for s in self._chosen():
            if tie and _key(s)[0] != _key(tie[0])[0]:
                yield from sorted(tie, key=_key)
                tie = []
            tie.append(s)
        yield from sorted(tie, key=_key)

    def _chosen(self) -> Iterator[Session]:
        if self.keep is None:
            yield from self.source
            return
        keep, j = self.keep, 0
        for k, s in enumerate(self.source):
            if j < keep.size and keep[j] == k:  # NOTE: read on to the end: every
                j += 1                            # record is checked, as when loaded
                yield s


def reservoir(sessions: Iterable[Session], n_sessions: int, seed: int = 0) -> list[Session]:
    """Uniform sample of ``n_sessions`` whole sessions from a stream in O(n) memory."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x5A12,)))
    heap: list[tuple[float, int, Session]] = []
    for k, s in enumerate(sessions):
        tag = float(rng.random())
        if len(heap) < n_sessions:
            heapq.heappush(heap, (tag, k, s))
        elif tag > heap[0][0]:
            heapq.heapreplace(heap, (tag, k, s))
    return sorted((s for _, _, s in heap), key=_key)


def scale_time(sessions: Iterable[Session], factor: float) -> Iterator[Session]:
    """Multiply every absolute ``start_s`` by ``factor`` (> 0); streams."""
    if not factor > 0:
        raise InputError("time_scale", factor, "must be > 0")
    for s in sessions:
        if factor == 1.0:
            yield s
            continue
        turns = tuple(t if t.start_s is None else
                      Turn(**{**t.model_dump(), "start_s": t.start_s * factor})
                      for t in s.turns)
        yield s.model_copy(update={"turns": turns})


RATE_ALLOWED = "a finite number > 0 (requests per second)"


def arrival_times_s(session: Session) -> list[float]:
    """Each turn's earliest arrival, as the simulator and a replay submit it.

    An open-loop turn arrives at its own absolute ``start_s`` (never before the turn
    ahead of it: a session submits its turns in order); a closed-loop turn ``think_s``
    after the previous arrival (answers taken as instant: the earliest it can come).
    """
    out: list[float] = []
    for turn in session.turns:
        prev = out[-1] if out else 0.0
        out.append(max(turn.start_s, prev) if turn.start_s is not None
                   else prev + turn.think_s)
    return out


def arrival_rate(sessions: Iterable[Session]) -> float:
    """Requests per second over the span of every turn's earliest arrival
    (:func:`arrival_times_s`); ``inf`` when they all fall at one instant.  One pass."""
    first, last, requests = math.inf, -math.inf, 0
    for s in sessions:
        a = arrival_times_s(s)
        first, last, requests = min(first, a[0]), max(last, a[-1]), requests + len(a)
    span = last - first if requests else 0.0
    return requests / span if span > 0 else math.inf


class _Scaled:
    """``source`` with every absolute ``start_s`` multiplied by ``factor`` (lazily)."""

    def __init__(self, source: SessionSource, factor: float) -> None:
        self.source, self.factor = source, factor

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[Session]:
        return scale_time(self.source, self.factor)


def scale_to_rate(sessions: SessionSource, rate: float) -> SessionSource:
    """Scale time so the trace's requests arrive at ``rate`` per second.

    Only absolute ``start_s`` scale, so the factor comes from their span: the first
    turns' (:func:`request_rate`) in a closed-loop trace, every turn's in an open-loop
    one.  Think times stay, so a closed-loop trace may not get there: a rate the
    scaled trace misses by 2x or more (:func:`arrival_rate`) is refused.  The result is
    scaled as it is read (``sessions`` read again each time).
    """
    check_finite_positive("--scale-to-rate", rate, RATE_ALLOWED)
    current = request_rate(sessions)
    if current == 0:
        raise InputError("--scale-to-rate", rate, "the trace's arrival times (start_s) all "
                         "fall at one instant: there is no span to scale")
    factor = current / rate
    if not factor < math.inf:
        raise InputError("--scale-to-rate", rate, f"too low for this trace's {current:.6g} "
                         "requests/s: the scaled arrival times overflow")
    scaled = _Scaled(sessions, max(factor, sys.float_info.min))
    check_rate_reached(scaled, rate)
    return scaled


def check_rate_reached(sessions: Iterable[Session], rate: float) -> None:
    """Refuse a target ``rate`` the (scaled) ``sessions`` miss by 2x or more; the
    message says how far the trace can go with every ``start_s`` scaled to 0."""
    got = arrival_rate(sessions)
    if got < 0.5 * rate:
        at_zero = (s.model_copy(update={"turns": tuple(
            t if t.start_s is None else t.model_copy(update={"start_s": 0.0})
            for t in s.turns)}) for s in sessions)
        best = arrival_rate(at_zero)
        raise InputError("--scale-to-rate", rate, f"not reachable: the requests arrive at "
                         f"about {got:.3g}/s (think times within a session are not scaled; "
                         f"this sample reaches at most ~{best:.3g}/s)")
