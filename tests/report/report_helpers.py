"""Hand-built Results-like runs with values small enough to check by hand.

A 16 GiB card, 400 MiB driver reserve, 4.92 GB of weights, 300 MiB activations and
an 8 GiB paged KV pool; two sessions, one of which is named like an XSS payload and
fails with llama.cpp's own wording.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

GIB = 2**30
EVIL = "<script>alert(1)</script>"
NAN = float("nan")


@dataclass
class Run:
    """Duck-typed stand-in for kvsim.metrics.results.Results (same attribute names)."""

    requests: pd.DataFrame
    itl: pd.DataFrame
    steps: pd.DataFrame
    memory: pd.DataFrame
    events: pd.DataFrame
    summary: dict[str, Any]
    scenario: dict[str, Any]
    scenario_hash: str = ""
    source: str = "simulated"
    meta: dict[str, Any] = field(default_factory=dict)
    references: pd.DataFrame | None = None


def requests_table() -> pd.DataFrame:
    rows = [  # request_id, session, turn, arrival, sched, first_tok, finish, prompt, cached, out
        ("alice#0", "alice", 0, 0.0, 0.1, 0.6, 2.6, 1000, 0, 100, False, ""),
        ("alice#1", "alice", 1, 12.6, 12.6, 12.9, 14.9, 1300, 1100, 100, False, ""),
        (f"{EVIL}#0", EVIL, 0, 1.0, 1.2, NAN, NAN, 40000, 0, 0, True,
         "exceed_context_size_error"),
    ]
    df = pd.DataFrame(rows, columns=[
        "request_id", "session_id", "turn", "arrival_s", "first_scheduled_s", "first_token_s",
        "finish_s", "prompt_tokens", "cached_tokens", "output_tokens", "failed",
        "failure_reason"])
    df["member"] = ["mum", "mum", "kid"]
    df["kind"] = "chat"
    df["queue_s"] = df["first_scheduled_s"] - df["arrival_s"]
    df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
    df["e2e_s"] = df["finish_s"] - df["arrival_s"]
    df["computed_prompt_tokens"] = df["prompt_tokens"] - df["cached_tokens"]
    df["recomputed_tokens"] = 0
    df["preemptions"] = [0, 1, 0]
    return df


def make_run(name: str = "family-4 on 16 GB", kv_scale: float = 1.0) -> Run:
    memory = pd.DataFrame({
        "time_s": [0.0, 1.0, 2.0, 3.0],
        "kv_reserved_bytes": [8 * GIB] * 4,
        "kv_allocated_bytes": [0, 1 * GIB, 3 * GIB, 2 * GIB],
        "kv_cached_bytes": [0, 0, GIB // 2, 1 * GIB],
        "kv_quant_bytes": [0, 0, GIB // 4, GIB // 4],
        "host_kv_bytes": [0, 0, 0, 1 * GIB],
        "running": [0, 1, 2, 1], "waiting": [0, 0, 1, 0]})
    memory["kv_allocated_bytes"] = (memory["kv_allocated_bytes"] * kv_scale).astype("int64")
    itl = pd.DataFrame({"request_id": ["alice#0", "alice#1", "alice#1"],
                        "gap_s": [0.02, 0.02, 0.03], "count": [99, 50, 49]})
    steps = pd.DataFrame({"start_s": [0.1, 0.6, 1.2, 2.6], "end_s": [0.6, 1.2, 2.6, 3.0],
                          "steps": [1, 30, 70, 1], "prefill_tokens": [1000, 0, 0, 0],
                          "decode_tokens": [0, 30, 70, 0], "batch_size": [1, 1, 2, 1]})
    events = pd.DataFrame({
        "time_s": [1.2, 3.0, 12.6, 13.0],
        "kind": ["fail", "offload", "restore", "preempt"],
        "request_id": [f"{EVIL}#0", "alice#0", "alice#1", "alice#1"],
        "detail": ["exceed_context_size_error", "", "", "recompute"],
        "bytes": [0, GIB, GIB, 0]})
    refs = pd.DataFrame({"time_s": [12.9, 12.9, 1.2], "session_id": ["alice", "alice", EVIL],
                         "outcome": ["INTACT", "LOST", "DEGRADED"], "score": [1.0, 0.1, 0.97]})
    scenario = {"name": name, "description": f"test run {EVIL}", "seed": 7,
                "gpu": {"name": "rtx-4060-ti-16gb", "display_name": "RTX 4060 Ti 16GB",
                        "memory_bytes": 16 * GIB},
                "model": {"name": "llama-3.1-8b"}, "weights": "q4_k_m",
                "engine": {"preset": "vllm"}, "driver_reserve_bytes": 400 * 2**20,
                "display_reserve_bytes": 0, "workload": {"preset": "family-4", "days": 1},
                "latency": {"kind": "roofline", "step_overhead_s": 0.004}}
    total = 400 * 2**20 + 4_920_000_000 + 300 * 2**20 + 8 * GIB
    summary = {"requests": 3, "failed_requests": 1, "ttft_p95_s": 0.6, "itl_p95_s": 0.03,
               "driver_reserve_bytes": 400 * 2**20, "weights_gpu_bytes": 4_920_000_000,
               "activation_bytes": 300 * 2**20, "peak_kv_reserved_bytes": 8 * GIB,
               "device_bytes": 16 * GIB, "latency_model": "roofline(rtx-4060-ti-16gb, "
               "llama-3.1-8b, q4_k_m)",
               "peak_device_bytes": total, "peak_device_fraction": total / (16 * GIB),
               "peak_kv_allocated_bytes": int(3 * GIB * kv_scale), "prefix_hit_rate": 1100 / 42300}
    return Run(requests=requests_table(), itl=itl, steps=steps, memory=memory, events=events,
               summary=summary, scenario=scenario, scenario_hash="0123456789abcdef",
               meta={"kvsim_version": "0.1.0", "format_version": 1, "source": "simulated"},
               references=refs)


def plan_table() -> pd.DataFrame:
    """3 contexts × 3 parallel; fraction grows with both; ≥ 0.85 or TTFT binds."""
    rows = []
    for ctx in (8192, 16384, 32768):
        for par in (1, 2, 4):
            frac = 0.55 + 0.05 * np.log2(ctx // 8192) * par + 0.02 * par
            binding = ""
            if frac > 0.85:
                binding = "device_fraction"
            elif par == 4:
                binding = "ttft_p95"
            rows.append({"context_tokens": ctx, "parallel": par, "kv_dtype": "q8_0",
                         "feasible": binding == "", "binding": binding,
                         "peak_device_fraction": frac, "ttft_p95_s": 0.4 * par})
    return pd.DataFrame(rows)
