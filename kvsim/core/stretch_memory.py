"""The memory of a fast-forwarded stretch: what the sampler sees inside it.

A stretch applies many decode steps at once; the engine's memory sampler may tick
inside it.  :class:`Stretch` keeps the step start times and the KV bytes during
each step, so a tick at ``t`` gets the state of the step that covers ``t``; the
other columns come from the state after the stretch (they cannot change inside
one), or from the part of a stretch through completions that covers ``t``.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from itertools import chain

from kvsim.core.step import MemoryState
from kvsim.metrics.rows import MemoryRow


@dataclasses.dataclass(frozen=True)
class Stretch:
    """A fast-forwarded stretch: step start times ``t_0..t_J`` and memory per step.

    ``bases[base_of[j]]`` gives the columns other than the KV bytes during step ``j``
    (a stretch through completions changes the running count and host bytes at each
    completion); without ``bases`` every step has ``base``.
    """

    times: list[float]
    base: MemoryState
    allocated_bytes: list[int]  # during step j (after its allocations), j = 0..J-1
    cached_bytes: list[int]
    bases: tuple[MemoryState, ...] = ()
    base_of: list[int] | None = None

    def covers(self, t_s: float) -> bool:
        return self.times[0] < t_s <= self.times[-1]

    def _step(self, t_s: float) -> int:
        j = bisect_left(self.times, t_s) - 1
        return min(max(j, 0), len(self.allocated_bytes) - 1)

    def base_at(self, j: int) -> MemoryState:
        return self.base if self.base_of is None else self.bases[self.base_of[j]]

    def memory_at(self, t_s: float, live: MemoryState | None = None) -> MemoryState:
        """Memory just before ``t_s`` (a tick at a step end sees that step's state).

        ``live`` (the scheduler's state now) gives every column but the KV bytes: an
        arrival during a folded step changes the waiting count.
        """
        j = self._step(t_s)
        alloc = int(self.allocated_bytes[j])
        base = self.base_at(j)
        extra = {"kv_quant_bytes": alloc} if _quant_follows(base) else {}
        if live is not None and self.base_of is not None:
            live = dataclasses.replace(live, running=base.running,
                                       host_kv_bytes=base.host_kv_bytes)
        return dataclasses.replace(live or base, kv_allocated_bytes=alloc,
                                   kv_cached_bytes=int(self.cached_bytes[j]), **extra)

    def memory_rows(self, ticks: list[float]) -> list[MemoryRow]:
        """``memory`` rows (``Recorder.sample`` order) at ``ticks``, as :meth:`memory_at`."""
        last, times = len(self.allocated_bytes) - 1, self.times
        js = [min(max(bisect_left(times, t) - 1, 0), last) for t in ticks]
        alloc, cached = self.allocated_bytes, self.cached_bytes
        if self.base_of is None:  # NOTE: one base: its columns and rule hoisted
            b = self.base
            follows = _quant_follows(b)
            row = (b.kv_reserved_bytes, b.host_kv_bytes, b.running, b.waiting, b.kv_quant_bytes)
            return [MemoryRow(t, row[0], alloc[j], cached[j], row[1], row[2], row[3],
                              alloc[j] if follows else row[4]) for t, j in zip(ticks, js)]
        bases = [self.base_at(j) for j in js]
        return [MemoryRow(t, b.kv_reserved_bytes, alloc[j], cached[j], b.host_kv_bytes,
                          b.running, b.waiting,
                          alloc[j] if _quant_follows(b) else b.kv_quant_bytes)
                for t, b, j in zip(ticks, bases, js)]


def _quant_follows(m: MemoryState) -> bool:
    """Do ``m``'s quantized bytes follow its allocated bytes inside a stretch?

    NOTE: with a quantized cache type every allocated byte is quantized
    (policies.runtime reports kv_quant_bytes == kv_allocated_bytes); other policy
    columns cannot change inside a stretch (hooks bound it by next_trigger_s).
    """
    quant = m.kv_quant_bytes
    return bool(quant) and quant == m.kv_allocated_bytes


def join_stretches(parts: list[Stretch]) -> Stretch:
    """One stretch from consecutive parts (each part's first time is the last one's end)."""
    if len(parts) == 1:
        return parts[0]
    times = parts[0].times[:1]
    base_of: list[int] = []
    for k, p in enumerate(parts):
        times.extend(p.times[1:])
        base_of.extend([k] * len(p.allocated_bytes))
    return Stretch(times, parts[-1].base,
                   list(chain.from_iterable(p.allocated_bytes for p in parts)),
                   list(chain.from_iterable(p.cached_bytes for p in parts)),
                   tuple(p.base for p in parts), base_of)
