"""GPU what-if: the same household and constraints on several cards.

"Which card should I buy?" — for each GPU profile the capacity search
(:func:`kvsim.plan.search.search`) runs on the scenario with only the card (and its
default PCIe link) swapped, and one row summarises the answer: the recommended
configuration, its p95s, memory headroom, OOM risk with its Wilson interval, the
launch price from the profile and the price per feasible concurrent session.
``memory_gib`` is the card's whole memory (a unified-memory machine's RAM),
``usable_gib`` what an engine may allocate of it (``GpuSpec.usable_memory_bytes``:
what the driver reports on a discrete card, the default GPU limit on Apple / Strix
Halo) — ``fit``'s "device memory", what the
peak device fraction and the headroom are fractions of.

NOTE: "feasible concurrent sessions" is the largest ``parallel`` of any feasible
point of the grid (at any context on the grid), so a card is credited with the
concurrency it can really hold under every constraint, not only at the
recommended context.  ``parallel`` means the same on every engine
(:mod:`kvsim.plan.parallel`): sessions each guaranteed its full context — on vLLM /
SGLang a point is feasible only if the pool holds ``parallel`` requests at
``max_model_len``, not merely ``--max-num-seqs parallel``, so the price per session
is not flattered by sequences the pool would preempt.

A candidate may be a box of several GPUs (``2x rtx-3090``, ``rtx-3090+rtx-3060-12gb``):
its price is the sum of the cards' launch prices, its memory the sum of theirs, its
peak device fraction the fullest card's, and its link the cards' default
(:func:`kvsim.config.gpu_set.default_gpu_link`) unless the scenario names one that all
candidates can have.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kvsim.config.gpu_set import gpu_items, gpu_set_display, gpu_set_label
from kvsim.errors import InputError
from kvsim.plan.search import PlanGrid, PlanResult, search
from kvsim.plan.slo import Constraints
from kvsim.scenario import Scenario, resolve_scenario

COMPARE_COLUMNS = (
    "gpu", "display_name", "memory_gib", "usable_gib", "feasible", "best_context_tokens", "best_parallel",
    "kv_dtype", "flags", "ttft_p95_s", "itl_p95_s", "peak_device_fraction",
    "headroom_fraction", "headroom_bytes", "oom_risk", "oom_risk_low", "oom_risk_high",
    "max_parallel", "price_usd", "usd_per_session", "points_feasible", "points_tried",
    "ttft_p95_s_low", "ttft_p95_s_high", "latency_requests", "failed_requests", "verdict",
    "grid_notes")


@dataclass
class CompareResult:
    table: pd.DataFrame
    plans: dict[str, PlanResult]


def with_gpu(scenario: Scenario, gpu: str) -> Scenario:
    """The scenario on another card; the link follows the card's default.

    NOTE: engine defaults the first card decided (SGLang's memory fraction, Ollama's
    VRAM-tiered num_ctx, vLLM's batch budget) are resolved values by now and stay; build
    from the user's own scenario instead (:func:`on_each_gpu`) to have them follow."""
    doc = scenario.model_dump(mode="json")
    doc["gpu"] = gpu
    for key in ("link", "more_gpus", "gpu_link"):
        doc.pop(key, None)
    return resolve_scenario(doc)


def parse_gpus(text: str) -> list[str]:
    """The candidates of ``--gpus A,B,C``: each one card or a set (``2x rtx-3090``,
    ``rtx-3090+rtx-3060-12gb``; kvsim.config.gpu_set), written back as kvsim labels it."""
    names = [gpu_set_label([c if isinstance(c, str) else c.name
                            for c in gpu_items(g.strip(), "--gpus")])
             for g in text.split(",") if g.strip()]
    if not names:
        raise InputError("--gpus", text, "a comma-separated list of GPU profile names "
                         "(a box of several: 2x NAME or NAME+NAME)")
    if len(set(names)) != len(names):
        raise InputError("--gpus", text, "each GPU (or set of GPUs) once")
    return names


def on_each_gpu(scenario: str, sets: list[str], gpus: list[str]) -> dict[str, Scenario]:
    """The user's scenario (a bundled name or a YAML path, with ``--set`` overrides)
    resolved afresh on each card, so every default a real engine derives from the GPU —
    SGLang's memory fraction, Ollama's num_ctx, vLLM's batch budget, the host, the link —
    is that card's."""
    from kvsim.scenario import load_scenario

    return {g: load_scenario(scenario, [*sets, f"gpu={g}"]) for g in gpus}


def compare_gpus(scenario: Scenario, gpus: list[str], constraints: Constraints,
                 grid: PlanGrid, *, search_fn: Callable[..., PlanResult] = search,
                 scenarios: dict[str, Scenario] | None = None,
                 **search_kw: Any) -> CompareResult:
    """Run the capacity search per card; one row per card (in the given order).

    ``search_fn(scenario, constraints, grid, **search_kw)`` defaults to
    :func:`kvsim.plan.search.search` (the CLI wraps it with a progress bar);
    ``scenarios`` (card → scenario, :func:`on_each_gpu`) replaces :func:`with_gpu`."""
    if scenarios is None:  # NOTE: every name checked up front
        scenarios = {g: with_gpu(scenario, g) for g in gpus}
    rows, plans = [], {}
    for g, s in scenarios.items():
        res = search_fn(s, constraints, grid, **search_kw)
        plans[g] = res
        rows.append(_row(s, res, constraints))
    return CompareResult(pd.DataFrame(rows, columns=list(COMPARE_COLUMNS)), plans)


def _row(s: Scenario, res: PlanResult, c: Constraints) -> dict[str, Any]:
    t = res.table
    from kvsim.plan.explain import plan_verdict

    feasible = t[t["feasible"].astype(bool)] if len(t) else t
    rec = res.recommendation or {}
    verdict = plan_verdict(t, res.recommendation, c)
    prices = [g.launch_price_usd for g in s.gpus]
    price = None if any(p is None for p in prices) else float(sum(p or 0.0 for p in prices))
    max_par = int(feasible["parallel"].max()) if len(feasible) else 0
    peak = float(rec.get("peak_device_fraction", float("nan")))
    # NOTE: on several GPUs the peak fraction is the fullest card's; its headroom is
    # counted on the smallest card, the one a mixed box runs out of first
    smallest = min(g.usable_memory_bytes for g in s.gpus)
    return {
        "gpu": gpu_set_label([g.name for g in s.gpus]), "display_name": gpu_set_display(s.gpus),
        "memory_gib": sum(g.memory_bytes for g in s.gpus) / 2**30,
        "usable_gib": sum(g.usable_memory_bytes for g in s.gpus) / 2**30,
        "feasible": bool(rec),
        "best_context_tokens": int(rec.get("context_tokens", 0)),
        "best_parallel": int(rec.get("parallel", 0)), "kv_dtype": rec.get("kv_dtype", ""),
        "flags": rec.get("flags", ""),
        "ttft_p95_s": rec.get("ttft_p95_s", float("nan")),
        "itl_p95_s": rec.get("itl_p95_s", float("nan")),
        "peak_device_fraction": peak,
        "headroom_fraction": c.max_device_fraction - peak,
        "headroom_bytes": (c.max_device_fraction - peak) * smallest,
        "oom_risk": rec.get("oom_risk", float("nan")),
        "oom_risk_low": rec.get("oom_risk_low", float("nan")),
        "oom_risk_high": rec.get("oom_risk_high", float("nan")),
        "max_parallel": max_par, "price_usd": price,
        "usd_per_session": price / max_par if price is not None and max_par else float("nan"),
        "points_feasible": len(feasible), "points_tried": len(t),
        "ttft_p95_s_low": rec.get("ttft_p95_s_low", float("nan")),
        "ttft_p95_s_high": rec.get("ttft_p95_s_high", float("nan")),
        "latency_requests": rec.get("latency_requests", float("nan")),
        "failed_requests": rec.get("failed_requests", float("nan")),
        "verdict": "; ".join(verdict).removeprefix("verdict: "),
        "grid_notes": "; ".join(res.grid_notes),
    }
