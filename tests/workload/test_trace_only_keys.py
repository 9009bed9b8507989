"""Keys that shape a generated household (params, days, start weekday) do not apply to
a trace, which is read whole: set to anything but a preset's default, they are refused
in one line instead of being silently ignored."""

import pytest

from kvsim.config.workload import WorkloadConfig
from kvsim.errors import InputError
from kvsim.workload.generator import generate
from kvsim.workload.io import write_trace
from kvsim.workload.loader import load_workload
from kvsim.workload.preset import load_preset


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "d1.jsonl"
    write_trace(path, generate(load_preset("family-4"), 1.0, 0, 0))
    return str(path)


@pytest.mark.parametrize("key,value", [("days", 7.0), ("start_weekday", 3)])
def test_preset_keys_beside_a_trace_are_refused(trace, key, value):
    with pytest.raises(InputError) as exc:
        load_workload(WorkloadConfig(trace=trace, **{key: value}), seed=0)
    assert str(exc.value) == (f"workload.{key}: {value!r} — applies to a preset only: a "
                              "trace is read whole (cut it with sim.max_sim_time_s or "
                              "workload.max_sessions)")


def test_a_preset_scenario_switched_to_a_trace_still_loads(trace):
    # quickstart writes days: 1 beside its preset; --set workload.trace keeps that 1
    sessions = list(load_workload(WorkloadConfig(trace=trace, days=1.0), seed=0))
    assert len(sessions) == len(list(generate(load_preset("family-4"), 1.0, 0, 0)))
