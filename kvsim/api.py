"""Programmatic entry points (the CLI is a thin layer over these)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvsim.core.build import PoolSizing, check_pool, make_scheduler, scenario_budget
from kvsim.core.engine import Engine
from kvsim.core.step import Scheduler, StepHook
from kvsim.engines import engine_for
from kvsim.latency.base import LatencyModel
from kvsim.latency.factory import make_arrival_noise, make_latency_model
from kvsim.latency.speed_band import speed_band
from kvsim.metrics import records as records_mod
from kvsim.metrics.records import Recorder
from kvsim.metrics.results import Results, references_frame, tables_from
from kvsim.metrics.summary import device_peaks, session_outcomes, summarize
from kvsim.scenario import Scenario, scenario_hash
from kvsim.workload.schema import Session


def weights_residency(scenario: Scenario, budget: Any) -> dict[str, Any]:
    """summary.json's record of whether the weights left on the CPU stay resident in
    host RAM, which the latency model assumes (it reads them at RAM bandwidth): the
    bytes they and the KV there exceed the host by (0: they fit).  Past it, the rest is
    memory-mapped from disk, which no host profile gives a bandwidth for, so the
    predicted speed is too fast (``kvsim simulate`` warns: kvsim.cli.simulate.residency_note)."""
    from kvsim.engines.budget import weights_beyond_ram

    short = weights_beyond_ram(budget, scenario.host)
    return {"weights_exceed_host_ram": bool(short), "weights_beyond_host_ram_bytes": short}


def _slot_cap(scenario: Scenario, sizing: PoolSizing) -> PoolSizing:
    """llama-server caps each slot at the training context ("the slot context (N) exceeds
    the training context of the model (M) - capping"); the pool keeps its -c cells.

    NOTE: so every engine's own limit is at most the model's maximum, and a longer prompt
    fails (or is truncated) as that engine does (kvsim.core.sessions)."""
    most = scenario.model.max_context_tokens
    if engine_for(scenario.engine.preset).caps_slot_at_training_context and \
            sizing.slot_tokens > most:
        return dataclasses.replace(sizing, slot_tokens=most)
    return sizing


def _arrival_delays(scenario: Scenario) -> Callable[[int], list[float]] | None:
    """A session's turn delays (``latency.arrival_delay_s``), None when on time."""
    noise = make_arrival_noise(scenario)
    return None if noise is None else noise.take


def run_fidelity(scenario: Scenario) -> str:
    """The fidelity a run uses: the scenario's, but ``step`` under timing noise.

    NOTE: a jittered step's time is drawn one step at a time, so no decode stretch is
    jumped in closed form (kvsim.latency.jitter); at jitter 0 the scenario's own."""
    return "step" if scenario.latency.steps_jittered else scenario.sim.fidelity


def simulate(scenario: Scenario, *, progress: Callable[[float, int], None] | None = None,
             sessions: Iterable[Session] | None = None, hooks: Sequence[StepHook] = (),
             sizing: PoolSizing | None = None) -> Results:
    """Simulate ``scenario`` and return its :class:`Results`.

    A trace file that holds more sessions than the request cap
    (:data:`kvsim.metrics.records.MAX_REQUESTS`) raises :class:`~kvsim.errors.RunStopped`
    at once; a run that reaches the cap, or whose process grows past
    ``sim.max_rss_bytes``, returns its results up to then with ``Results.stopped`` set.

    ``sessions`` replaces the scenario's workload (tests, replays); ``sizing`` replaces
    the memory budget (tests); ``hooks`` are policy hooks called after every step;
    ``progress(now_s, requests_done)`` is called at every memory sample.  A fitted
    roofline's summary carries its speed band (kvsim.latency.speed_band).
    """
    budget = None
    if sizing is None:
        budget = scenario_budget(scenario)
        sizing = PoolSizing.from_budget(budget)
    sizing = _slot_cap(scenario, sizing)
    check_pool(scenario.engine, sizing, link=scenario.link, host=scenario.host)
    latency = make_latency_model(scenario, budget)
    if sessions is None:
        from kvsim.workload import load_workload
        from kvsim.workload.loader import check_trace_size

        if scenario.sim.max_sim_time_s is None:
            check_trace_size(scenario.workload, records_mod.MAX_REQUESTS)
        sessions = load_workload(scenario.workload, scenario.seed)
    from kvsim.policies.build import wire_policies
    from kvsim.policies.runtime import PolicyRuntime

    wiring = wire_policies(scenario, sizing, latency)  # KV policies + the accuracy proxy
    scheduler = make_scheduler(scenario.engine, sizing, link=scenario.link, host=scenario.host,
                               wiring=wiring)
    runtime = scheduler.policy
    assert isinstance(runtime, PolicyRuntime)  # NOTE: what wire_policies' factory builds
    sessions = runtime.tap(sessions)
    recorder = Recorder(max_requests=records_mod.MAX_REQUESTS,
                        max_rss_bytes=scenario.sim.max_rss_bytes
                        or records_mod.default_rss_limit_bytes())
    engine = Engine(scheduler, latency, recorder=recorder,
                    sample_interval_s=scenario.sim.sample_interval_s, hooks=(*hooks, runtime),
                    after_failure=scenario.workload.after_failure,
                    max_sim_time_s=scenario.sim.max_sim_time_s, progress=progress,
                    fidelity=run_fidelity(scenario), arrival_delays=_arrival_delays(scenario))
    end_s, stop = engine.run(sessions)
    tables = tables_from(recorder)
    summary = _summary(tables, sizing, scheduler, latency, end_s)
    summary.update(runtime.summary())
    if budget is not None:
        summary.update(weights_residency(scenario, budget))
    if (band := speed_band(scenario)) is not None:
        summary.update(band.summary())
    if stop is not None:
        summary["stopped_at_s"] = end_s
        summary["stopped_reason"] = stop.one_line()
    # NOTE: the caller decides what to keep (the CLI saves them, then reports the stop)
    return Results(**tables, summary=summary, scenario=scenario.model_dump(mode="json"),
                   scenario_hash=scenario_hash(scenario),
                   references=references_frame(runtime.scorer.scored), stopped=stop)


def _summary(tables: dict[str, Any], sizing: PoolSizing, scheduler: Scheduler,
             latency: LatencyModel, end_s: float) -> dict[str, Any]:
    """The run's summary metrics from its tables and the engine's counters."""
    summary = summarize(tables["requests"], tables["itl"], tables["memory"], tables["steps"],
                        static_device_bytes=sizing.static_device_bytes,
                        device_bytes=sizing.device_bytes, preemptions=scheduler.preemptions,
                        evictions=scheduler.evictions, sim_time_s=end_s,
                        decode_spread=latency.decode_spread,
                        prefill_spread=latency.prefill_spread)
    summary.update(device_peaks(summary["peak_kv_reserved_bytes"], sizing.devices))
    summary["latency_model"] = latency.provenance
    summary.update(session_outcomes(tables["events"]))
    mem = tables["memory"]
    summary["peak_kv_quant_bytes"] = int(mem["kv_quant_bytes"].max()) if len(mem) else 0
    return summary
