"""Latency targets as users write them: ``ttft_p95=2s``, ``itl_p95: 150ms``.

One parser for ``--slo`` (plan, compare, simulate, report) and a scenario's ``slo``
section; :mod:`kvsim.plan.slo` judges points against the bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kvsim.config.units import parse_duration
from kvsim.errors import InputError

LATENCY_METRICS = ("ttft", "itl", "e2e")
PERCENTILES = ("p50", "p90", "p95", "p99")
_SLO = re.compile(r"^\s*([a-z0-9]+)_(p\d+)\s*(<=|=)\s*(.+?)\s*$")
MAX_SLO_S = 86_400.0  # one day: a larger latency bound is a typo, not a target


@dataclass(frozen=True)
class LatencyBound:
    """``summary[key] <= limit_s`` (e.g. ``ttft_p95_s <= 2.0``)."""

    key: str
    limit_s: float

    @property
    def name(self) -> str:
        return self.key.removesuffix("_s")


def parse_slo(text: str) -> LatencyBound:
    """``'ttft_p95=2s'`` → ``LatencyBound('ttft_p95_s', 2.0)``."""
    m = _SLO.match(text.lower())
    allowed = ("METRIC_PCT=DURATION with METRIC in " + "/".join(LATENCY_METRICS)
               + " and PCT in " + "/".join(PERCENTILES) + ", e.g. ttft_p95=2s")
    if not m or m.group(1) not in LATENCY_METRICS or m.group(2) not in PERCENTILES:
        raise InputError("--slo", text, allowed)
    limit = parse_duration(m.group(4), field=f"--slo {m.group(1)}_{m.group(2)}")
    if not 0 < limit <= MAX_SLO_S:  # NaN fails too
        raise InputError("--slo", text, f"a latency bound in (0, {MAX_SLO_S:g}] s (no run "
                         "can meet 0; a bound over a day bounds nothing)")
    return LatencyBound(f"{m.group(1)}_{m.group(2)}_s", limit)


def slo_section(v: Any) -> dict[str, str]:
    """A scenario's ``slo`` mapping, each target checked as ``--slo`` is."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError("slo", v, "a mapping METRIC_PCT: DURATION, e.g. {ttft_p95: 2s}")
    for key, value in v.items():
        try:
            parse_slo(f"{key}={value}")
        except InputError as exc:
            raise InputError(str(key), value, exc.allowed) from None
    return {str(k): str(value) for k, value in v.items()}
