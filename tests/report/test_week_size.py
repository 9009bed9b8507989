"""A household-week report stays under 15 MB and keeps the exact memory peak.

Tables sized like a week sampled every second (604 800 memory samples, 300 000
engine steps, 3 000 turns); values are a seeded random walk with one spike, so the
peak is known by construction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from report_helpers import GIB, Run

from kvsim.report import build_report
from kvsim.report import data_run as dr
from kvsim.report import figures_run as fr

WEEK_S = 7 * 86400


def _week() -> Run:
    rng = np.random.default_rng(11)
    t = np.arange(WEEK_S, dtype=float)
    alloc = np.clip(np.cumsum(rng.integers(-2, 3, len(t))) * 2**20, 0, 6 * GIB).astype(np.int64)
    alloc[400_000] = 8 * GIB  # the spike: the whole pool in use for one sample
    memory = pd.DataFrame({"time_s": t, "kv_reserved_bytes": 8 * GIB, "kv_allocated_bytes": alloc,
                           "kv_cached_bytes": 0, "host_kv_bytes": 0,
                           "running": rng.integers(0, 4, len(t)), "waiting": 0})
    n = 3000
    arrival = np.sort(rng.uniform(0, WEEK_S - 100, n))
    req = pd.DataFrame({
        "request_id": [f"s{i // 6}#{i % 6}" for i in range(n)],
        "session_id": [f"s{i // 6}" for i in range(n)], "turn": np.arange(n) % 6,
        "arrival_s": arrival, "first_scheduled_s": arrival + 0.01,
        "first_token_s": arrival + 0.5, "finish_s": arrival + 10.0, "ttft_s": 0.5,
        "prompt_tokens": 2000, "cached_tokens": 1500, "failed": False, "failure_reason": ""})
    steps = pd.DataFrame({"start_s": np.linspace(0, WEEK_S, 300_000), "batch_size":
                          rng.integers(1, 5, 300_000)})
    itl = pd.DataFrame({"request_id": np.repeat(req["request_id"], 20),
                        "gap_s": rng.uniform(0.02, 0.05, n * 20).round(4), "count": 10})
    events = pd.DataFrame({"time_s": arrival[:500], "kind": "offload", "request_id": "",
                           "detail": "", "bytes": GIB // 8})
    static = 5 * GIB
    summary = {"peak_device_bytes": static + 8 * GIB, "peak_kv_reserved_bytes": 8 * GIB,
               "device_bytes": 16 * GIB}
    return Run(requests=req, itl=itl, steps=steps, memory=memory, events=events,
               summary=summary, scenario={"name": "week", "engine": {"preset": "vllm"}})


def test_week_report_under_15_mb_with_exact_peak() -> None:
    run = _week()
    html = build_report([run])
    assert len(html.encode()) < 15 * 10**6
    data = dr.memory_stack(run.memory, run.summary, run.scenario)
    assert len(data["time_s"]) < 10_000  # down-sampled from 604 800
    fig = fr.memory_figure(data, "week")
    total = next(tr for tr in fig.data if tr.name == "device total")
    assert max(total.y) * 2**30 == run.summary["peak_device_bytes"] == 13 * GIB
    alloc = dict(data["device_layers"])["KV allocated (full)"]
    assert alloc.max() == 8 * GIB  # the one-sample spike survives down-sampling
