"""Whether a run's outcomes hinge on timing: the shape that makes them a race.

Where more sessions are open at once than a slot engine has slots, which slot a returning
session finds free depends on milliseconds (docs/scenarios.md, "Timing noise"); a plain
``kvsim simulate`` says so beside its figures.  NOTE: kept apart from kvsim.plan.jitter
(the replications themselves), whose imports (scipy.stats, through kvsim.plan.replicate)
would cost every ``kvsim simulate`` ~0.6 s for this one test.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvsim.engines.config import SlotEngineConfig
from kvsim.scenario import Scenario


def peak_open_sessions(requests: pd.DataFrame) -> int:
    """Most sessions open at once: from a session's first arrival to its last finish."""
    if not len(requests):
        return 0
    g = requests.groupby("session_id")
    start, end = g["arrival_s"].min(), g["finish_s"].max().fillna(math.inf)
    # NOTE: an end sorts before a start at the same instant (the slot is free again)
    events = sorted([(t, 1) for t in start] + [(t, -1) for t in end])
    return int(max(np.cumsum([d for _, d in events])))


def timing_reason(scenario: Scenario, requests: pd.DataFrame) -> str:
    """The shape that makes a slot engine's outcomes hinge on timing, or ``""``."""
    eng = scenario.engine
    if not isinstance(eng, SlotEngineConfig):
        return ""
    open_at_once = peak_open_sessions(requests)
    if open_at_once <= eng.parallel:
        return ""
    return f"more sessions than slots ({open_at_once} open at once on {eng.parallel})"
