"""What a sweep checks of each point before anything runs (:mod:`kvsim.plan.sweep`).

Each check does what the run itself would do first, so bad input is found before the
result store is touched: the workload is resolved (:func:`check_workload`), a
calibration artifact read and matched (:func:`check_latency`), and the engine's
start-up checks made (:func:`start_refusal`) — whose refusal is a *result* (the point's
row says ``cannot_start``), not an error.  Before that, the grid itself: no key may be
set twice (:func:`one_factor_per_key`, :func:`set_twice`).
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from kvsim.config.gpu_set import gpu_set_label
from kvsim.errors import InputError
from kvsim.scenario import Scenario


def one_factor_per_key(factors: dict[str, list[Any]]) -> None:
    """A key swept by two factors (or twice in one linked factor) has no one value."""
    owner: dict[str, str] = {}
    for factor in factors:
        for key in (k.strip() for k in factor.split(",")):
            if key in owner:
                where = (f"twice in factor '{factor}'" if owner[key] == factor
                         else f"by factors '{owner[key]}' and '{factor}'")
                raise InputError("sweep.factors", key, f"set twice ({where}); give each key "
                                 "in one factor only (a linked factor for values that go "
                                 "together)")
            owner[key] = factor


def set_twice(point: dict[str, Any], field: str) -> None:
    """Refuse a key a point sets both directly and inside a mapping it also sets
    (``workload.days`` and ``workload: {days: ...}``); a parent mapping without the
    key is set first, then the key (keys are applied shallowest first)."""
    for key in point:
        parts = key.split(".")
        for n in range(1, len(parts)):
            parent = ".".join(parts[:n])
            if parent in point and _holds(point[parent], parts[n:]):
                raise InputError(field, key, f"set twice: directly and inside '{parent}'")


def _holds(value: Any, path: list[str]) -> bool:
    return find(value, path)[0]


def find(value: Any, path: list[str]) -> tuple[bool, Any]:
    """(found, value) at ``path`` inside nested mappings and lists."""
    for part in path:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


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


def check_latency(scen: Scenario, checked: set[str]) -> None:
    """Read and match a calibrated latency artifact as the run will (InputError if it
    cannot: unreadable, not an artifact, made for another model, no fit for the KV
    type), once per distinct combination in ``checked``."""
    lat, eng = scen.latency, scen.engine
    if lat.kind != "calibrated":
        return
    key = json.dumps([lat.path, scen.model.name, eng.cache_type_k, eng.cache_type_v,
                      lat.out_of_range])
    if key not in checked:
        from kvsim.latency.factory import make_latency_model

        make_latency_model(scen)
        checked.add(key)


def start_refusal(scen: Scenario) -> str:
    """Why the engine would refuse to start this scenario, or ``""``: the start-up checks
    of :func:`kvsim.api.simulate` — the load-time layout fits the card and the host
    (``check_loads``, ``check_host_memory``) and a paged pool holds one
    ``max_model_len`` request (``make_scheduler``).  A layout that cannot be computed,
    or another scheduler setting it rejects, stays an InputError (bad input)."""
    from kvsim.core.build import PoolSizing, check_loads, make_scheduler
    from kvsim.engines.budget import box_reserves, check_host_memory, memory_budget

    b = memory_budget(scen.gpu, scen.model, scen.weights, scen.engine, **box_reserves(scen))
    try:
        check_host_memory(b, scen.host, scen.engine.context_tokens)
        check_loads(b, gpu_set_label([g.name for g in scen.gpus]), scen.model.name)
    except InputError as exc:  # "cannot start on …" / "cannot load on …" say it all
        return exc.allowed if exc.field in ("engine", "model") else exc.one_line()
    try:
        make_scheduler(scen.engine, PoolSizing.from_budget(b), link=scen.link,
                       host=scen.host)
    except InputError as exc:
        if exc.field != "engine.context_tokens":
            raise
        return exc.one_line()
    return ""
