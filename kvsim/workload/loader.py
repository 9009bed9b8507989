"""The simulator's entry point to workloads: a WorkloadConfig → a stream of sessions.

``preset`` → the household generator (``params`` deep-merged into the preset before
validation); ``trace`` → streamed from a ``.jsonl``/``.parquet`` trace file.  Then
``max_sessions`` down-samples whole sessions (reservoir sampling, so a trace file is
still read once in bounded memory) and ``time_scale`` multiplies arrival times.

NOTE: the result is always sorted by first ``start_s``; a trace file out of order is
an InputError (sort it with ``kvsim trace sample``/``import --sort``).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvsim.config.workload import WorkloadConfig
from kvsim.errors import InputError, capacity_hint
from kvsim.workload.generator import stream_sessions
from kvsim.workload.io import count_sessions, iter_sessions
from kvsim.workload.preset import load_preset
from kvsim.workload.sampling import reservoir, scale_time
from kvsim.workload.schema import Session


def load_workload(cfg: WorkloadConfig, seed: int) -> Iterator[Session]:
    """Sessions of a scenario's workload, sorted by first ``start_s``."""
    if cfg.preset is not None:
        preset = load_preset(cfg.preset, cfg.params, field="workload.preset")
        source: Iterator[Session] = stream_sessions(preset, cfg.days, seed, cfg.start_weekday,
                                                    field="workload.days")
    elif cfg.trace is not None:
        if cfg.params:
            raise InputError("workload.params", cfg.params, "only apply to a preset")
        for key, default in (("days", 1.0), ("start_weekday", 0)):
            if getattr(cfg, key) != default:  # NOTE: 1 day / Monday: a preset's defaults
                raise InputError(f"workload.{key}", getattr(cfg, key), "applies to a preset "
                                 "only: a trace is read whole (cut it with "
                                 "sim.max_sim_time_s or workload.max_sessions)")
        source = iter_sessions(cfg.trace)
    else:
        raise InputError("workload", None, "give a preset or a trace")
    if cfg.max_sessions is not None:
        source = iter(reservoir(source, cfg.max_sessions, seed))
    return scale_time(source, cfg.time_scale)


def check_trace_size(cfg: WorkloadConfig, max_requests: int) -> None:
    """Refuse at once a trace file with more sessions than one run may hold requests
    (every session is at least one request), unless ``max_sessions`` brings it under.

    NOTE: only for a run that is not cut by ``sim.max_sim_time_s`` (the caller's test):
    a trace cut by time may fit, and then only the run itself can tell.
    """
    if cfg.trace is None or (cfg.max_sessions is not None and cfg.max_sessions <= max_requests):
        return
    if count_sessions(cfg.trace, limit=max_requests) > max_requests:
        raise InputError("workload.trace", f"{cfg.trace}: over {max_requests:,} sessions",
                         capacity_hint(max_requests))
