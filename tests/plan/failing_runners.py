"""Runners that fail on chosen sweep points (for tests/plan/test_sweep_failures.py)."""

from __future__ import annotations

import time

from plan_fake_runners import fake_run

from kvsim.errors import InputError
from kvsim.plan.replicate import RunOutput


def fails_at_parallel_3(scenario) -> RunOutput:
    """Bad input found only while running, on the point with parallel 3; the other
    points take a moment, so they are still in flight when it fails."""
    if scenario.engine.parallel == 3:
        raise InputError("workload.trace", "t.jsonl", "found bad while running")
    time.sleep(0.3)
    return fake_run(scenario)
