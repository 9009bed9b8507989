"""``kvsim simulate --jitter-replications``: run them, print the spread, save jitter.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from kvsim.cli._output import output_errors


def report_jitter(sc: Any, res: Any, n: int, out_dir: Path, jobs: int = 1) -> None:
    """Run ``n`` jittered replications of ``sc`` (whose run gave ``res``) on ``jobs``
    worker processes, print each metric's range and a warning per metric that moved
    materially, and write ``out_dir/jitter.json`` (kvsim.plan.jitter)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Table

    from kvsim.plan.executor import make_executor
    from kvsim.plan.jitter import jitter_replications, spread_doc, timing_spread
    from kvsim.plan.races import timing_reason
    from kvsim.plan.replicate import RunOutput, oom_reason

    console = Console(stderr=True)
    with Progress(TextColumn("[bold]jittered replications[/]"), BarColumn(),
                  MofNCompleteColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as bar:
        task = bar.add_task("jitter", total=n)
        executor = make_executor(jobs)
        try:
            seeds, runs = jitter_replications(sc, n, executor=executor,
                                              progress=lambda k: bar.advance(task, k))
        finally:
            executor.close()
    main = RunOutput(dict(res.summary), oom_reason(dict(res.summary), res.requests, res.events))
    spreads = timing_spread(main, runs, timing_reason(sc, res.requests))
    lat = sc.latency
    table = Table(title=f"timing noise: this run and {n} jittered replications "
                  f"({lat.noise_words})")
    for col in ("metric", "this run", "range", "median", "verdict"):
        table.add_column(col, justify="left" if col in ("metric", "verdict") else "right")
    for s in spreads:
        table.add_row(s.label, s.text(s.values[0]), s.range_text(),
                      "" if s.key == "oom" else s.text(s.median),
                      "moves with timing" if s.moved else "steady")
    Console().print(table)
    with output_errors("--output", out_dir / "jitter.json"):
        (out_dir / "jitter.json").write_text(
            json.dumps(spread_doc(seeds, lat.noise_knobs, spreads),
                       indent=2) + "\n",
            encoding="utf-8")
    click.echo(f"jitter: {out_dir / 'jitter.json'}")
    for s in spreads:
        if s.moved:
            click.echo(f"warning: {s.warning()}", err=True)
