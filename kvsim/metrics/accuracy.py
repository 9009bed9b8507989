"""Recall-accuracy proxy: one score per reference event (docs/reference/kv-policies.md §6.4).

A reference event ("turn 7 depends on that name in turn 1's input") is scored when
its turn is scheduled, from the state of the KV holding the referenced span:

- ``INTACT``: every token is present at full precision, or at ≥ 8 bits (FP8/INT8:
  "~0 PPL", "±0.5 pt", §6.4 first row);
- ``DEGRADED(b)``: present but stored at ``b`` < 8 bits (the lowest over the span);
- ``RECOVERED``: some tokens were demoted or offloaded but a full copy on the host
  was recalled over PCIe (the added latency is reported with the event);
- ``LOST``: some tokens were dropped with no copy anywhere and the server does not
  re-read them (sliding window, budget eviction, truncation);
- ``COLLAPSE``: a *pinned* token of the turn's prompt (attention sinks, the system
  prompt) is gone — every event of that turn collapses (2605.18053, §1.8).

Multipliers ``m`` ∈ [0, 1] are relative to a full cache, per content class
(``exact``: names, numbers, identifiers; ``gist``: topic, summary).  Defaults and
the ranges for sensitivity sweeps are the §6.4 table; RECOVERED is
``p_hit·m(after recall) + (1 − p_hit)·m(miss)`` for exact spans and 1.0 for gist,
where a selector miss reads what the GPU still holds: nothing for an OFFLOADED span
(m(LOST)), the low-bit copy for a QUANT_BACKED one (m(QUANT at ``miss_bits``):
§6.2 "yes with error, promotable", §3.7) — so a recall never scores below leaving
the span demoted.

NOTE: pure Python (no pandas): policies import this module.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from kvsim.config.units import FrozenModel

M = Field  # shorthand below; every multiplier is validated in [0, 1]


class ContentMultipliers(FrozenModel):
    """Score multipliers of one content class (docs/reference/kv-policies.md §6.4)."""

    degraded_4bit: float = M(0.97, ge=0, le=1, description="4-8 bit grouped (q4_0, q5_x, KIVI-4)")
    degraded_3bit: float = M(0.95, ge=0, le=1, description="~3 bit")
    degraded_2bit: float = M(0.70, ge=0, le=1, description="2-bit grouped (KIVI-2)")
    lost: float = M(0.10, ge=0, le=1, description="dropped, no copy")
    lost_deep: float = M(0.05, ge=0, le=1, description="dropped with at most 1/8 of the "
                         "session's context kept (§6.4 range midpoint)")
    collapse: float = M(0.05, ge=0, le=1, description="a pinned block was dropped")


# §6.4 ranges (low, high) for sensitivity sweeps.
RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "exact": {"degraded_4bit": (0.93, 1.00), "degraded_3bit": (0.90, 0.99),
              "degraded_2bit": (0.60, 0.90), "lost": (0.0, 0.4), "lost_deep": (0.0, 0.1),
              "collapse": (0.0, 0.1)},
    "gist": {"degraded_4bit": (0.97, 1.00), "degraded_3bit": (0.98, 0.98),
             "degraded_2bit": (0.97, 0.99), "lost": (0.6, 1.0), "lost_deep": (0.5, 0.8),
             "collapse": (0.0, 0.1)},
}
P_HIT_RANGE = (0.80, 0.99)


class AccuracyConfig(FrozenModel):
    """Editable accuracy-proxy multipliers (scenario key ``accuracy``)."""

    exact: ContentMultipliers = Field(default_factory=ContentMultipliers)
    gist: ContentMultipliers = Field(default_factory=lambda: ContentMultipliers(
        degraded_4bit=0.99, degraded_3bit=0.98, degraded_2bit=0.98, lost=0.90, lost_deep=0.65,
        collapse=0.05))
    p_hit: float = Field(0.95, ge=0, le=1, description="a recall selector notices the span")


INTACT, DEGRADED, RECOVERED, LOST, COLLAPSE = "INTACT", "DEGRADED", "RECOVERED", "LOST", "COLLAPSE"
DEEP_LOSS_KEPT = 1 / 8  # §6.4: "LOST at <= 1/8 kept" has its own, lower multipliers


@dataclass(frozen=True, slots=True)
class Outcome:
    label: str            # INTACT | DEGRADED | RECOVERED | LOST | COLLAPSE
    bits: float = 16.0    # lowest precision read over the span (after any recall)
    added_s: float = 0.0  # recall / promotion latency added to the turn
    kept: float = 1.0     # LOST: share of the session's context still kept
    miss_bits: float | None = None  # RECOVERED: bits a selector miss reads (None: LOST)

    @property
    def name(self) -> str:
        return f"DEGRADED({self.bits:g})" if self.label == DEGRADED else self.label


def _quant_m(m: ContentMultipliers, bits: float) -> float:
    if bits >= 8:
        return 1.0
    if bits >= 4:
        return m.degraded_4bit
    if bits >= 3:
        return m.degraded_3bit
    return m.degraded_2bit


def multiplier(cfg: AccuracyConfig, outcome: Outcome, content: str) -> float:
    """The expected score multiplier of one reference event."""
    m = cfg.exact if content == "exact" else cfg.gist
    if outcome.label == COLLAPSE:
        return m.collapse
    if outcome.label == LOST:
        return m.lost_deep if outcome.kept <= DEEP_LOSS_KEPT else m.lost
    if outcome.label == RECOVERED:
        if content != "exact":
            return 1.0
        miss = m.lost if outcome.miss_bits is None else _quant_m(m, outcome.miss_bits)
        return cfg.p_hit * _quant_m(m, outcome.bits) + (1 - cfg.p_hit) * miss
    return _quant_m(m, outcome.bits)


def classify(*, collapsed: bool, lost: bool, recalled: bool, bits: float,
             added_s: float = 0.0, kept: float = 1.0,
             miss_bits: float | None = None) -> Outcome:
    if collapsed:
        return Outcome(COLLAPSE, bits)
    if lost:
        return Outcome(LOST, bits, kept=kept)
    if recalled:
        return Outcome(RECOVERED, bits, added_s, miss_bits=miss_bits)
    return Outcome(INTACT if bits >= 8 else DEGRADED, bits)


@dataclass(frozen=True, slots=True)
class ScoredEvent:
    time_s: float
    session_id: str
    request_id: str
    content: str
    outcome: Outcome
    m: float


RECALL_SCORES = ("recall_mean", "recall_worst", "recall_share_below_0_5",
                 "recall_session_mean_worst")  # None (JSON null) when nothing was scored


def recall_measured(summary: dict[str, Any], key: str = "recall_mean") -> bool:
    """Does ``summary[key]`` hold a measured recall score: a finite number, not null /
    NaN, and not the 1.0 that results written before scores were null gave beside 0
    reference events?"""
    v = summary.get(key)
    return isinstance(v, numbers.Real) and not isinstance(v, bool) \
        and math.isfinite(float(v)) and summary.get("reference_events") != 0


def recall_summary(events: list[ScoredEvent]) -> dict[str, float | None]:
    """Summary keys: over all events and per session (mean, worst, share below 0.5),
    and the number of events of each outcome.

    NOTE: without reference events (an imported trace has none) nothing was measured:
    the scores are ``None`` — JSON null, "n/a" in the report — not a perfect 1.0;
    the counts stay, at 0.
    """
    out: dict[str, float | None] = {"reference_events": len(events)}
    for label in (INTACT, DEGRADED, RECOVERED, LOST, COLLAPSE):
        out[f"recall_{label.lower()}_events"] = sum(1 for e in events if e.outcome.label == label)

    if not events:
        out.update(dict.fromkeys(RECALL_SCORES), recall_latency_added_s=0.0)
        return out
    ms = [e.m for e in events]
    per: dict[str, list[float]] = {}
    for e in events:
        per.setdefault(e.session_id, []).append(e.m)
    out.update({
        "recall_mean": sum(ms) / len(ms),
        "recall_worst": min(ms),
        "recall_share_below_0_5": sum(1 for m in ms if m < 0.5) / len(ms),
        "recall_session_mean_worst": min(sum(v) / len(v) for v in per.values()),
        "recall_latency_added_s": sum(e.outcome.added_s for e in events),
    })
    return out


def session_recall(events: list[ScoredEvent]) -> dict[str, tuple[float, float, float]]:
    """Per session: (mean, worst, share of events below 0.5)."""
    per: dict[str, list[float]] = {}
    for e in events:
        per.setdefault(e.session_id, []).append(e.m)
    return {s: (sum(v) / len(v), min(v), sum(1 for m in v if m < 0.5) / len(v))
            for s, v in per.items()}
