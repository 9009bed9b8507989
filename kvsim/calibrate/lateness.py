"""How late a replay's client sent its turns: the arrival delay a simulation of the replay
takes (``latency.arrival_delay_s`` / ``arrival_jitter_s``, docs/design/timing-noise.md).

A closed-loop client sends a turn a little after its think time ends (waking up, building
the request); under a busy server's load it now and then stalls for tens of
milliseconds, which decides which slot a returning session finds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any


def turn_lateness(rows: Iterable[Any], time_scale: float = 1.0) -> list[float]:
    """How late each sent turn went out, in seconds of the replay's clock: its send
    (``arrival_s``) after its ``start_s``, or after the previous answer (``finish_s``)
    plus its think time, both times ``time_scale``; turns after an answer that never came
    are left out.  ``rows``: the replay's rows (``session``, ``turn``, ``arrival_s``,
    ``finish_s``)."""
    late: list[float] = []
    done: dict[str, float] = {}
    for row in sorted(rows, key=lambda r: r.arrival_s):
        turn, sid = row.session.turns[row.turn], row.session.session_id
        due = turn.start_s * time_scale if turn.start_s is not None else \
            done.get(sid, math.nan) + (turn.think_s or 0.0) * time_scale
        if not math.isnan(due):
            late.append(row.arrival_s - due)
        done[sid] = row.finish_s
    return late


def client_lateness(late: list[float]) -> tuple[float, float] | None:
    """``(mean, standard deviation)`` of :func:`turn_lateness`'s values; None without two."""
    if len(late) < 2:
        return None
    return statistics.fmean(late), statistics.stdev(late)
