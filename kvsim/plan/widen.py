"""A grid that caps the answer is widened, up to what memory allows.

When the recommended point — or the feasible point with the most sessions, which
``compare``'s price per session counts — sits at the grid's largest ``parallel`` (or
the recommendation at its largest context), the answer is the grid's, not the card's:
"max par 8" on every card of a ``compare`` is the top of the default grid.
:func:`search_widening` then adds larger values to an axis the user left to its default
and searches again (points already judged are reused,
:func:`kvsim.plan.search.search`'s ``known``), until the answer leaves the edge; on an
axis the user gave (``--parallel 1,2``) it says how far memory would go instead:

- **parallel**: 1.25×, 1.5× and 2× the edge's value, toward the largest ``parallel``
  the edge point's layout holds under the memory line (:func:`kvsim.plan.parallel.slot_max_parallel` /
  :func:`~kvsim.plan.parallel.paged_max_parallel`: each session keeps its context), and
  that largest value itself; at most the engine's own limit;
- **context**: doubled, up to the model's maximum (the search's exact load-time check
  stops it where memory does).

NOTE: the notes (``PlanResult.grid_notes``) say what was added and why, that the answer
is capped by memory or the model rather than the grid, or that it is capped by a grid
the user gave.
Design: docs/design/answers.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvsim.engines import engine_for
from kvsim.engines.budget import box_reserves
from kvsim.engines.config import SlotEngineConfig
from kvsim.errors import InputError
from kvsim.plan.flags import configure
from kvsim.plan.parallel import paged_max_parallel, session_tokens, slot_max_parallel
from kvsim.plan.search import PlanGrid, PlanResult, search
from kvsim.plan.slo import Constraints
from kvsim.scenario import Scenario

MAX_ROUNDS = 6


def memory_parallel(s: Scenario, limit: float) -> int:
    """The largest ``parallel`` at which the recommended point's scenario ``s`` keeps each
    session's context and stays acceptable under ``limit`` (0: none)."""
    from kvsim.engines.budget import memory_budget

    e, cap = s.engine, engine_for(s.engine.preset).max_parallel
    reserves = box_reserves(s)
    if isinstance(e, SlotEngineConfig):
        b = memory_budget(s.gpu, s.model, s.weights, e, **reserves)
        return slot_max_parallel(s.gpu, s.model, s.weights, e, session_tokens(b), limit,
                                 cap=cap, **reserves)
    return paged_max_parallel(s.gpu, s.model, s.weights, e, limit, cap=cap, **reserves)[0]


def _most_parallel(s: Scenario, c: Constraints, grid: PlanGrid, res: PlanResult
                   ) -> tuple[int, int, Scenario | None]:
    """(parallel, context, scenario) of the feasible point with the most sessions (the
    largest context among them): what ``compare``'s price per session counts."""
    t = res.table
    feas = t[t["feasible"].astype(bool)] if len(t) else t
    if feas.empty:
        return 0, 0, None
    row = feas.sort_values(["parallel", "context_tokens"]).iloc[-1]
    kv = row["kv_dtype"] if grid.kv_dtypes != (None,) else None
    policies = dict(grid.policies).get(row["policy"])
    try:
        point = configure(s, int(row["context_tokens"]), int(row["parallel"]), kv, policies,
                          c.max_device_fraction)
    except InputError:
        point = None
    return int(row["parallel"]), int(row["context_tokens"]), point


def _wider(s: Scenario, c: Constraints, grid: PlanGrid, res: PlanResult
           ) -> tuple[tuple[int, ...], tuple[int, ...], list[str]]:
    """(parallels to add, contexts to add, what caps the answer where nothing is)."""
    rec = res.recommendation or {}
    add_p: set[int] = set()
    add_c: tuple[int, ...] = ()
    capped: list[str] = []
    par, ctx = int(rec["parallel"]), int(rec["context_tokens"])
    for p_, ctx_, point in ((par, ctx, rec.get("scenario")), _most_parallel(s, c, grid, res)):
        if p_ < max(grid.parallels) or point is None:
            continue
        most = memory_parallel(point, c.max_device_fraction)
        if most > p_:
            add_p |= {v for v in (-(-5 * p_ // 4), -(-3 * p_ // 2), 2 * p_, most)
                      if p_ < v <= most}
        else:
            capped.append(f"parallel {p_} is the most the layout holds under the "
                          f"{c.max_device_fraction:.0%} line at context {ctx_:,}")
    top = s.model.max_context_tokens
    if ctx >= max(grid.contexts):
        if ctx < top:
            add_c = (min(2 * ctx, top),)
        else:
            capped.append(f"context {ctx:,} is {s.model.name}'s maximum")
    return tuple(sorted(add_p)), add_c, list(dict.fromkeys(capped))


def search_widening(scenario: Scenario, c: Constraints, grid: PlanGrid, *,
                    search_fn: Callable[..., PlanResult] = search,
                    widen: tuple[bool, bool] = (True, True),
                    **search_kw: Any) -> PlanResult:
    """:func:`~kvsim.plan.search.search`, widened while its answer sits on the grid's
    edge (module doc); ``widen``: (parallel, context) may be widened — False for an axis
    the user gave.  ``grid_notes`` say how."""
    res = search_fn(scenario, c, grid, **search_kw)
    added_p: list[int] = []
    added_c: list[int] = []
    capped: list[str] = []
    held: list[str] = []
    for _ in range(MAX_ROUNDS):
        if res.recommendation is None:
            break
        add_p, add_c, capped = _wider(scenario, c, grid, res)
        add_p = tuple(p for p in add_p if p not in grid.parallels)
        add_c = tuple(x for x in add_c if x not in grid.contexts)
        held = ([f"memory allows parallel {max(add_p)} (add it to --parallel)"]
                if add_p and not widen[0] else []) + \
            ([f"context {max(add_c):,} is untried (add it to --contexts)"]
             if add_c and not widen[1] else [])
        add_p, add_c = add_p if widen[0] else (), add_c if widen[1] else ()
        if not add_p and not add_c:
            break
        added_p += add_p
        added_c += add_c
        grid = replace(grid, parallels=grid.parallels + add_p, contexts=grid.contexts + add_c)
        res = search_fn(scenario, c, grid, known=res.table, **search_kw)
    notes = []
    if added_p or added_c:
        what = [f"parallel {', '.join(map(str, sorted(added_p)))}" if added_p else "",
                f"context {', '.join(f'{x:,}' for x in sorted(added_c))}" if added_c else ""]
        notes.append("the answer sat on the grid's edge, so the grid was widened: "
                     + " and ".join(w for w in what if w) + " added (up to what memory allows)")
    if res.recommendation is not None and held:
        notes.append("the answer is capped by the grid you gave: " + "; ".join(held))
    if res.recommendation is not None and capped:
        notes.append("the answer is capped by memory or the model, not the grid: "
                     + "; ".join(capped))
    return replace(res, grid_notes=notes)
