"""What ``kvsim simulate`` prints: the verdict first, then latency and the run in units
people read.

Latencies in ms below 10 s (s above) with p50, p90, p95, p99 and the mean, as
benchmark_serving and GuideLLM print them; durations humanised; throughput over the
time the server was busy (:func:`kvsim.metrics.summary.busy`), not a whole-day
average; failures by code (:mod:`kvsim.metrics.failures`).  Every figure is a key of
``summary.json`` (docs/results.md).
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvsim.config.units import format_bytes, format_latency, humanize_duration

LATENCIES = (("TTFT", "ttft"), ("ITL", "itl"), ("E2E", "e2e"), ("queue", "queue"))
STATS = ("p50", "p90", "p95", "p99", "mean")


def latency_table(summary: dict[str, Any]) -> Table:
    """Rows TTFT, ITL, E2E, queue; columns p50, p90, p95, p99, mean."""
    n = int(summary.get("latency_requests") or 0)
    t = Table(title=f"latency over {n:,} requests that ended")
    t.add_column("")
    for s in STATS:
        t.add_column(s, justify="right")
    for label, key in LATENCIES:
        t.add_row(label, *[format_latency(float(summary.get(f"{key}_{s}_s", float("nan"))))
                           for s in STATS])
    return t


def _count(summary: dict[str, Any], key: str) -> str:
    return f"{int(summary.get(key) or 0):,}"


def run_table(summary: dict[str, Any], title: str) -> Table:
    """Requests, failures, cache, throughput while busy, memory and simulated time."""
    t = Table(title=title)
    t.add_column("")
    t.add_column("", justify="right")
    rows = [("requests", _count(summary, "requests")),
            ("failed", _count(summary, "failed_requests")),
            ("unfinished at the stop", _count(summary, "unfinished_requests")),
            ("truncated", _count(summary, "truncated_requests")),
            ("new chats after a failure", _count(summary, "new_chats")),
            ("abandoned turns", _count(summary, "abandoned_turns")),
            ("preemptions", _count(summary, "preemptions")),
            ("prefix cache hit rate", f"{float(summary.get('prefix_hit_rate') or 0):.1%}"),
            ("output tokens/s while busy",
             f"{float(summary.get('output_tokens_per_busy_s') or 0):,.1f}"),
            ("busy (≥ 1 request in the server)",
             humanize_duration(float(summary.get("busy_s") or 0))),
            ("most requests at once", _count(summary, "peak_concurrent_requests")),
            ("longest request (prompt + output)",
             f"{int(summary.get('longest_request_tokens') or 0):,} tokens"),
            ("peak KV reserved", format_bytes(summary.get("peak_kv_reserved_bytes") or 0)),
            ("peak device memory", (f"{format_bytes(summary.get('peak_device_bytes') or 0)} "
                                    f"({float(summary.get('peak_device_fraction') or 0):.1%})")),
            ("simulated time", humanize_duration(float(summary.get("sim_time_s") or 0)))]
    for label, value in rows:
        t.add_row(label, value)
    return t


def print_summary(summary: dict[str, Any], title: str) -> None:
    console = Console()
    console.print(latency_table(summary))
    console.print(run_table(summary, title))


def print_verdict(headline: str, lines: list[str]) -> None:
    """The verdict block (kvsim.plan.advice), on stdout before the tables."""
    click.echo(headline)
    for line in lines:
        click.echo(f"  {line}")
