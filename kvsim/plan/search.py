"""Capacity search: the largest context × parallel that meets every constraint.

For each KV dtype and policy set, every (context, parallel) point of the grid is
judged against :class:`~kvsim.plan.slo.Constraints`:

1. **static** (exact, cheap): the engine's load-time layout
   (:func:`kvsim.engines.budget.memory_budget`).  A point that does not load, whose
   reservation alone exceeds the device-fraction limit, or (vLLM / SGLang) whose block
   pool holds fewer than ``parallel`` full-length requests (binding ``kv_pool``: what
   ``parallel`` means, :mod:`kvsim.plan.parallel`) is infeasible.
2. **pruning by monotonicity**: the reservation grows with context and with
   parallel, so every point that dominates (≥ in both) a memory-infeasible point
   is marked infeasible *without* being evaluated — then **verified**: the pruned
   points on the boundary (the minimal ones) are evaluated statically and by
   simulation; one that turns out feasible voids the assumption for its group,
   and every pruned point of that group is evaluated after all.
3. **simulated**: N seeded replications (:mod:`kvsim.plan.replicate`) give p95
   latencies pooled over all their requests with a bootstrap CI over sessions, peak
   device fraction and OOM risk with a Wilson interval (:mod:`kvsim.plan.point_row`).

The Pareto front is the feasible points not dominated in (context, parallel) by
another feasible point; the recommendation maximises context × parallel (the
session-tokens held at once), ties broken by the order of ``--kv`` (first = most
preferred) and then by p95 TTFT.  Its engine flags come from
:mod:`kvsim.plan.flags`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvsim.errors import InputError
from kvsim.plan.executor import Executor
from kvsim.plan.flags import (
    check_contexts,
    configure,
    engine_flags,
    flag_notes,
    point_parallel,
)
from kvsim.plan.parallel import full_length_held, short_pool_note
from kvsim.plan.point_row import estimates as _estimates
from kvsim.plan.point_row import point_row
from kvsim.plan.replicate import Runner, replicate, simulate_run
from kvsim.plan.slo import Check, Constraints, Verdict, judge
from kvsim.plan.stats import wilson_interval
from kvsim.scenario import Scenario, scenario_hash

MEMORY_BINDINGS = ("load", "offload", "device_fraction", "kv_pool")


MAX_REPLICATIONS = 1000
"""The most seeded runs per grid point: enough for --conservative's Wilson bound to reach
an OOM risk of 0.005; more is hours per point."""


@dataclass(frozen=True)
class PlanGrid:
    contexts: tuple[int, ...]
    parallels: tuple[int, ...]
    kv_dtypes: tuple[str | None, ...] = (None,)  # None = the scenario's own
    policies: tuple[tuple[str, tuple[dict[str, Any], ...] | None], ...] = (("scenario", None),)

    def __post_init__(self) -> None:
        for name, values in (("--contexts", self.contexts), ("--parallel", self.parallels),
                             ("--kv", self.kv_dtypes), ("--policy", self.policies)):
            if not values:
                raise InputError(name, list(values), "at least one value (empty grid)")
        for name, values in (("--contexts", self.contexts), ("--parallel", self.parallels)):
            bad = [v for v in values if int(v) < 1]
            if bad:
                raise InputError(name, ",".join(map(str, bad)), "each value >= 1")


@dataclass
class PlanResult:
    table: pd.DataFrame          # one row per point tried (see PLAN_COLUMNS in the report)
    front: pd.DataFrame          # the Pareto front (feasible, non-dominated rows)
    recommendation: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    grid_notes: list[str] = field(default_factory=list)  # the grid's edge (kvsim.plan.widen)


@dataclass
class _Point:
    kv: str | None
    policy: str
    context: int
    parallel: int
    scenario: Scenario | None = None
    row: dict[str, Any] = field(default_factory=dict)
    error: InputError | None = None  # why this point's configuration is invalid
    session_tokens: int = 0  # what one session may hold in its layout (0: unknown)



def _invalid_row(p: _Point, exc: InputError, base_kv: str = "") -> dict[str, Any]:
    """A point whose configuration the engine refuses (``base_kv``: the scenario's KV
    type, the point's group when the grid does not vary it)."""
    p.error = exc
    kv = p.kv or (p.scenario.engine.cache_type_k if p.scenario else base_kv)
    return {"kv_dtype": kv, "policy": p.policy, "context_tokens": p.context,
            "parallel": p.parallel, "feasible": False, "binding": "config",
            "tightest": "config", "evaluated": "invalid", "notes": exc.one_line()}


def _refuse_invalid_groups(pts: list[_Point]) -> None:
    """A KV type or policy set that no grid point accepts is bad input, not a plan."""
    groups: dict[tuple[str | None, str], list[_Point]] = {}
    for p in pts:
        groups.setdefault((p.kv, p.policy), []).append(p)
    for members in groups.values():
        if all(m.error is not None for m in members):
            raise members[0].error  # type: ignore[misc]


def _static(scenario: Scenario) -> tuple[bool, bool, float, Verdict | None, int]:
    """(loads, every layer on the GPU, device fraction, the pool verdict, the tokens one
    session may hold) of the load-time layout; the pool verdict is None unless a paged
    pool holds fewer than ``parallel`` full-length requests."""
    from kvsim.engines.budget import box_reserves, memory_budget

    par = point_parallel(scenario)
    b = memory_budget(scenario.gpu, scenario.model, scenario.weights, scenario.engine,
                      parallel=par, **box_reserves(scenario))
    held, why = full_length_held(b), short_pool_note(b, par)
    pool = None if held is None or why is None else Verdict(
        False, "kv_pool", (Check("kv_pool", float(held), float(par), False,
                                 (held - par) / par),), (why,))
    return (bool(b.fits), bool(b.all_layers_on_gpu), float(b.device_fraction), pool,
            int(b.slot_tokens))


def _memory_verdict(fraction: float, limit: float) -> Verdict:
    slack = (limit - fraction) / limit
    return Verdict(False, "device_fraction",
                   (Check("device_fraction", fraction, limit, False, slack),))


class _Evaluator:
    def __init__(self, c: Constraints, n: int, executor: Executor | None, runner: Runner,
                 conservative: bool, progress: Callable[[int], None] | None,
                 known: dict[str, dict[str, Any]] | None = None) -> None:
        self.c, self.n, self.executor, self.runner = c, n, executor, runner
        self.conservative, self.progress = conservative, progress
        self.known = known or {}  # scenario hash → a row judged before (a widened grid)

    def static_verdict(self, p: _Point) -> tuple[Verdict | None, float]:
        """Memory verdict at load; None when the point must be simulated."""
        assert p.scenario is not None
        loads, on_gpu, frac, pool, p.session_tokens = _static(p.scenario)
        if not loads:
            return judge(self.c, {}, loads=False), frac
        if not on_gpu:
            # NOTE: llama.cpp's --fit / Ollama spill layers to the CPU instead of failing;
            # the reported fraction then *falls* as the KV grows.  Counting the spill as a
            # memory verdict keeps the memory region monotone (and the plan on the GPU).
            chk = Check("offload", 1.0, 0.0, False, -math.inf)
            why = "weights spill to the CPU: the KV reservation pushed layers off the GPU"
            return Verdict(False, "offload", (chk,), (why,)), frac
        if frac > self.c.max_device_fraction:
            return _memory_verdict(frac, self.c.max_device_fraction), frac
        return pool, frac

    def evaluate(self, p: _Point, replications: int | None = None,
                 force_sim: bool = False) -> dict[str, Any]:
        """Static verdict first; simulate when it passes (or when ``force_sim``); a row
        judged before under the same constraints is reused."""
        if p.scenario is None:
            return p.row
        row = self.known.get(scenario_hash(p.scenario))
        if row is not None and (not force_sim or row.get("replications")):
            return dict(row)
        verdict, frac = self.static_verdict(p)
        if verdict is not None and not force_sim:
            return point_row(p, verdict, "static", None, frac)
        try:
            reps = replicate(p.scenario, replications or self.n, executor=self.executor,
                             runner=self.runner, progress=self.progress)
        except InputError as exc:  # the simulator refused this configuration
            if verdict is None:  # e.g. a policy window larger than this point's context
                return _invalid_row(p, exc)
            return {**point_row(p, verdict, "static", None, frac), "notes": exc.one_line()}
        sim = judge(self.c, _estimates(reps, self.c, self.conservative, frac))
        keys = tuple(b.key for b in self.c.latency)
        return point_row(p, verdict or sim, "simulated", reps, frac, keys) | {
            "sim_feasible": sim.feasible}


def _points(scenario: Scenario, grid: PlanGrid, c: Constraints) -> list[_Point]:
    pts = []
    for kv in grid.kv_dtypes:
        for label, policies in grid.policies:
            for par in sorted(set(grid.parallels)):
                for ctx in sorted(set(grid.contexts)):
                    p = _Point(kv, label, int(ctx), int(par))
                    try:
                        p.scenario = configure(scenario, p.context, p.parallel, kv, policies,
                                               c.max_device_fraction)
                    except InputError as exc:
                        p.row = _invalid_row(p, exc, scenario.engine.cache_type_k)
                    pts.append(p)
    return pts


def _dominates(a: _Point, b: _Point) -> bool:
    return (a.kv, a.policy) == (b.kv, b.policy) and b.context >= a.context \
        and b.parallel >= a.parallel


def search(scenario: Scenario, constraints: Constraints, grid: PlanGrid, *,
           replications: int = 8, executor: Executor | None = None,
           runner: Runner = simulate_run, conservative: bool = False,
           progress: Callable[[int], None] | None = None,
           known: pd.DataFrame | None = None) -> PlanResult:
    """Judge every grid point (pruning memory-dominated ones, verified) → PlanResult.

    ``known``: the table of an earlier search with the same constraints and runs (a
    grid being widened, :mod:`kvsim.plan.widen`): its points are not judged again."""
    if not 1 <= replications <= MAX_REPLICATIONS:
        raise InputError("--replications", replications, f"between 1 and {MAX_REPLICATIONS:,} "
                         "(each is one whole run of the scenario per grid point)")
    if conservative:
        if replications < 2:
            raise InputError("--replications", replications, "at least 2 with --conservative: "
                             "one run gives no confidence interval to bound")
        _check_reachable(constraints.max_oom_risk, replications)
    check_contexts(grid.contexts, scenario.model)
    rows = {} if known is None or "scenario_hash" not in known else {
        str(r["scenario_hash"]): r for r in known.to_dict("records") if r["scenario_hash"]}
    ev = _Evaluator(constraints, replications, executor, runner, conservative, progress, rows)
    pts = _points(scenario, grid, constraints)
    _refuse_invalid_groups(pts)
    walls: list[_Point] = []
    pruned: list[_Point] = []
    for p in pts:
        if any(_dominates(w, p) for w in walls):
            pruned.append(p)
            continue
        p.row = ev.evaluate(p)
        if p.row.get("binding") in MEMORY_BINDINGS:
            walls.append(p)
    _refuse_invalid_groups([p for p in pts if p not in pruned])
    notes = _verify(ev, pruned)
    table = pd.DataFrame([p.row for p in pts])
    front = pareto_front(table)
    rec = recommend(front, grid, pts)
    return PlanResult(table, front, rec, notes)


def _check_reachable(max_oom_risk: float, n: int) -> None:
    """--conservative judges the OOM risk by its Wilson upper bound, which is above 0
    even with no OOM in ``n`` runs: refuse a limit no point could pass."""
    bound = wilson_interval(0, n).high
    if bound <= max_oom_risk:
        return
    hint = "use a limit above 0"
    if max_oom_risk > 0:  # the fewest runs whose 0-OOM bound passes (it falls with n)
        lo, hi = n, 2 * n
        while wilson_interval(0, hi).high > max_oom_risk:
            lo, hi = hi, 2 * hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if wilson_interval(0, mid).high <= max_oom_risk else (mid, hi)
        hint = f"use at least {hi} replications or a higher limit"
    raise InputError("--max-oom-risk", max_oom_risk, (
        f"unreachable with --conservative and {n} runs: no OOM in {n} runs still bounds "
        f"the risk at {bound:.3f}; {hint}"))


def _memory_wall_holds(ev: _Evaluator, row: dict[str, Any]) -> bool:
    """Is a simulated boundary point memory-infeasible, as its pruning assumed?  Judged
    on memory alone (a peak over the line, or any run out of memory), not on its SLOs
    or on the OOM bound two runs give."""
    return (row.get("binding") in MEMORY_BINDINGS or row.get("oom_count", 0) > 0
            or row.get("peak_device_fraction", 0.0) > ev.c.max_device_fraction)


def _verify(ev: _Evaluator, pruned: list[_Point]) -> list[str]:
    """Check the pruning.  The boundary of the pruned region (its minimal points) is
    simulated (two seeds); every other pruned point gets its exact static layout
    (``verified`` True when that alone is memory-infeasible, NA when only the
    boundary vouches for it).  A boundary point that turns out to fit in memory breaks
    the assumption for its group: all that group's pruned points, the boundary's too,
    are evaluated in full."""
    boundary = [p for p in pruned if not any(q is not p and _dominates(q, p) for q in pruned)]
    broken: set[tuple[str | None, str]] = set()
    for p in pruned:
        if p.scenario is None:
            continue
        if p in boundary:
            row = ev.evaluate(p, replications=min(2, ev.n), force_sim=True)
            ok = _memory_wall_holds(ev, row)
            p.row = {**row, "evaluated": "pruned+simulated", "verified": ok}
            if not ok:
                broken.add((p.kv, p.policy))
            continue
        verdict, frac = ev.static_verdict(p)
        if verdict is not None:
            p.row = {**point_row(p, verdict, "pruned", None, frac), "verified": True}
        else:
            v = _memory_verdict(float("inf"), ev.c.max_device_fraction)  # assumed, by dominance
            p.row = {**point_row(p, v, "pruned", None, frac), "verified": pd.NA,
                     "notes": "inferred from a dominated point's simulated peak memory"}
    for p in pruned:
        if (p.kv, p.policy) in broken and p.scenario is not None:
            p.row = {**ev.evaluate(p), "verified": False}
    if broken:
        return ["monotonicity did not hold for " + ", ".join(
            f"kv={k} policy={q}" for k, q in sorted(broken, key=str))
            + "; every pruned point there was evaluated in full"]
    if pruned:
        return [(f"{len(pruned)} points pruned by memory monotonicity; {len(boundary)} "
                 "boundary points simulated and every pruned point's static layout checked")]
    return []


def pareto_front(table: pd.DataFrame) -> pd.DataFrame:
    """Feasible rows not dominated in (context_tokens, parallel) by another feasible row."""
    if table.empty or "feasible" not in table:
        return table.iloc[0:0]
    feas = table[table["feasible"].astype(bool)]
    keep = []
    for i, r in feas.iterrows():
        dominated = ((feas["context_tokens"] >= r["context_tokens"])
                     & (feas["parallel"] >= r["parallel"])
                     & ((feas["context_tokens"] > r["context_tokens"])
                        | (feas["parallel"] > r["parallel"]))).any()
        if not dominated:
            keep.append(i)
    return feas.loc[keep].sort_values(["context_tokens", "parallel"]).reset_index(drop=True)


def recommend(front: pd.DataFrame, grid: PlanGrid, pts: list[_Point]) -> dict[str, Any] | None:
    """Largest context × parallel on the front; ties → earlier --kv, then lower TTFT."""
    if front.empty:
        return None
    order = {str(k or ""): i for i, k in enumerate(grid.kv_dtypes)}
    ranked = front.assign(
        _tokens=front["context_tokens"] * front["parallel"],
        _kv=front["kv_dtype"].map(lambda k: order.get(str(k), len(order))),
        _ttft=front.get("ttft_p95_s", pd.Series(0.0, index=front.index)).fillna(0.0))
    best = ranked.sort_values(["_tokens", "_kv", "_ttft"], ascending=[False, True, True]).iloc[0]
    rec = {k: v for k, v in best.items() if not str(k).startswith("_")}
    match = next((p for p in pts if p.scenario is not None and p.row.get("scenario_hash")
                  == rec.get("scenario_hash")), None)
    if match is not None and match.scenario is not None:
        rec["flags"] = engine_flags(match.scenario)
        rec["flag_notes"] = flag_notes(match.scenario)
        rec["scenario"] = match.scenario
    return rec
