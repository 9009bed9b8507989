"""Jittered replications: how far a run's outcomes move when only its timing wobbles.

:func:`jitter_replications` runs a scenario again under N jitter seeds split from its
seed (named stream ``jitter-replications``), the workload unchanged — each replication
differs from the run only by ``latency.jitter_seed`` (kvsim.latency.jitter: its step
noise and its late arrivals).
:func:`timing_spread` gives, per metric that matters (prompt-cache reuse, TTFT p95,
failed requests, OOM-class events), its range over the run and its replications and
whether it moved *materially*: its range (highest − lowest) is at least
``MATERIAL_RELATIVE`` (10 %) of its median — and, for a rate (prompt-cache reuse), at
least ``MATERIAL_RATE_POINTS`` (1 percentage point) — or, for a count (failed requests)
and the OOM verdict, some runs have none and others some.

NOTE: the reason given for a moved outcome is the shape that makes it hinge on timing:
more sessions open at once than the engine has slots (which slot a returning session
finds free then depends on milliseconds: docs/scenarios.md, "Timing noise").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from kvsim.errors import InputError
from kvsim.plan.executor import Executor
from kvsim.plan.replicate import RunOutput, replication_seeds, run_all
from kvsim.scenario import Scenario

JITTER_STREAM = "jitter-replications"
MATERIAL_RATE_POINTS = 0.01
MATERIAL_RELATIVE = 0.10
MAX_JITTER_REPLICATIONS = 1000

Kind = Literal["rate", "time", "count"]
METRICS: tuple[tuple[str, str, Kind], ...] = (
    ("prefix_hit_rate", "prompt-cache reuse", "rate"),
    ("ttft_p95_s", "TTFT p95", "time"),
    ("failed_requests", "failed requests", "count"),
)
OOM_LABEL = "runs with an OOM-class event"


@dataclass(frozen=True)
class MetricSpread:
    """One metric over the run and its jittered replications.

    ``values[0]`` is the run's own; ``moved``: the range is material (module doc);
    ``reason``: why it hinges on timing ("" when moved for no shape kvsim names).
    """

    key: str
    label: str
    kind: Kind
    values: tuple[float, ...]
    moved: bool
    reason: str = ""

    @property
    def low(self) -> float:
        finite = [v for v in self.values if not math.isnan(v)]
        return min(finite) if finite else math.nan

    @property
    def high(self) -> float:
        finite = [v for v in self.values if not math.isnan(v)]
        return max(finite) if finite else math.nan

    @property
    def median(self) -> float:
        """The median over the run and its replications: where a value hinges on timing,
        the one figure to hold a server's typical run against (a single run is one draw
        of the race)."""
        finite = [v for v in self.values if not math.isnan(v)]
        return float(np.median(finite)) if finite else math.nan

    def text(self, value: float) -> str:
        """``value`` as this metric is shown (a rate in %, a time in ms or s)."""
        if math.isnan(value):
            return "-"
        if self.key == "oom":
            return "yes" if value else "no"
        if self.kind == "rate":
            return f"{100 * value:.1f} %"
        if self.kind == "time":
            return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"
        return f"{value:g}"

    def range_text(self) -> str:
        if self.key == "oom":
            return f"{int(sum(self.values))} of {len(self.values)}"
        lo, hi = self.text(self.low), self.text(self.high)
        if self.kind == "rate":
            lo = lo.removesuffix(" %")
        if self.kind == "time" and lo.endswith(" ms") and hi.endswith(" ms"):
            lo = lo.removesuffix(" ms")
        return f"{lo}–{hi}"

    def warning(self) -> str:
        """The one line a moved metric gets: its range, and the reason when known."""
        return f"{self.label} {self.range_text()} depending on timing" + (
            f": {self.reason}" if self.reason else "")


def jitter_seeds(scenario: Scenario, n: int) -> list[int]:
    """The N jitter seeds of ``scenario``'s replications (checked: 1 ≤ n ≤ 1000, and the
    scenario has timing noise to replicate)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_JITTER_REPLICATIONS:
        raise InputError("--jitter-replications", n,
                         f"an integer from 1 to {MAX_JITTER_REPLICATIONS}")
    if not scenario.latency.jittered:
        raise InputError("--jitter-replications", n, "a scenario with timing noise: set "
                         "latency.jitter_cv, jitter_run_cv or arrival_jitter_s (e.g. --set "
                         "latency.jitter_cv=0.05; kvsim calibrate engine measures a "
                         "server's)")
    return replication_seeds(scenario.seed, n, JITTER_STREAM)


def jitter_replications(scenario: Scenario, n: int, *, executor: Executor | None = None,
                        progress: Callable[[int], None] | None = None
                        ) -> tuple[list[int], list[RunOutput]]:
    """``(seeds, outputs)`` of ``n`` runs of ``scenario`` differing only by jitter seed."""
    seeds = jitter_seeds(scenario, n)
    variants = [scenario.model_copy(update={"latency": scenario.latency.model_copy(
        update={"jitter_seed": s})}) for s in seeds]
    return seeds, run_all(variants, executor=executor, progress=progress)


def _moved(kind: Kind, values: Sequence[float]) -> bool:
    finite = [v for v in values if not math.isnan(v)]
    if len(finite) < 2:
        return False
    lo, hi, mid = min(finite), max(finite), float(np.median(finite))
    if kind == "count" and lo == 0 < hi:
        return True
    floor = MATERIAL_RATE_POINTS if kind == "rate" else 0.0
    return hi > lo and hi - lo >= max(MATERIAL_RELATIVE * abs(mid), floor)


def timing_spread(main: RunOutput, runs: Sequence[RunOutput], reason: str = ""
                  ) -> list[MetricSpread]:
    """Each metric of :data:`METRICS`, then the OOM verdict, over ``main`` and ``runs``."""
    out = []
    for key, label, kind in (*METRICS, ("oom", OOM_LABEL, "count")):
        values = tuple(_value(r, key) for r in (main, *runs))
        moved = _moved(kind, values)
        out.append(MetricSpread(key, label, kind, values, moved, reason if moved else ""))
    return out


def _value(run: RunOutput, key: str) -> float:
    if key == "oom":
        return float(bool(run.oom_reason))
    v: Any = run.summary.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def spread_doc(seeds: Sequence[int], knobs: dict[str, float],
                spreads: Sequence[MetricSpread]) -> dict[str, Any]:
    """``jitter.json``: the seeds, the noise's knobs (``JitterKnobs.noise_knobs``: the
    CVs, the prompt steps' resolved, and the arrival delay), and per metric its values
    (the run's first), range, median and verdict."""
    return {**knobs, "stream": JITTER_STREAM, "seeds": list(seeds),
            "material": {"rate_points": MATERIAL_RATE_POINTS, "relative": MATERIAL_RELATIVE},
            "metrics": {s.key: {"label": s.label, "values": [_json(v) for v in s.values],
                                "low": _json(s.low), "high": _json(s.high),
                                "median": _json(s.median), "moved": s.moved,
                                "reason": s.reason} for s in spreads}}


def _json(v: float) -> float | None:
    return None if math.isnan(v) else v
