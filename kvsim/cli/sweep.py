"""``kvsim sweep SWEEP.yaml -o DIR``: many scenarios, one resumable result store.

Every point is resolved before anything runs; finished scenarios are stored by
hash under ``DIR/results/`` as they complete, so a rerun (after Ctrl-C, SIGKILL
or a crash) only runs what is missing.  The combined table — one row per point, with
its ``status`` (``ok``, ``cannot_start``, ``failed``) — is written to
``DIR/sweep.parquet`` and ``DIR/sweep.csv``, also when a point failed while running
(that error is reported after the table is written, exit code 2).
"""

from __future__ import annotations

from pathlib import Path

import click
import pandas as pd

from kvsim.cli._output import check_output, output_errors, plotlyjs_option
from kvsim.cli._plan_common import load_runner, maybe_report, print_table, progress_bar
from kvsim.errors import InputError, Terminated
from kvsim.metrics.failures import FAILURE_CODES
from kvsim.plan.executor import Executor, make_executor
from kvsim.plan.replicate import Runner, simulate_keep, simulate_run
from kvsim.plan.store import ResultStore
from kvsim.plan.sweep import (
    SweepOutcome,
    SweepPoint,
    expand,
    load_sweep,
    pending,
    run_sweep,
    write_outputs,
)


@click.command()
@click.argument("sweep_file", metavar="SWEEP.yaml")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="result store and outputs (reused: finished scenarios are skipped)")
@click.option("--jobs", "-j", type=int, default=None,
              help="local worker processes (default: all cores; 1 = in-process); "
              "not with --dask")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="run on an existing Dask cluster, e.g. tcp://10.0.0.5:8786 (its "
              "workers set the parallelism; not with --jobs)")
@click.option("--dask-timeout", type=float, default=5.0, show_default=True,
              help="seconds to wait for the Dask scheduler")
@click.option("--summary-only", is_flag=True,
              help="store only each run's summary, not its full Results tables")
@click.option("--no-report", is_flag=True, help="do not write report.html")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@plotlyjs_option
@click.option("--runner", default=None, hidden=True, help="MODULE:FUNC runner (tests)")
def sweep(sweep_file: str, out_dir: Path, jobs: int | None, dask_address: str | None,
          dask_timeout: float, summary_only: bool, no_report: bool, no_progress: bool,
          plotlyjs: str, runner: str | None) -> None:
    """Run a factorial (or listed) sweep of scenarios; resume where it stopped."""
    if jobs is not None and dask_address is not None:
        raise InputError("--jobs", jobs, f"not with --dask {dask_address}: give --jobs N for "
                         "local workers or --dask ADDRESS for a cluster, not both")
    spec, base_dir = load_sweep(sweep_file)
    points = expand(spec, base_dir)
    run = load_runner(runner, simulate_run if summary_only else simulate_keep)
    check_output("--out", out_dir, folder=True)
    # NOTE: Ctrl-C or SIGTERM outside the runs is main's one line (kvsim.cli.main)
    executor = make_executor(jobs, dask_address, dask_timeout)
    try:
        outcome, paths = _run_and_write(points, out_dir, spec.name, executor, run,
                                        summary_only, not no_progress)
    except _Stopped as stop:
        click.echo(stop.line, err=True)
        raise click.exceptions.Exit(stop.exit_code) from None
    finally:
        executor.close()
    _print_table(spec.name, points, outcome.table)
    with output_errors("--out", out_dir):
        report = maybe_report("sweep", out_dir, not no_report, sweep=outcome.table,
                              plotlyjs=plotlyjs)
    refused = f", {outcome.refused} cannot start" if outcome.refused else ""
    click.echo(f"ran {outcome.ran}, skipped {outcome.skipped} (already stored){refused}; "
               f"wrote {', '.join(str(p) for p in paths)}" + (f", {report}" if report else ""))
    if outcome.error is not None:
        raise outcome.error


class _Stopped(Exception):
    """A sweep ended by Ctrl-C or SIGTERM, with what is stored: one line, its exit code."""

    def __init__(self, line: str, exit_code: int) -> None:
        super().__init__(line)
        self.line, self.exit_code = line, exit_code


def _run_and_write(points: list[SweepPoint], out_dir: Path, name: str, executor: Executor,
                   run: Runner, summary_only: bool, progress: bool
                   ) -> tuple[SweepOutcome, list[Path]]:
    """Run what is missing into the store and write the combined table.

    Raises :class:`_Stopped` on Ctrl-C (exit code 130) or SIGTERM (143), after the store
    is closed: what finished before is stored, a rerun resumes.
    """
    with output_errors("--out", out_dir):
        store = ResultStore(out_dir).open()
    try:
        todo = pending(points, store, summary_only)
        _announce(name, points, len(todo), sum(1 for p in todo if store.has(p.key)))
        try:
            with progress_bar("simulating", len(todo), progress) as advance:
                outcome = run_sweep(points, store, executor=executor, runner=run,
                                    progress=advance, summary_only=summary_only)
        except (KeyboardInterrupt, Terminated) as exc:
            runnable = [p for p in points if not p.refused]
            stored = sum(1 for p in runnable if store.has(p.key))
            what, code = (("interrupted", 130) if isinstance(exc, KeyboardInterrupt)
                          else ("terminated", 143))
            raise _Stopped(f"{what}; {stored} of {len(runnable)} points stored; rerun to "
                           "resume", code) from None
        with output_errors("--out", out_dir):
            return outcome, write_outputs(outcome.table, out_dir)
    finally:
        store.close()


def _announce(name: str, points: list[SweepPoint], todo: int, completing: int) -> None:
    """How many points, distinct scenarios, stored ones and engines that cannot start;
    ``completing``: stored summary-only, run again for their full Results."""
    distinct = len({p.key for p in points if not p.refused})
    more = f" ({completing} stored summary-only: for their full Results)" if completing else ""
    click.echo(f"sweep '{name}': {len(points)} points, {distinct} distinct scenarios, "
               f"{distinct - todo} already stored, {todo} to run{more}", err=True)
    for p in points:
        if p.refused:
            given = ", ".join(f"{k}={v}" for k, v in p.params.items())
            click.echo(f"note: point {p.index} ({given}): {p.refused}", err=True)


def _print_table(name: str, points: list[SweepPoint], table: pd.DataFrame) -> None:
    cols = list(dict.fromkeys(k for p in points for k in p.params))
    if (table["status"] != "ok").any():
        cols.append("status")
    # NOTE: failures by kind beside the OOM column (only memory failures make a row OOM),
    # then by code where any row has some (kvsim.metrics.failures)
    codes = [f"failed_{c}_requests" for c in FAILURE_CODES]
    cols += [c for c in ("ttft_p95_s", "itl_p95_s", "peak_device_fraction", "failed_requests",
                         "failed_too_long_requests", "failed_memory_requests",
                         *[k for k in codes if k in table and (table[k].fillna(0) > 0).any()],
                         "oom") if c in table.columns]
    print_table(f"sweep {name}", table.to_dict("records"), ["point", *cols])
