"""Seeded replications of one scenario: percentiles with CIs and OOM risk.

A household's evening is random (who starts a session when, how long answers
are); one simulation is one draw.  :func:`replicate` runs the same scenario under
N seeds split from the scenario's seed (``numpy.random.SeedSequence``, named
stream), in parallel, and summarises:

- each latency percentile **pooled** over every request of every replication (the
  percentile users mean), with a bootstrap interval over sessions
  (:mod:`kvsim.metrics.pooled`, :meth:`ReplicationSet.latency`);
- each other summary metric as the mean over replications with a Student-t interval
  (none from a single run: :func:`kvsim.plan.stats.mean_interval`);
- **OOM risk** = share of replications with an OOM-class event — a failed
  request, an allocation failure or a load failure, as the engine would surface
  it — with a Wilson 95 % interval (docs/design/DESIGN.md §3.7).

NOTE: the per-run work is a *runner* — a top-level callable ``Scenario →
RunOutput`` (default :func:`simulate_run`, over :func:`kvsim.api.simulate`) — so
workers receive only (runner, scenario) and return a small summary, never the
whole Results, unless ``keep_results`` is asked for.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvsim.metrics.failures import FAILURE_CODES, FAILURE_KINDS, failure_kind
from kvsim.metrics.pooled import (
    LatencySample,
    latency_sample,
    pooled_count,
    pooled_interval,
    pooled_quantile,
)
from kvsim.plan.executor import Executor, InlineExecutor
from kvsim.plan.stats import Interval, mean_interval, wilson_interval
from kvsim.scenario import Scenario, scenario_hash

# Event kinds (Results ``events.kind``) that a real engine surfaces as an OOM or a
# failed request.  NOTE: preemption is *not* in the list: vLLM preempts and retries,
# the user sees a latency cliff, not an error.
OOM_EVENT_KINDS = frozenset({"oom", "fail", "failed", "alloc_fail", "allocation_failure",
                             "load_fail", "load_failure"})
# Summary counters that, when positive, mean an OOM-class event happened.
OOM_SUMMARY_KEYS = ("failed_memory_requests", "oom_events", "allocation_failures",
                    "load_failures")


@dataclass(frozen=True)
class RunOutput:
    """What one run hands back: its flat summary, its OOM-class verdict and (simulated
    runs) its latency values for pooling."""

    summary: dict[str, Any]
    oom_reason: str = ""  # "" = no OOM-class event
    results: Any = None  # the full Results, only when asked for
    samples: LatencySample | None = None  # None: a runner that gives summaries only


def oom_reason(summary: dict[str, Any], requests: pd.DataFrame | None = None,
               events: pd.DataFrame | None = None) -> str:
    """The first OOM-class event of a run in the engine's own words, or ``""``.

    NOTE: a request refused because it is longer than the context, or because the queue
    was full, is not OOM-class (kvsim.metrics.failures): more memory at the same
    settings would not have served it."""
    excused: set[str] = set()  # requests that failed for another reason than memory
    if requests is not None and "failed" in requests and bool(requests["failed"].any()):
        failed = requests.loc[requests["failed"].astype(bool)]
        kinds = [failure_kind(str(r)) for r in failed["failure_reason"]]
        memory = [str(r) for r, k in zip(failed["failure_reason"], kinds, strict=True)
                  if k == "memory"]
        if memory:
            top = Counter(r for r in memory if r).most_common(1)
            return top[0][0] if top else "failed request"
        excused = set(failed["request_id"].astype(str)) if "request_id" in failed else set()
    if events is not None and "kind" in events and len(events):
        hit = events[events["kind"].astype(str).str.lower().isin(OOM_EVENT_KINDS)]
        if excused and "request_id" in hit:
            hit = hit[~hit["request_id"].astype(str).isin(excused)]
        if len(hit):
            row = hit.iloc[0]
            detail = str(row.get("detail", "") or "")
            return detail or str(row["kind"])
    for key in OOM_SUMMARY_KEYS:
        value = summary.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return key
    return ""


def simulate_run(scenario: Scenario, keep_results: bool = False) -> RunOutput:
    """The default runner: :func:`kvsim.api.simulate` → summary + OOM verdict."""
    from kvsim.api import simulate

    res = simulate(scenario)
    if res.stopped is not None:  # NOTE: a plan or sweep cell reports a stopped run as its error
        raise res.stopped
    reason = oom_reason(dict(res.summary), getattr(res, "requests", None),
                        getattr(res, "events", None))
    return RunOutput(dict(res.summary), reason, res if keep_results else None,
                     latency_sample(res))


def simulate_keep(scenario: Scenario) -> RunOutput:
    """Runner that also returns the full Results (for the sweep's result store)."""
    return simulate_run(scenario, keep_results=True)


Runner = Callable[[Scenario], RunOutput]


def call_runner(item: tuple[Runner, Scenario]) -> RunOutput:
    """Top-level task body for every executor: ``runner(scenario)``."""
    runner, scenario = item
    return runner(scenario)


def replication_seeds(seed: int, n: int, stream: str = "replications") -> list[int]:
    """N independent 32-bit seeds from ``seed`` and a named stream.

    NOTE: a different ``stream`` name gives fresh seeds that share no draw with the
    search's own replications (used to check a recommendation independently).
    """
    ss = np.random.SeedSequence([int(seed), zlib.crc32(stream.encode())])
    return [int(c.generate_state(1, dtype=np.uint32)[0]) for c in ss.spawn(n)]


@dataclass(frozen=True)
class ReplicationSet:
    """N runs of one scenario (differing only by seed) and their estimates."""

    scenario_hash: str
    seeds: tuple[int, ...]
    runs: tuple[RunOutput, ...]
    notes: tuple[str, ...] = field(default=())
    shared_sessions: bool = False  # a trace: the same sessions in every run (kvsim.metrics.pooled)

    @property
    def n(self) -> int:
        return len(self.runs)

    def oom_risk(self, confidence: float = 0.95) -> Interval:
        k = sum(1 for r in self.runs if r.oom_reason)
        return wilson_interval(k, self.n, confidence)

    def failure_risk(self, kind: str, confidence: float = 0.95) -> Interval:
        """Share of runs with at least one request failed for ``kind`` (``too_long``,
        ``busy`` or ``memory``, kvsim.metrics.failures), with its Wilson interval."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind {kind!r}: one of {', '.join(FAILURE_KINDS)}")
        key = f"failed_{kind}_requests"
        k = sum(1 for r in self.runs if _as_float(r.summary.get(key)) > 0)
        return wilson_interval(k, self.n, confidence)

    @property
    def pooled(self) -> bool:
        """Can latency percentiles be pooled (every run handed its values back)?"""
        return self.n > 0 and all(r.samples is not None for r in self.runs)

    def latency(self, key: str, confidence: float = 0.95, interval: bool = True) -> Interval:
        """A latency percentile (``ttft_p95_s`` …): pooled over every run's requests with
        its session-bootstrap interval (``n`` = the requests, or gaps, it rests on; NaN
        ends unless ``interval``); the mean of the runs' own (:meth:`metric`) when a
        runner gave summaries only."""
        metric, pct = _latency_key(key)
        if not self.pooled or metric is None:
            return self.metric(key, confidence)
        samples = [r.samples for r in self.runs if r.samples is not None]
        q = pct / 100
        low, high = pooled_interval(samples, metric, q, confidence,
                                    seed=self.seeds[0] if self.seeds else 0,
                                    shared_sessions=self.shared_sessions) \
            if interval else (math.nan, math.nan)
        return Interval(pooled_quantile(samples, metric, q), low, high,
                        pooled_count(samples, metric), confidence)

    def failures(self) -> dict[str, float]:
        """Per failure code (kvsim.metrics.failures), the failed requests per run (mean)."""
        def count(r: RunOutput, c: str) -> float:
            v = _as_float(r.summary.get(f"failed_{c}_requests"))
            return 0.0 if math.isnan(v) else v

        return {c: sum(count(r, c) for r in self.runs) / max(self.n, 1) for c in FAILURE_CODES}

    def metric(self, key: str, confidence: float = 0.95) -> Interval:
        values = [_as_float(r.summary.get(key)) for r in self.runs]
        return mean_interval(values, confidence)

    def peak(self, key: str) -> float:
        """Largest value over runs (for peaks such as ``peak_device_fraction``)."""
        values = [_as_float(r.summary.get(key)) for r in self.runs]
        finite = [v for v in values if not math.isnan(v)]
        return max(finite) if finite else float("nan")

    def table(self) -> pd.DataFrame:
        """One row per replication: seed, oom (bool), oom_reason, then the summary keys."""
        rows = [{"seed": s, "oom": bool(r.oom_reason), "oom_reason": r.oom_reason, **r.summary}
                for s, r in zip(self.seeds, self.runs)]
        return pd.DataFrame(rows)


def _latency_key(key: str) -> tuple[str | None, int]:
    """``ttft_p95_s`` → ("ttft", 95); (None, 0) for a key that is no latency percentile."""
    parts = key.removesuffix("_s").split("_")
    if len(parts) == 2 and parts[0] in ("ttft", "itl", "e2e") and parts[1][:1] == "p" \
            and parts[1][1:].isdigit():
        return parts[0], int(parts[1][1:])
    return None, 0


def _as_float(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


def replicate(scenario: Scenario, n: int, *, executor: Executor | None = None,
              runner: Runner = simulate_run, stream: str = "replications",
              progress: Callable[[int], None] | None = None) -> ReplicationSet:
    """Run ``scenario`` under ``n`` seeds split from ``scenario.seed``."""
    seeds = replication_seeds(scenario.seed, n, stream)
    variants = [scenario.model_copy(update={"seed": s}) for s in seeds]
    runs = run_all(variants, executor=executor, runner=runner, progress=progress)
    return ReplicationSet(scenario_hash(scenario), tuple(seeds), tuple(runs),
                          shared_sessions=scenario.workload.trace is not None)


def run_all(scenarios: Sequence[Scenario], *, executor: Executor | None = None,
            runner: Runner = simulate_run,
            progress: Callable[[int], None] | None = None) -> list[RunOutput]:
    """Run every scenario (any order), return outputs in input order."""
    ex = executor or InlineExecutor()
    out: list[RunOutput | None] = [None] * len(scenarios)
    for i, res in ex.imap_unordered(call_runner, [(runner, s) for s in scenarios]):
        out[i] = res
        if progress is not None:
            progress(1)
    return [r for r in out if r is not None]
