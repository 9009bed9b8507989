"""``kvsim simulate``: run one scenario, save its Results, print a summary table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from kvsim.cli._output import check_output, output_errors
from kvsim.errors import InputError


def _fmt(key: str, value: object) -> str:
    if isinstance(value, float):
        if key.endswith("_bytes"):
            return f"{value / 2**30:.2f} GiB"
        if key.endswith("_s") and not key.endswith("_per_s"):
            return f"{value * 1000:.1f} ms" if value < 10 else f"{value:.1f} s"
        return f"{value:.3f}"
    if isinstance(value, int) and key.endswith("_bytes"):
        return f"{value / 2**30:.2f} GiB"
    return str(value)


SHOWN = ("requests", "unfinished_requests", "failed_requests", "truncated_requests",
         "new_chats", "abandoned_turns",
         "preemptions", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
         "itl_p50_s", "itl_p95_s", "itl_p99_s", "e2e_p95_s", "tokens_per_s", "prefix_hit_rate",
         "peak_kv_reserved_bytes", "peak_kv_allocated_bytes", "peak_device_bytes",
         "peak_device_fraction", "sim_time_s")


# --set keys that leave a scenario's own description true (with their sub-keys)
UNDESCRIBED = ("name", "description", "seed", "sim.sample_interval_s", "sim.fidelity",
               "sim.max_rss_bytes", "accuracy", "latency")


def described(sc: Any, sets: Sequence[str]) -> Any:
    """``sc`` with a description of what it now runs when ``--set`` changed what its
    own description was written for (the workload, the card, the engine, …); a
    ``--set description=…`` of the user's wins."""
    keys = [item.partition("=")[0].strip() for item in sets]
    if not any(not k.startswith(UNDESCRIBED) for k in keys) or "description" in keys:
        return sc
    from kvsim.report.card import describe

    text = f"{describe(sc.model_dump(mode='json'))} (scenario {sc.name} with --set " \
        f"{', '.join(sets)})"
    return sc.model_copy(update={"description": text})


def stop_note(summary: dict[str, Any], when: bool = True) -> str:
    """What a run cut short left unfinished (``""`` when nothing); ``when``: say when
    it stopped."""
    n = int(summary.get("unfinished_requests") or 0)
    if not n:
        return ""
    total = int(summary.get("requests") or 0)
    at = f"at the stop ({summary.get('sim_time_s', float('nan')):.1f} s)" if when else "then"
    return (f"{n:,} of {total:,} requests were still running or waiting {at}, kept with "
            f"status 'unfinished' in requests.parquet; latency percentiles cover the "
            f"{total - n:,} that ended only")


_KIND_WORDS = (("too_long", ("too long for the context (a larger context_tokens serves "
                             "them; more memory at these settings does not)")),
               ("busy", "refused busy (queue full)"),
               ("memory", "out of KV memory (counted in the OOM risk)"))


def failure_note(summary: dict[str, Any]) -> str:
    """Why requests failed, by kind (kvsim.metrics.failures); ``""`` when none did."""
    n = int(summary.get("failed_requests") or 0)
    if not n:
        return ""
    parts = [f"{k:,} {words}" for kind, words in _KIND_WORDS
             if (k := int(summary.get(f"failed_{kind}_requests") or 0))]
    return f"{n:,} request(s) failed: " + "; ".join(parts) + \
        " (reasons per request in requests.parquet, failure_reason)"


def residency_note(summary: dict[str, Any], scenario: dict[str, Any]) -> str:
    """One line for a run whose weights do not fit host RAM (``""`` when they do)."""
    from kvsim.config.units import format_bytes

    short = int(summary.get("weights_beyond_host_ram_bytes") or 0)
    if not short:
        return ""
    host = scenario.get("host") or {}
    name = host.get("name", "the host") if isinstance(host, dict) else str(host)
    return (f"the weights left in host RAM and the KV there exceed {name}'s memory by "
            f"{format_bytes(short)}: the predicted speed assumes them resident (read at RAM "
            "bandwidth), but that part is read from disk as used, far slower (kvsim has no "
            "disk bandwidth); summary.json: weights_exceed_host_ram")


def check_jitter_options(sc: Any, jitter_n: int | None, jobs: int) -> None:
    """``--jitter-replications`` (1-1000, on a scenario with timing noise) and ``--jobs``."""
    from kvsim.plan.executor import MAX_JOBS

    if not 1 <= jobs <= MAX_JOBS:
        raise InputError("--jobs", jobs, f"between 1 and {MAX_JOBS} worker processes")
    if jitter_n is not None:  # NOTE: imported only then (it imports scipy.stats, ~1 s)
        from kvsim.plan.jitter import jitter_seeds

        jitter_seeds(sc, jitter_n)


@click.command()
@click.argument("scenario")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="override a scenario key, e.g. --set engine.parallel=2")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="directory to write the Results into")
@click.option("--fidelity", type=click.Choice(["fast", "step"]), default=None,
              help="fast-forward decode stretches (fast) or simulate every step (step); "
              "sets sim.fidelity  [default: the scenario's sim.fidelity, fast unless set]")
@click.option("--report/--no-report", default=True, show_default=True,
              help="also write DIR/report.html (self-contained, interactive)")
@click.option("--jitter-replications", "jitter_n", type=int, default=None, metavar="N",
              help="after the run, N runs (1-1000) differing only by their timing noise's "
              "seed (needs latency.jitter_cv > 0): prints how far reuse, TTFT p95 and "
              "failures move, flags those that move materially, writes DIR/jitter.json")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="worker processes for --jitter-replications, 1-1024 (1 = in-process)")
def simulate(scenario: str, sets: tuple[str, ...], out_dir: str, fidelity: str | None,
             report: bool, jitter_n: int | None, jobs: int) -> None:
    """Simulate SCENARIO (a YAML file or a bundled scenario name), save its Results
    (Parquet tables, summary.json, scenario.json, meta.json) and an HTML report in
    DIR. The printed table is a subset of summary.json (the recall proxy, for one, is
    only in summary.json and the report)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from kvsim.api import simulate as run
    from kvsim.scenario import load_scenario

    overrides = list(sets) + ([f"sim.fidelity={fidelity}"] if fidelity else [])
    sc = described(load_scenario(scenario, overrides), sets)
    check_jitter_options(sc, jitter_n, jobs)  # NOTE: before the run
    check_output("--output", out_dir, folder=True)
    total = sc.sim.max_sim_time_s or (sc.workload.days * 86400.0 if sc.workload.preset else None)
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]simulating[/] {task.description}"), BarColumn(),
                  TextColumn("{task.fields[done]} requests"), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(sc.name, total=total, done=0)

        def progress(now_s: float, done: int) -> None:
            bar.update(task, completed=now_s, done=done)

        res = run(sc, progress=progress)
    with output_errors("--output", out_dir):
        path = res.save(out_dir)
    table = Table(title=f"{sc.name} — {res.summary['latency_model']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in SHOWN:
        table.add_row(key, _fmt(key, res.summary.get(key)))
    Console().print(table)
    click.echo(f"results: {path}")
    if report:
        from kvsim.report import write_report

        with output_errors("--output", path / "report.html"):
            html = write_report(path / "report.html", [res], kind="simulate")
        click.echo(f"report: {html}")
    if (stop := res.stopped) is not None:  # NOTE: saved what ran, now report the stop
        note = stop_note(res.summary, when=False)
        raise InputError(stop.field, stop.value,
                         f"{stop.allowed}; the run stopped at {res.summary['stopped_at_s']:.1f} s "
                         f"and its results so far are in {path}" + (f"; {note}" if note else ""))
    if note := stop_note(res.summary):
        click.echo(f"warning: {note}", err=True)
    if note := residency_note(res.summary, res.scenario):
        click.echo(f"warning: {note}", err=True)
    if note := failure_note(res.summary):
        click.echo(f"note: {note}", err=True)
    if jitter_n is not None:
        from kvsim.cli._jitter_output import report_jitter

        report_jitter(sc, res, jitter_n, path, jobs)
