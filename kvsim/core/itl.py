"""Inter-token gaps stored as affine runs: exact, bounded, fast.

A run ``(gap_s, gap_delta_s, count)`` stands for the ``count`` gaps ``gap_s + k · gap_delta_s``
(``k = 0 .. count−1``, float64 as written); ``gap_delta_s == 0`` is run-length encoding. A gap
that follows the previous step's token is that step's duration (:func:`token_gap`), not a
clock difference; runs are built by a greedy online swing filter.

NOTE: every stored gap is within ``TOL_REL · |g|`` (``TOL_REL = 2⁻⁴⁴``, plus one rounding) of
the recorded gap.
NOTE: fast-forward (:func:`emit_tokens`) continues open runs with the same rule vectorised
(:func:`stretch_runs`), so both fidelities store the same runs for the same gaps.
Design: docs/design/fast-forward.md.
"""

from __future__ import annotations

import math

import numpy as np

TOL_REL = 2.0 ** -44
SMALL_STRETCH = 32  # NOTE: emit_tokens segments shorter stretches in pure Python
_INF = math.inf
_ulp = math.ulp


def token_gap(now_s: float, last_s: float, dt_s: float) -> float:
    """The gap of a token sampled at ``now_s`` by the step of duration ``dt_s``, the
    previous one at ``last_s``: the step's duration when the clock difference is
    within one unit in the last place of ``now_s`` of it, else the clock difference."""
    g = now_s - last_s
    return dt_s if abs(g - dt_s) <= _ulp(now_s) else g


def _slope(lo: float, hi: float) -> float:
    if lo <= 0.0 <= hi:
        return 0.0
    return 0.5 * (lo + hi) if math.isfinite(lo) and math.isfinite(hi) else 0.0


class GapRuns:
    """One request's gaps: closed runs ``[gap_s, gap_delta_s, count]`` + one open run."""

    __slots__ = ("closed", "g0", "hi", "lo", "n")

    def __init__(self) -> None:
        self.closed: list[tuple[float, float, int]] = []
        self.g0 = 0.0
        self.n = 0
        self.lo = -_INF
        self.hi = _INF

    def __len__(self) -> int:
        return len(self.closed) + (1 if self.n else 0)

    def add(self, gap_s: float) -> None:
        """Append one gap (the per-step path)."""
        k = self.n
        if k:
            tol = TOL_REL * gap_s if gap_s > 0.0 else -TOL_REL * gap_s
            lo = (gap_s - tol - self.g0) / k
            hi = (gap_s + tol - self.g0) / k
            if lo < self.lo:  # noqa: PLR1730 (builtins max/min cost twice as much here)
                lo = self.lo
            if hi > self.hi:  # noqa: PLR1730
                hi = self.hi
            if lo <= hi:
                self.lo, self.hi, self.n = lo, hi, k + 1
                return
            self.closed.append((self.g0, _slope(self.lo, self.hi), k))
        self.g0, self.n, self.lo, self.hi = gap_s, 1, -_INF, _INF

    def runs(self) -> list[tuple[float, float, int]]:
        """Every run, the open one closed: ``[(gap_s, gap_delta_s, count), ...]``."""
        out = list(self.closed)
        if self.n:
            out.append((self.g0, _slope(self.lo, self.hi), self.n))
        return out


def stretch_runs(gaps: np.ndarray, open_run: tuple[float, float, float, int] | None = None
                 ) -> list[tuple[float, float, float, int]]:
    """Greedy swing-filter runs ``(g0, lo, hi, count)`` over ``gaps`` (vectorised),
    continuing ``open_run`` (a :class:`GapRuns`' open run ``(g0, lo, hi, n)``) if given.

    Gives the same runs as feeding the gaps one by one to a :class:`GapRuns` in that
    state (the same float operations, in the same order); the first run returned is
    the continued one, the last is still open.
    """
    m = len(gaps)
    tol = TOL_REL * np.abs(gaps)
    out: list[tuple[float, float, float, int]] = []
    if open_run is not None and open_run[3]:
        g0, lo_c, hi_c, c = open_run
        p = 0
    elif m:
        g0, lo_c, hi_c, c, p = float(gaps[0]), -_INF, _INF, 1, 1
    else:
        return out
    while True:
        q, chunk = p, 4096  # NOTE: a stretch is usually one run: test it whole
        while p < m:
            w = min(m - p, chunk)
            k = np.arange(c + p - q, c + p - q + w, dtype=np.float64)
            seg, tl = gaps[p:p + w], tol[p:p + w]
            lo = np.maximum(np.maximum.accumulate((seg - tl - g0) / k), lo_c)
            hi = np.minimum(np.minimum.accumulate((seg + tl - g0) / k), hi_c)
            bad = lo > hi
            if bad.any():
                e = int(bad.argmax())
                if e:
                    lo_c, hi_c = float(lo[e - 1]), float(hi[e - 1])
                p += e
                break
            lo_c, hi_c = float(lo[-1]), float(hi[-1])
            p += w
        out.append((g0, lo_c, hi_c, c + p - q))
        if p >= m:
            return out
        g0, lo_c, hi_c, c = float(gaps[p]), -_INF, _INF, 1
        p += 1


def continued_runs(open_run: tuple[float, float, float, int], first_s: float,
                   gaps: list[float]) -> tuple[list[tuple[float, float, int]],
                                               tuple[float, float, float, int]]:
    """What a :class:`GapRuns` with ``open_run`` does on ``add(first_s)`` and then
    ``add(g)`` for each of ``gaps``: ``(runs it closes, its new open run)``."""
    closed: list[tuple[float, float, int]] = []
    if len(gaps) <= SMALL_STRETCH:  # NOTE: numpy's per-call cost exceeds the work
        return closed, _add_all(open_run, (first_s, *gaps), closed)
    state = _add_all(open_run, (first_s,), closed)
    runs4 = stretch_runs(np.asarray(gaps, dtype=np.float64), state)
    return closed + [(g0, _slope(lo, hi), n) for g0, lo, hi, n in runs4[:-1]], runs4[-1]


def _add_all(state: tuple[float, float, float, int], gaps: tuple[float, ...],
             closed: list[tuple[float, float, int]]) -> tuple[float, float, float, int]:
    """:meth:`GapRuns.add` of each of ``gaps`` from the open run ``state``, in local
    variables: the same operations in the same order (the same floats); the runs it
    closes are appended to ``closed``; returns the new open run."""
    g0, lo_c, hi_c, k = state
    for g in gaps:
        if k:
            tol = TOL_REL * g if g > 0.0 else -TOL_REL * g
            lo = (g - tol - g0) / k
            hi = (g + tol - g0) / k
            if lo < lo_c:  # noqa: PLR1730 (as GapRuns.add)
                lo = lo_c
            if hi > hi_c:  # noqa: PLR1730
                hi = hi_c
            if lo <= hi:
                lo_c, hi_c, k = lo, hi, k + 1
                continue
            closed.append((g0, _slope(lo_c, hi_c), k))
        g0, k, lo_c, hi_c = g, 1, -_INF, _INF
    return g0, lo_c, hi_c, k


def emit_tokens(reqs: list, times: list[float], dts: list[float], compute: bool = False) -> None:
    """Every request of a stretch samples one token at each of ``times[1:]``, step
    ``j`` taking ``dts[j]`` (``times[j + 1] = times[j] + dts[j]``); with ``compute``
    each also computes one token a step (``Request.record_compute``, in the same pass).

    Each request's gaps are its first one (from its own last token,
    :func:`token_gap`) and then the step durations ``dts[1:]``, continuing its open
    run: the same runs as the per-step mode builds.  Requests whose open run and
    first gap are equal (those in the batch since its last change) are segmented
    once, together.
    """
    steps = len(times) - 1
    t1, d0, last = times[1], dts[0], times[-1]
    u = _ulp(t1)
    groups: dict[tuple, list] = {}
    for r in reqs:
        it = r.itl
        g = t1 - r.last_token_s  # NOTE: token_gap inlined (one unit in the last place)
        key = (d0 if -u <= g - d0 <= u else g, it.g0, it.lo, it.hi, it.n)
        same = groups.get(key)
        if same is None:
            groups[key] = [r]
        else:
            same.append(r)
    gaps = dts[1:steps]
    for (g, *open_run), rs in groups.items():
        closed, (g0, lo, hi, n) = continued_runs(tuple(open_run), g, gaps)
        for r in rs:
            it = r.itl
            if closed:
                it.closed.extend(closed)
            it.g0, it.lo, it.hi, it.n = g0, lo, hi, n
            r.last_token_s = last
            r.num_output += steps
            if compute:  # NOTE: Request.record_compute's decode path, inlined
                a = r.num_computed_tokens
                if a >= r.high_water and a >= r.prompt_tokens:
                    r.num_computed_tokens = r.high_water = a + steps
                else:
                    r.record_compute(steps)
