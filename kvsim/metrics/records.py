"""Flat records the engine emits while it runs (pure Python; no pandas here).

The engine appends rows as things happen; :mod:`kvsim.metrics.results` turns the
lists into DataFrames once at the end.  Rows are kept bounded where the stream is
long: consecutive decode-only steps with the same batch size merge into one
``steps`` row (``steps`` counts them), and inter-token gaps are run-length encoded
per request (``count`` consecutive gaps of exactly ``gap_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

REQUEST_COLUMNS = (
    "request_id", "session_id", "turn", "member", "kind", "arrival_s", "first_scheduled_s",
    "first_token_s", "finish_s", "queue_s", "ttft_s", "e2e_s", "prompt_tokens", "cached_tokens",
    "computed_prompt_tokens", "recomputed_tokens", "output_tokens", "preemptions", "failed",
    "failure_reason", "truncated", "itl_mean_s", "itl_p50_s", "itl_p95_s", "itl_max_s")
ITL_COLUMNS = ("request_id", "gap_s", "count")
STEP_COLUMNS = ("start_s", "end_s", "steps", "prefill_tokens", "decode_tokens", "batch_size")
MEMORY_COLUMNS = ("time_s", "kv_reserved_bytes", "kv_allocated_bytes", "kv_cached_bytes",
                  "host_kv_bytes", "running", "waiting")
EVENT_COLUMNS = ("time_s", "kind", "request_id", "detail", "bytes")


def weighted_quantile(values: list[float], counts: list[int], q: float) -> float:
    """Smallest value with at least ``q`` of the total weight at or below it."""
    if not values:
        return math.nan
    pairs = sorted(zip(values, counts))
    total = sum(counts)
    target = q * total
    acc = 0
    for v, c in pairs:
        acc += c
        if acc >= target:
            return float(v)
    return float(pairs[-1][0])


def _itl_stats(itl: list[list[float]]) -> tuple[float, float, float, float]:
    if not itl:
        return (math.nan,) * 4
    vals = [g for g, _ in itl]
    cnts = [int(c) for _, c in itl]
    mean = sum(g * c for g, c in itl) / sum(cnts)
    return (mean, weighted_quantile(vals, cnts, 0.5), weighted_quantile(vals, cnts, 0.95),
            max(vals))


@dataclass
class Recorder:
    """Collects request, ITL, step, memory-sample and event rows during one run."""

    requests: list[tuple[Any, ...]] = field(default_factory=list)
    itl: list[tuple[str, float, int]] = field(default_factory=list)
    steps: list[list[Any]] = field(default_factory=list)
    memory: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    output_tokens: int = 0

    def request_done(self, req: Any) -> None:
        nan = math.nan
        arr = req.arrival_s
        first = req.first_scheduled_s
        tok = req.first_token_s
        fin = req.finish_s
        failed = req.failure_reason != ""
        self.requests.append((
            req.request_id, req.session_id, req.turn, req.member, req.kind, arr, first, tok,
            fin, nan if math.isnan(first) else first - arr, nan if math.isnan(tok) else tok - arr,
            fin - arr if not failed else nan, req.prompt_tokens, req.cached_tokens,
            req.computed_prompt_tokens, req.recomputed_tokens, req.num_output, req.preemptions,
            failed, req.failure_reason, req.truncated, *_itl_stats(req.itl)))
        self.output_tokens += req.num_output
        for gap, count in req.itl:
            self.itl.append((req.request_id, gap, int(count)))

    def step(self, start_s: float, end_s: float, prefill_tokens: int, decode_tokens: int,
             batch_size: int, steps: int = 1) -> None:
        last = self.steps[-1] if self.steps else None
        if (last is not None and prefill_tokens == 0 and last[3] == 0
                and last[5] == batch_size and last[1] == start_s):
            last[1] = end_s
            last[2] += steps
            last[4] += decode_tokens
            return
        self.steps.append([start_s, end_s, steps, prefill_tokens, decode_tokens, batch_size])

    def sample(self, time_s: float, mem: Any) -> None:
        self.memory.append((time_s, mem.kv_reserved_bytes, mem.kv_allocated_bytes,
                            mem.kv_cached_bytes, mem.host_kv_bytes, mem.running, mem.waiting))

    def event(self, ev: Any) -> None:
        self.events.append((ev.time_s, ev.kind, ev.request_id, ev.detail, int(ev.bytes)))
