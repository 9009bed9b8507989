"""Service-level objectives and planning constraints.

A household's answer is "the largest context × concurrency that keeps p95 latency
and long-context recall on target while staying at or under ~85 % of device
memory" (docs/design/DESIGN.md §1).  This module turns the command-line form of those targets
(``--slo ttft_p95=2s --slo itl_p95=150ms --max-device-fraction 0.85
--max-oom-risk 0.01 --min-recall 0.95``) into :class:`Constraints`, and judges a
point's estimates against them: each constraint's value, limit, slack and the
*binding* one (most violated when infeasible, tightest when feasible).

NOTE: latency SLOs are upper bounds on summary keys of the Results contract
(``ttft_p95_s`` …); recall is the accuracy proxy ``recall_mean`` (docs/policies.md).  A
run whose summary has no measured ``recall_mean`` — absent, or null when its
workload had no reference events to score (an imported trace) — is scored 1.0 (no
recall target can be missed where none was measured) and the evaluation carries a
note saying so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvsim.config.slo import (  # noqa: F401 - part of this module's API
    LATENCY_METRICS,
    MAX_SLO_S,
    PERCENTILES,
    LatencyBound,
    parse_slo,
)
from kvsim.errors import InputError
from kvsim.metrics.accuracy import recall_measured

RECALL_KEY = "recall_mean"
MEMORY_CONSTRAINTS = ("load", "device_fraction")


def measured_recall(summary: dict) -> bool:
    """Does ``summary`` hold a measured ``recall_mean``
    (:func:`kvsim.metrics.accuracy.recall_measured`)?"""
    return recall_measured(summary, RECALL_KEY)


@dataclass(frozen=True)
class Check:
    """One constraint judged on one point."""

    name: str
    value: float
    limit: float
    ok: bool
    slack: float  # relative margin: > 0 inside, < 0 violated


@dataclass(frozen=True)
class Constraints:
    latency: tuple[LatencyBound, ...] = ()
    max_device_fraction: float = 0.85
    max_oom_risk: float = 0.01
    min_recall: float | None = None

    def describe(self) -> list[str]:
        out = [f"{b.name} <= {b.limit_s:g} s" for b in self.latency]
        out.append(f"peak device fraction <= {self.max_device_fraction:g}")
        out.append(f"OOM risk <= {self.max_oom_risk:g}")
        if self.min_recall is not None:
            out.append(f"recall >= {self.min_recall:g}")
        return out


@dataclass(frozen=True)
class Verdict:
    feasible: bool
    binding: str
    checks: tuple[Check, ...]
    notes: tuple[str, ...] = field(default=())


def build_constraints(slos: list[str] | tuple[str, ...] = (), *,
                      max_device_fraction: float = 0.85, max_oom_risk: float = 0.01,
                      min_recall: float | None = None) -> Constraints:
    """Parse and cross-check every target; contradictions are InputErrors."""
    bounds: dict[str, LatencyBound] = {}
    for text in slos:
        b = parse_slo(text)
        prev = bounds.get(b.key)
        if prev is not None and prev.limit_s != b.limit_s:
            raise InputError("--slo", text, f"contradicts {prev.name}={prev.limit_s:g}s given "
                             "earlier; give each metric once")
        bounds[b.key] = b
    _check_percentile_order(bounds)
    if not 0 < max_device_fraction <= 1:
        raise InputError("--max-device-fraction", max_device_fraction, "a fraction in (0, 1]")
    if not 0 <= max_oom_risk <= 1:
        raise InputError("--max-oom-risk", max_oom_risk, "a probability in [0, 1]")
    if min_recall is not None and not 0 <= min_recall <= 1:
        raise InputError("--min-recall", min_recall, "a recall score in [0, 1]")
    return Constraints(tuple(bounds.values()), float(max_device_fraction), float(max_oom_risk),
                       None if min_recall is None else float(min_recall))


def _check_percentile_order(bounds: dict[str, LatencyBound]) -> None:
    """NOTE: p50 <= p95 <= p99 always, so a *lower* percentile given a *larger*
    bound than a higher one is redundant, not contradictory; but TTFT <= E2E per
    request, so an E2E bound below the TTFT bound at the same percentile makes the
    TTFT bound unreachable as stated — the user mixed them up: refuse."""
    for pct in PERCENTILES:
        t, e = bounds.get(f"ttft_{pct}_s"), bounds.get(f"e2e_{pct}_s")
        if t is not None and e is not None and e.limit_s < t.limit_s:
            raise InputError("--slo", f"e2e_{pct}={e.limit_s:g}s",
                             f"end-to-end bound below ttft_{pct}={t.limit_s:g}s; e2e includes "
                             "the first token, so one of them is wrong")


def _check(name: str, value: float, limit: float, upper: bool) -> Check:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return Check(name, float("nan"), limit, False, -math.inf)
    ok = value <= limit if upper else value >= limit
    scale = abs(limit) if limit else 1.0
    slack = (limit - value) / scale if upper else (value - limit) / scale
    return Check(name, float(value), float(limit), bool(ok), float(slack))


def judge(c: Constraints, estimates: dict[str, float], *, loads: bool = True) -> Verdict:
    """Judge one point's estimates (keys: summary latency keys, ``device_fraction``,
    ``oom_risk``, optionally ``recall``).  ``loads=False`` → infeasible, binding 'load'."""
    notes: list[str] = []
    if not loads:
        chk = Check("load", 1.0, 0.0, False, -math.inf)
        return Verdict(False, "load", (chk,), ("the model and KV pool do not load on this card",))
    checks = [_check(b.name, estimates.get(b.key, float("nan")), b.limit_s, True)
              for b in c.latency]
    checks.append(_check("device_fraction", estimates.get("device_fraction", float("nan")),
                         c.max_device_fraction, True))
    checks.append(_check("oom_risk", estimates.get("oom_risk", float("nan")),
                         c.max_oom_risk, True))
    if c.min_recall is not None:
        recall = estimates.get("recall")
        if recall is None or math.isnan(recall):
            recall = 1.0
            notes.append("no recall measured (no recall_mean, or no reference events in "
                         "the workload); recall taken as 1.0")
        checks.append(_check("recall", recall, c.min_recall, False))
    failing = [k for k in checks if not k.ok]
    pool = failing or checks
    binding = min(pool, key=lambda k: k.slack).name
    return Verdict(not failing, binding, tuple(checks), tuple(notes))
