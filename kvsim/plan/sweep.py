"""Sweeps: a base scenario, factors over dotted keys, one combined table.

``SWEEP.yaml``::

    name: kv-dtypes
    base: ../scenarios/quickstart.yaml    # a path (relative to this file), a bundled
                                          # scenario name, or an inline mapping
    factors:                              # factorial product ...
      engine.context_tokens: [16384, 32768]
      engine.cache_type_k,engine.cache_type_v: [[f16, f16], [q8_0, q8_0]]  # linked keys
    points:                               # ... or listed points (one of the two)
      - {engine.parallel: 2, engine.context_tokens: 8192}

Every point is resolved to a full :class:`Scenario` *before* anything runs — its
workload too (the preset with its ``workload.params`` validated, a trace file
parsed whole, once per file) — so a key that does not exist in the scenario, a
bad value or an empty grid is an InputError naming the point, and the result
store is never touched.  Points that resolve to the same scenario share one hash
and run once.  A point that still fails while running (e.g. stopped by the
request cap) does not stop the others: every other point runs and is stored,
then the failure is raised, naming the point.

NOTE: a key must exist in the *resolved* scenario (``model_dump``) — defaults
count, so ``engine.parallel`` is valid even when the base YAML only says
``engine: llama.cpp``; only ``workload.params`` is an open mapping.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from kvsim.config.catalog import bundled_path, load_raw, read_yaml
from kvsim.config.scenario import Scenario, resolve_scenario, scenario_hash
from kvsim.errors import InputError, from_validation_error
from kvsim.plan.executor import Executor, InlineExecutor
from kvsim.plan.replicate import Runner, RunOutput, call_runner, simulate_keep
from kvsim.plan.store import ResultStore, results_key, write_table

OPEN_MAPPINGS = ("workload.params",)
_PROFILE_KIND = {"gpu": "gpus", "model": "models", "link": "links", "host": "hosts"}


class SweepSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "sweep"
    base: str | dict[str, Any]
    factors: dict[str, list[Any]] | None = None
    points: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _one_grid(self) -> SweepSpec:
        if (self.factors is None) == (self.points is None):
            raise ValueError("give exactly one of 'factors' (factorial) or 'points' (listed)")
        return self


@dataclass(frozen=True)
class SweepPoint:
    index: int
    params: dict[str, Any]
    scenario: Scenario
    hash: str
    key: str  # the result store's key (kvsim.plan.store.results_key)


def load_sweep(path: str | Path) -> tuple[SweepSpec, Path]:
    p = Path(path)
    if not p.is_file():
        raise InputError("sweep", str(path), "file not found")
    raw = read_yaml(p, "sweep")
    try:
        return SweepSpec.model_validate(raw), p.parent
    except ValidationError as exc:
        raise from_validation_error(exc, prefix="sweep") from None


def _base_raw(spec: SweepSpec, base_dir: Path) -> tuple[dict[str, Any], Path]:
    if isinstance(spec.base, dict):
        return dict(spec.base), base_dir
    p = Path(spec.base)
    p = p if p.is_absolute() else base_dir / p
    if not p.is_file():
        if spec.base.endswith((".yaml", ".yml")):
            raise InputError("sweep.base", spec.base, f"file not found (looked in {base_dir})")
        p = bundled_path("scenarios", spec.base)
    return read_yaml(p, "sweep.base"), p.parent


def grid(spec: SweepSpec) -> list[dict[str, Any]]:
    """The points of the sweep, each a ``{dotted.key: value}`` mapping."""
    if spec.points is not None:
        pts = [dict(p) for p in spec.points]
        if not pts or any(not p for p in pts):
            raise InputError("sweep.points", spec.points, "a non-empty list of non-empty mappings")
        return pts
    assert spec.factors is not None
    if not spec.factors:
        raise InputError("sweep.factors", {}, "at least one factor with at least one value")
    axes: list[list[dict[str, Any]]] = []
    for key, values in spec.factors.items():
        if not values:
            raise InputError(f"sweep.factors.{key}", values, "at least one value (empty grid)")
        axes.append([_linked(key, v) for v in values])
    return [dict(kv for part in combo for kv in part.items()) for combo in itertools.product(*axes)]


def _linked(key: str, value: Any) -> dict[str, Any]:
    keys = [k.strip() for k in key.split(",")]
    if len(keys) == 1:
        return {keys[0]: value}
    if not isinstance(value, (list, tuple)) or len(value) != len(keys):
        raise InputError(f"sweep.factors.{key}", value, f"a list of {len(keys)} values")
    return dict(zip(keys, value))


def key_exists(doc: Any, key: str) -> bool:
    """Does dotted ``key`` name a field of the resolved scenario dump ``doc``?"""
    node = doc
    parts = key.split(".")
    for i, part in enumerate(parts):
        if ".".join(parts[:i]) in OPEN_MAPPINGS:
            return True
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def set_key(raw: dict[str, Any], key: str, value: Any, resolved: dict[str, Any]) -> None:
    """Set dotted ``key`` in a raw scenario mapping, expanding profile names on the way."""
    parts = key.split(".")
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        child = node[int(part)] if isinstance(node, list) else node.get(part)
        if isinstance(child, str) and i == 0:
            child = _expand(part, child)
        elif child is None:
            child = {"preset": resolved["engine"]["preset"]} if (i, part) == (0, "engine") else {}
        if isinstance(node, list):
            node[int(part)] = child
        else:
            node[part] = child
        node = child
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def _expand(top: str, name: str) -> dict[str, Any]:
    if top == "engine":
        return {"preset": name}
    if top == "workload":
        return {"trace": name} if name.endswith((".jsonl", ".parquet")) else {"preset": name}
    if top in _PROFILE_KIND:
        return load_raw(_PROFILE_KIND[top], name)  # NOTE: a fresh copy, safe to edit
    return {}


def expand(spec: SweepSpec, base_dir: Path) -> list[SweepPoint]:
    """Resolve every point to a Scenario (deduplicated by hash), or raise InputError."""
    raw, scen_dir = _base_raw(spec, base_dir)
    base = resolve_scenario(raw, base_dir=scen_dir)
    dump = base.model_dump(mode="json")
    points = grid(spec)
    for key in dict.fromkeys(k for p in points for k in p):
        if not key_exists(dump, key):
            raise InputError("sweep key", key, "not a key of the base scenario (see the "
                             "resolved scenario.json for the available dotted keys)")
    out: list[SweepPoint] = []
    seen: set[str] = set()
    digests: dict[str, str] = {}  # path -> sha256 of its content (results_key)
    checked: set[str] = set()  # workloads already validated (check_workload)
    for i, params in enumerate(points):
        doc = json.loads(json.dumps(raw))
        for key, value in params.items():
            set_key(doc, key, value, dump)
        try:
            scen = resolve_scenario(doc, base_dir=scen_dir)
            check_workload(scen, checked)
        except InputError as exc:
            raise point_error(i, exc) from None
        h = scenario_hash(scen)
        if h not in seen:
            seen.add(h)
            out.append(SweepPoint(i, params, scen, h, results_key(h, scen, digests)))
    return out


def point_error(index: int, exc: InputError, note: str = "") -> InputError:
    """``exc`` with the sweep point it belongs to named first (and ``note`` appended)."""
    allowed = f"{exc.allowed} ({note})" if note else exc.allowed
    return InputError(f"sweep point {index} {exc.field}", exc.value, allowed)


def check_workload(scen: Scenario, checked: set[str]) -> None:
    """Resolve a point's workload as the run will (InputError if it cannot): a preset
    with its ``params`` merged and validated; a trace file parsed whole (contents and
    order), once per distinct workload in ``checked``."""
    from kvsim.workload.loader import check_trace_size, load_workload
    from kvsim.workload.preset import load_preset

    wl = scen.workload
    key = json.dumps([wl.preset, wl.trace, wl.params, wl.max_sessions, wl.days,
                      scen.sim.max_sim_time_s is None], sort_keys=True, default=str)
    if key in checked:
        return
    if wl.preset is not None:
        from kvsim.workload.generator import check_days

        check_days(load_preset(wl.preset, wl.params, field="workload.preset"), wl.days,
                   "workload.days")
    else:
        if scen.sim.max_sim_time_s is None:
            from kvsim.metrics.records import MAX_REQUESTS

            check_trace_size(wl, MAX_REQUESTS)
        deque(load_workload(wl, scen.seed), maxlen=0)
    checked.add(key)


@dataclass(frozen=True)
class SweepOutcome:
    table: pd.DataFrame
    ran: int
    skipped: int


def run_sweep(points: list[SweepPoint], store: ResultStore, *,
              executor: Executor | None = None, runner: Runner = simulate_keep,
              progress: Callable[[int], None] | None = None) -> SweepOutcome:
    """Run every point not yet in ``store``; store each as it finishes; combine."""
    todo = [p for p in points if not store.has(p.key)]
    ex = executor or InlineExecutor()
    failed: list[tuple[SweepPoint, Exception]] = []
    for i, out in ex.imap_unordered(call_point, [(runner, p.scenario) for p in todo]):
        if isinstance(out, Exception):
            failed.append((todo[i], out))
        else:
            store.put(todo[i].key, _record(todo[i], out), out.results)
        if progress is not None:
            progress(1)
    if failed:
        raise _failure(failed, len(todo))
    table = combined_table(points, store)
    return SweepOutcome(table, ran=len(todo), skipped=len(points) - len(todo))


def call_point(item: tuple[Runner, Scenario]) -> RunOutput | Exception:
    """Task body of a sweep point: its failure is returned, not raised, so the other
    points in flight finish and are stored."""
    try:
        return call_runner(item)
    except Exception as exc:  # noqa: BLE001 - handed back to run_sweep, re-raised there
        return exc


def _failure(failed: list[tuple[SweepPoint, Exception]], ran: int) -> Exception:
    """The first failed point's error, the point named; how many others are stored."""
    failed.sort(key=lambda f: f[0].index)
    point, exc = failed[0]
    if not isinstance(exc, InputError):
        return exc  # a bug, not bad input: its own traceback
    stored = ran - len(failed)
    others = f"; {len(failed) - 1} other point(s) failed too" if len(failed) > 1 else ""
    return point_error(point.index, exc, f"{stored} other point(s) finished and are stored; "
                       f"a rerun runs only the rest{others}")


def _record(p: SweepPoint, out: RunOutput) -> dict[str, Any]:
    return {"name": p.scenario.name, "scenario_hash": p.hash, "params": p.params,
            "summary": out.summary, "oom": bool(out.oom_reason), "oom_reason": out.oom_reason}


def combined_table(points: list[SweepPoint], store: ResultStore) -> pd.DataFrame:
    """One row per point: point, the factor keys, scenario_hash, name, oom, summary keys."""
    rows = []
    for p in points:
        rec = store.get(p.key)
        params = {k: v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)
                  for k, v in p.params.items()}
        rows.append({"point": p.index, **params, "scenario_hash": p.hash,
                     "name": p.scenario.name, "oom": rec.get("oom", False),
                     "oom_reason": rec.get("oom_reason", ""), **rec.get("summary", {})})
    return pd.DataFrame(rows)


def write_outputs(table: pd.DataFrame, root: Path) -> list[Path]:
    paths = [root / "sweep.parquet", root / "sweep.csv"]
    for path in paths:
        write_table(table, path)
    return paths
