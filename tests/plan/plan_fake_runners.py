"""Simulate-free runners for testing the planning plumbing (executors, store, sweep).

Each is a top-level function ``Scenario -> RunOutput`` whose summary is a closed-form
function of the scenario, so expected values can be computed by hand in the tests.
"""

from __future__ import annotations

import os
import time

import numpy as np

from kvsim.plan.replicate import RunOutput


def fake_summary(scenario) -> dict:
    e = scenario.engine
    par = getattr(e, "parallel", None) or getattr(e, "max_num_seqs", 1)
    return {"ttft_p95_s": e.context_tokens / 1e5 + par * 0.01,
            "peak_device_fraction": e.context_tokens * par / 2e5,
            "failed_requests": 0, "seed_echo": scenario.seed}


def fake_run(scenario) -> RunOutput:
    return RunOutput(fake_summary(scenario), "")


def slow_run(scenario) -> RunOutput:
    """Slow enough that a test can SIGKILL a sweep half-way; logs each run."""
    time.sleep(float(os.environ.get("KVSIM_TEST_SLEEP_S", "0.4")))
    log = os.environ.get("KVSIM_TEST_RUN_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{scenario.engine.context_tokens} {scenario.engine.parallel}\n")
    return fake_run(scenario)


def coin_run(scenario) -> RunOutput:
    """OOM with probability workload.params['p_oom'] (default 0.5), drawn from the seed."""
    p = float(scenario.workload.params.get("p_oom", 0.5))
    oom = np.random.default_rng(scenario.seed).random() < p
    return RunOutput(fake_summary(scenario), "Context size has been exceeded." if oom else "")


def session_context(scenario) -> int:
    return scenario.engine.context_tokens  # per session, on every engine


def plan_run(scenario) -> RunOutput:
    """Requests need 8192 tokens per session; TTFT p95 = 0.2 s × parallel (made up,
    closed form) and no simulated memory figure (the static layout stands)."""
    e = scenario.engine
    par = getattr(e, "parallel", None) or e.max_num_seqs
    fail = session_context(scenario) < 8192
    summary = {"ttft_p95_s": 0.2 * par, "itl_p95_s": 0.05, "failed_requests": int(fail)}
    return RunOutput(summary, "Context size has been exceeded." if fail else "")


def spiky_run(scenario) -> RunOutput:
    """As plan_run, but reports a 0.99 peak at exactly 8192 × 2 (a non-monotone spike)."""
    out = plan_run(scenario)
    spike = session_context(scenario) == 8192 and scenario.engine.parallel == 2
    return RunOutput({**out.summary, "peak_device_fraction": 0.99 if spike else 0.5},
                     out.oom_reason)


def spiky_oom_run(scenario) -> RunOutput:
    """The spike of :func:`spiky_run` at 8192 × 2, and an OOM at 16384 × 2 in six of
    the eight plan seeds (seed 0): the run checks the pruned boundary point with two."""
    from kvsim.plan.replicate import replication_seeds

    e = scenario.engine
    ctx = session_context(scenario)
    oom = scenario.seed in replication_seeds(0, 8)[2:] and (ctx, e.parallel) == (16384, 2)
    return RunOutput({"ttft_p95_s": 0.1, "failed_requests": int(oom),
                      "peak_device_fraction": 0.99 if (ctx, e.parallel) == (8192, 2) else 0.5},
                     "boom" if oom else "")
