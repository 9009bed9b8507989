"""Sweeps: a base scenario, factors over dotted keys, one combined table.

A ``SWEEP.yaml`` names a ``base`` scenario (path, bundled name or inline mapping) and either
``factors`` (factorial product; ``a,b`` keys are linked) or listed ``points``. File paths it
gives are read from the sweep file's folder (an engine context as ``--set`` sets it).
Points that resolve to the same scenario share one simulation.

NOTE: every point is resolved to a full :class:`Scenario` before anything runs: a bad key or
value, an unreadable file, an empty grid or a key set twice is an InputError naming the point,
and the result store is never touched. A key must exist in the resolved scenario (defaults
count); only ``workload.params`` is an open mapping.
NOTE: an engine that refuses to start is a ``cannot_start`` row, not an error; a point that
fails while running is marked ``failed`` and the others still run and are stored.
Design: docs/design/sweeps.md (the file format).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from kvsim.config.catalog import bundled_path, load_raw, read_yaml
from kvsim.config.files import no_such_file
from kvsim.errors import InputError, from_validation_error, short_value
from kvsim.plan.executor import Executor, InlineExecutor
from kvsim.plan.replicate import Runner, RunOutput, call_runner, simulate_keep
from kvsim.plan.store import ResultStore, results_key, write_table
from kvsim.plan.sweep_checks import (
    check_latency,
    check_workload,
    find,
    one_factor_per_key,
    set_twice,
    start_refusal,
)
from kvsim.scenario import Scenario, drop_rival_key, resolve_scenario, scenario_hash

OPEN_MAPPINGS = ("workload.params",)
_PROFILE_KIND = {"gpu": "gpus", "model": "models", "link": "links", "host": "hosts"}
_YAML, _TRACE = (".yaml", ".yml"), (".jsonl", ".parquet")
CANNOT_START, LOAD_FAILED = "cannot_start", {"failure_code": "oom_at_load"}


class SweepSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "sweep"
    base: str | dict[str, Any]
    factors: dict[str, list[Any]] | None = None
    points: list[dict[str, Any]] | None = None

    @field_validator("base", mode="before")
    @classmethod
    def _base_shape(cls, v: Any) -> Any:
        if not isinstance(v, str | dict):
            raise InputError("base", v, "a scenario YAML path, a bundled scenario name or an "
                             "inline scenario mapping")
        return v

    @model_validator(mode="after")
    def _one_grid(self) -> SweepSpec:
        if (self.factors is None) == (self.points is None):
            raise ValueError("give exactly one of 'factors' (factorial) or 'points' (listed)")
        return self


@dataclass(frozen=True)
class SweepPoint:
    index: int
    params: dict[str, Any]  # as the sweep file gives them
    scenario: Scenario
    hash: str
    key: str  # the result store's key (kvsim.plan.store.results_key)
    refused: str = ""  # why the engine cannot start ("" = it starts)


def load_sweep(path: str | Path) -> tuple[SweepSpec, Path]:
    """The sweep and its folder (absolute: the paths it gives are read from there)."""
    p = Path(path)
    if not p.is_file():
        raise no_such_file("sweep", path, "a sweep .yaml file")
    raw = read_yaml(p, "sweep")
    try:
        return SweepSpec.model_validate(raw), Path(os.path.abspath(p)).parent
    except ValidationError as exc:
        raise from_validation_error(exc, prefix="sweep") from None


def _base_raw(spec: SweepSpec, base_dir: Path) -> tuple[dict[str, Any], Path]:
    if isinstance(spec.base, dict):
        return {k: anchored(k, v, base_dir) for k, v in spec.base.items()}, base_dir
    p = Path(spec.base) if Path(spec.base).is_absolute() else base_dir / spec.base
    if not p.is_file():
        if spec.base.endswith(_YAML):
            raise InputError("sweep.base", spec.base, f"file not found (looked in {base_dir})")
        p = bundled_path("scenarios", spec.base)
    return read_yaml(p, "sweep.base"), p.parent


def anchored(key: str, value: Any, folder: Path) -> Any:
    """``value`` of sweep key ``key`` with the file paths it gives (a trace, a calibration
    artifact, a preset or profile YAML) made absolute against ``folder``."""
    if isinstance(value, dict) and key in ("workload", "latency"):
        return {k: anchored(f"{key}.{k}", v, folder) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    yaml_file = value.endswith(_YAML) and key in ("workload", "workload.preset", *_PROFILE_KIND)
    trace_file = key == "workload" and value.endswith(_TRACE)
    is_path = key in ("workload.trace", "latency.path") or yaml_file or trace_file
    return str(folder / value) if is_path and not Path(value).is_absolute() else value


def grid(spec: SweepSpec) -> list[dict[str, Any]]:
    """The points of the sweep, each a ``{dotted.key: value}`` mapping."""
    if spec.points is not None:
        pts = [dict(p) for p in spec.points]
        if not pts or any(not p for p in pts):
            raise InputError("sweep.points", spec.points, "a non-empty list of non-empty mappings")
        for i, p in enumerate(pts):
            set_twice(p, f"sweep.points.{i}")
        return pts
    assert spec.factors is not None
    if not spec.factors:
        raise InputError("sweep.factors", {}, "at least one factor with at least one value")
    one_factor_per_key(spec.factors)
    axes: list[list[dict[str, Any]]] = []
    for key, values in spec.factors.items():
        if not values:
            raise InputError(f"sweep.factors.{key}", values, "at least one value (empty grid)")
        axes.append([_linked(key, v) for v in values])
    pts = [dict(kv for part in combo for kv in part.items()) for combo in itertools.product(*axes)]
    for p in pts:
        set_twice(p, "sweep.factors")
    return pts


def _linked(key: str, value: Any) -> dict[str, Any]:
    keys = [k.strip() for k in key.split(",")]
    if len(keys) == 1:
        return {keys[0]: value}
    if not isinstance(value, (list, tuple)) or len(value) != len(keys):
        raise InputError(f"sweep.factors.{key}", value, f"a list of {len(keys)} values")
    return dict(zip(keys, value))


def lookup(doc: Any, key: str) -> tuple[bool, Any]:
    """(exists, value) of dotted ``key`` in the resolved scenario dump ``doc`` (a key
    inside an open mapping exists, with value None when it is not set)."""
    parts = key.split(".")
    for n in range(1, len(parts)):
        if ".".join(parts[:n]) in OPEN_MAPPINGS:
            return True, find(doc, parts)[1]
    return find(doc, parts)


def key_exists(doc: Any, key: str) -> bool:
    """Does dotted ``key`` name a field of the resolved scenario dump ``doc``?"""
    return lookup(doc, key)[0]


def set_key(raw: dict[str, Any], key: str, value: Any, resolved: dict[str, Any]) -> None:
    """Set dotted ``key`` in a raw scenario mapping, expanding profile names on the way."""
    parts = key.split(".")
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        _settable(node, part, key, parts[i - 1])
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
    _settable(node, last, key, parts[-2] if len(parts) > 1 else key)
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
        drop_rival_key(node, parts)  # NOTE: the key it replaces, as --set does


def _settable(node: Any, part: str, key: str, above: str) -> None:
    """``part`` can be set in ``node`` (a mapping, or a list it indexes), else InputError:
    another key of the point set ``above`` to a value with no keys below it."""
    if isinstance(node, dict) or (isinstance(node, list) and part.isdigit()
                                  and int(part) < len(node)):
        return
    raise InputError("sweep key", key, f"'{above}' is {short_value(node)!r} in this point "
                     "(another key sets it): a key below it cannot be set")


def _expand(top: str, name: str) -> dict[str, Any]:
    if top == "engine":
        return {"preset": name}
    if top == "workload":
        return {"trace": name} if name.endswith((".jsonl", ".parquet")) else {"preset": name}
    if top in _PROFILE_KIND:
        return load_raw(_PROFILE_KIND[top], name)  # NOTE: a fresh copy, safe to edit
    return {}


def expand(spec: SweepSpec, base_dir: Path) -> list[SweepPoint]:
    """Resolve every point to a Scenario, or raise InputError (module docstring)."""
    raw, scen_dir = _base_raw(spec, base_dir)
    base = resolve_scenario(raw, base_dir=scen_dir)
    dump = base.model_dump(mode="json")
    points = grid(spec)
    for key in dict.fromkeys(k for p in points for k in p):
        if not key_exists(dump, key):
            raise InputError("sweep key", key, "not a key of the base scenario (see the "
                             "resolved scenario.json for the available dotted keys)")
    seen = _Seen()
    return [_point(i, params, raw, dump, scen_dir, base_dir, seen)
            for i, params in enumerate(points)]


@dataclass
class _Seen:
    """What :func:`expand` already checked, so each file is read once."""

    digests: dict[str, str]  # path -> sha256 of its content (results_key)
    workloads: set[str]  # check_workload
    latencies: set[str]  # check_latency

    def __init__(self) -> None:
        self.digests, self.workloads, self.latencies = {}, set(), set()


def _point(index: int, params: dict[str, Any], raw: dict[str, Any], dump: dict[str, Any],
           scen_dir: Path, sweep_dir: Path, seen: _Seen) -> SweepPoint:
    doc = json.loads(json.dumps(raw))
    for key in sorted(params, key=lambda k: k.count(".")):  # a mapping before its keys
        set_key(doc, key, anchored(key, params[key], sweep_dir), dump)
    try:
        scen = resolve_scenario(doc, base_dir=scen_dir)
        check_workload(scen, seen.workloads)
        check_latency(scen, seen.latencies)
        refused = start_refusal(scen)
        h = scenario_hash(scen)
        key = results_key(h, scen, seen.digests)
    except InputError as exc:
        raise point_error(index, exc) from None
    return SweepPoint(index, params, scen, h, key, refused)


def point_error(index: int, exc: InputError, note: str = "") -> InputError:
    """``exc`` with the sweep point it belongs to named first (and ``note`` appended)."""
    allowed = f"{exc.allowed} ({note})" if note else exc.allowed
    return InputError(f"sweep point {index} {exc.field}", exc.value, allowed)


@dataclass(frozen=True)
class SweepOutcome:
    table: pd.DataFrame
    ran: int  # distinct scenarios run now (failed ones included)
    skipped: int  # distinct scenarios already stored
    refused: int = 0  # points whose engine cannot start
    error: Exception | None = None  # the first point that failed while running


def pending(points: list[SweepPoint], store: ResultStore,
            summary_only: bool = False) -> list[SweepPoint]:
    """One point per distinct scenario still to run: not stored, or (unless
    ``summary_only``) stored by a ``--summary-only`` run without its full Results."""
    todo: dict[str, SweepPoint] = {}
    for p in points:
        if p.refused or p.key in todo:
            continue
        if not store.has(p.key) or (not summary_only and store.results_dir(p.key) is None
                                    and store.get(p.key).get("summary_only", False)):
            todo[p.key] = p
    return list(todo.values())


def run_sweep(points: list[SweepPoint], store: ResultStore, *,
              executor: Executor | None = None, runner: Runner = simulate_keep,
              progress: Callable[[int], None] | None = None,
              summary_only: bool = False) -> SweepOutcome:
    """Run every distinct scenario still :func:`pending`; store each as it finishes;
    combine.  A point failing while running is in the outcome's ``error``, not raised,
    so the caller writes the table first."""
    todo = pending(points, store, summary_only)
    ex = executor or InlineExecutor()
    failed: list[tuple[SweepPoint, Exception]] = []
    for i, out in ex.imap_unordered(call_point, [(runner, p.scenario) for p in todo]):
        p = todo[i]
        if isinstance(out, Exception):
            failed.append((p, out))
        elif store.has(p.key):  # stored summary-only: add the full Results
            if out.results is not None:
                store.add_results(p.key, out.results)
        else:
            store.put(p.key, _record(p, out, summary_only), out.results)
        if progress is not None:
            progress(1)
    reasons = {p.key: _reason(exc) for p, exc in failed}
    distinct, refused = {p.key for p in points if not p.refused}, [p for p in points if p.refused]
    return SweepOutcome(combined_table(points, store, reasons), ran=len(todo),
                        skipped=len(distinct) - len(todo), refused=len(refused),
                        error=_failure(failed, len(todo)) if failed else None)


def call_point(item: tuple[Runner, Scenario]) -> RunOutput | Exception:
    """Task body of a sweep point: its failure is returned, not raised, so the other
    points in flight finish and are stored."""
    try:
        return call_runner(item)
    except Exception as exc:  # noqa: BLE001 - handed back to run_sweep, reported there
        return exc


def _reason(exc: Exception) -> str:
    return exc.one_line() if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"


def _failure(failed: list[tuple[SweepPoint, Exception]], ran: int) -> Exception:
    """The first failed point's error, the point named; how many others are stored."""
    failed.sort(key=lambda f: f[0].index)
    point, exc = failed[0]
    if not isinstance(exc, InputError):
        return exc  # a bug, not bad input: its own traceback
    others = f"; {len(failed) - 1} other point(s) failed too" if len(failed) > 1 else ""
    return point_error(point.index, exc, f"{ran - len(failed)} other point(s) finished and "
                       f"are stored; the table marks it failed; a rerun runs only the rest{others}")


def _record(p: SweepPoint, out: RunOutput, summary_only: bool) -> dict[str, Any]:
    return {"name": p.scenario.name, "scenario_hash": p.hash, "params": p.params,
            "summary": out.summary, "oom": bool(out.oom_reason), "oom_reason": out.oom_reason,
            "summary_only": summary_only}


def combined_table(points: list[SweepPoint], store: ResultStore,
                   failures: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per point (points sharing a scenario each keep theirs): point, the factor
    keys (where a point does not set one, the value it ran with), scenario_hash, name,
    status (``ok``, ``cannot_start``, ``failed``), reason, oom, oom_reason, then the
    summary keys.  ``failures`` maps store keys of points that failed to their error."""
    keys = list(dict.fromkeys(k for p in points for k in p.params))
    rows: list[dict[str, Any]] = []
    for p in points:
        rec: dict[str, Any]
        if p.refused:
            status, reason = CANNOT_START, p.refused
            rec = {"oom": True, "oom_reason": p.refused, "summary": LOAD_FAILED}
        elif store.has(p.key):
            status, reason, rec = "ok", "", store.get(p.key)
        else:
            status, reason = "failed", (failures or {}).get(p.key, "not run")
            rec = {"oom": None, "oom_reason": ""}
        rows.append({"point": p.index, **_factor_cells(p, keys), "scenario_hash": p.hash,
                     "name": p.scenario.name, "status": status, "reason": reason,
                     "oom": rec.get("oom", False), "oom_reason": rec.get("oom_reason", ""),
                     **rec.get("summary", {})})
    return _typed_factor_columns(pd.DataFrame(rows), keys)


_INT64 = (-(2**63), 2**63 - 1)


def _typed_factor_columns(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Factor columns Parquet can store: a column whose values mix types (``0`` and
    ``true``) or hold an integer beyond int64 is written as JSON text (``"0"``, ``"true"``)."""
    for k in keys:
        vals = [v for v in df[k] if v is not None]
        kinds = {type(v) for v in vals}
        huge = any(type(v) is int and not _INT64[0] <= v <= _INT64[1] for v in vals)
        if len(kinds) > 1 or huge:
            df[k] = [None if v is None else json.dumps(v) for v in df[k]]
    return df


def _factor_cells(p: SweepPoint, keys: list[str]) -> dict[str, Any]:
    dump = p.scenario.model_dump(mode="json") if set(keys) - set(p.params) else {}
    cells = {}
    for k in keys:
        v = p.params[k] if k in p.params else lookup(dump, k)[1]
        cells[k] = v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)
    return cells


def write_outputs(table: pd.DataFrame, root: Path) -> list[Path]:
    paths = [root / "sweep.parquet", root / "sweep.csv"]
    for path in paths:
        write_table(table, path)
    return paths
