"""Streaming tallies for ``trace inspect``: exact statistics in memory independent of
the number of requests.

* :class:`Counts` — a histogram of whole numbers (token counts, distances): mean, max
  and percentiles as every kvsim percentile is taken (``inverted_cdf``: the smallest
  value with at least q of the column at or below it, one that occurs), exactly as
  ``np.percentile(..., method="inverted_cdf")`` gives them on the full column, from
  (value, count) pairs.  Memory: one entry per distinct value
  (bounded by the largest token count, not by the trace length).
* :class:`Overlap` — how many intervals ``[start, end)`` contain each start (the
  concurrency at each arrival), by an event sweep that finalises everything before a
  time no later interval can start before.  Memory: the intervals not yet passed.
* :class:`PerMinute` — a count and a maximum per minute since the first arrival.
  Memory: 16 bytes a minute of the trace's span.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np

from kvsim.errors import InputError

MAX_MINUTES = 10 * 366 * 24 * 60  # the longest span trace inspect counts minute by minute
_START, _END = 1, 0  # NOTE: heap order at one instant does not matter: all apply first


class Counts:
    """Whole-number histogram with numpy-exact mean / percentiles / max."""

    def __init__(self) -> None:
        self._n: dict[int, int] = {}
        self.total = 0
        self._sum = 0

    def add(self, value: int) -> None:
        self._n[value] = self._n.get(value, 0) + 1
        self.total += 1
        self._sum += value

    def summary(self) -> dict[str, float]:
        """``mean``, ``p50``, ``p95``, ``max`` (zeros when empty)."""
        if not self.total:
            return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0}
        # NOTE: Python ints, not int64: a value may be beyond 64 bits (the tallies
        # describe what a trace holds, before anything refuses it)
        values = sorted(self._n)
        cum = np.cumsum([self._n[v] for v in values])
        return {"mean": self._sum / self.total, "p50": self._percentile(values, cum, 50),
                "p95": self._percentile(values, cum, 95), "max": float(values[-1])}

    def _percentile(self, values: list[int], cum: np.ndarray, q: int) -> float:
        """``np.percentile(column, q, method="inverted_cdf")`` of the column these counts
        describe: the k-th smallest, k = ⌈total · q / 100⌉ (in integers, no rounding)."""
        k = max(1, -(-self.total * q // 100))
        return float(values[int(np.searchsorted(cum, k, side="left"))])


class Overlap:
    """Intervals ``[start, end)``; for each start, the number containing it (ends at
    or before it excluded, starts at it included), reported through ``on_level``.

    NOTE: the caller promises that no interval added later starts before the time it
    passes to :meth:`flush` (sessions sorted by first arrival); :meth:`finish` ends.
    """

    def __init__(self, on_level: Callable[[float, int], None]) -> None:
        self._events: list[tuple[float, int]] = []
        self._open = 0
        self.peak = 0
        self._on_level = on_level

    def add(self, start: float, end: float) -> None:
        heapq.heappush(self._events, (start, _START))
        heapq.heappush(self._events, (end, _END))

    def flush(self, before: float = math.inf) -> None:
        """Report every start earlier than ``before`` (all of them by default)."""
        ev = self._events
        while ev and ev[0][0] < before:
            t, starts = ev[0][0], 0
            while ev and ev[0][0] == t:
                _, kind = heapq.heappop(ev)
                self._open += 1 if kind == _START else -1
                starts += kind == _START
            if starts:
                self.peak = max(self.peak, self._open)
                for _ in range(starts):
                    self._on_level(t, self._open)

    def finish(self) -> int:
        """Report the rest; the peak level."""
        self.flush()
        return self.peak


class PerMinute:
    """Requests and their peak concurrency per whole minute since ``t0``."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.count: dict[int, int] = {}
        self.peak: dict[int, int] = {}

    def minute(self, t: float) -> int:
        return math.floor((t - self.t0) / 60.0)

    def arrive(self, t: float) -> None:
        m = self.minute(t)
        self.count[m] = self.count.get(m, 0) + 1

    def level(self, t: float, level: int) -> None:
        m = self.minute(t)
        self.peak[m] = max(self.peak.get(m, 0), level)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(requests, peak) per minute 0 .. the last one, zeros where none arrived."""
        size = max(self.count) + 1
        if size > MAX_MINUTES:
            raise InputError("trace", f"arrivals spanning {size:,} minutes", "at most "
                             f"{MAX_MINUTES:,} minutes (ten years): the per-minute counts "
                             "take 16 bytes a minute")
        counts, peaks = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
        counts[list(self.count)] = list(self.count.values())
        peaks[list(self.peak)] = list(self.peak.values())
        return counts, peaks
