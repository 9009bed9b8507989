"""``kvsim simulate``: run one scenario, save its Results, print a summary table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from kvsim.cli._output import check_output, output_errors, plotlyjs_option
from kvsim.cli._run_output import print_summary, print_verdict
from kvsim.cli._speed_band_output import (
    band_line,
    band_runs,
    check_band,
    report_speed_band,
    speed_note,
)
from kvsim.errors import InputError

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


def show_verdict(sc: Any, res: Any, constraints: Any, source: str, advice: bool,
                 extra: Sequence[str] = ()) -> Any:
    """Print the run's verdict (kvsim.plan.advice) and, with ``advice``, the change that
    would help most, re-simulated, then ``extra`` lines; returns the verdict with the
    change's words."""
    from kvsim.api import scenario_budget
    from kvsim.api import simulate as run
    from kvsim.plan.advice import advise, run_verdict

    try:
        session = int(scenario_budget(sc).slot_tokens)
    except InputError:
        session = None
    v = run_verdict(res.summary, constraints, res.requests, session, source)
    change, why_none = None, ""
    if advice and v.binding:
        change, why_none = advise(sc, res.summary, constraints, v.binding,
                                  simulate=lambda alt: dict(run(alt).summary))
    lines = [*v.details, *([f"change that helps most — {change.text()}"] if change else []),
             *([f"no change found: {why_none}"] if why_none and change is None else []),
             *extra]
    print_verdict(v.headline, lines)
    return {"headline": v.headline, "details": lines, "meets": v.meets}


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
              "seed (needs latency.jitter_cv, jitter_prompt_cv, jitter_run_cv or "
              "arrival_jitter_s > 0): "
              "prints how far reuse, TTFT p95 and failures move and their median, flags "
              "those that move materially, writes DIR/jitter.json")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="worker processes for --jitter-replications, 1-1024 (1 = in-process)")
@click.option("--speed-band", is_flag=True, default=False,
              help="after the run, rerun it at both ends of the speed model's error on "
              "cards left out of its fit (the 10th and 90th percentiles of its backend, "
              "leave-one-device-out; a fitted roofline only): the verdict and a table give "
              "TTFT, ITL and E2E p95, failures and preemptions at each end; writes "
              "DIR/speed_band.json")
@click.option("--slo", "slos", multiple=True, metavar="METRIC_PCT=DURATION",
              help="latency SLO the verdict judges, e.g. ttft_p95=2s (repeatable; default: "
              "the scenario's slo section, else ttft_p95=2s and itl_p95=150ms)")
@click.option("--advice/--no-advice", default=True, show_default=True,
              help="when the run misses, lay out the one change that would help most and "
              "re-simulate it (same seed) to say how it comes out")
@plotlyjs_option
def simulate(scenario: str, sets: tuple[str, ...], out_dir: str, fidelity: str | None,
             report: bool, jitter_n: int | None, jobs: int, speed_band: bool,
             slos: tuple[str, ...], advice: bool, plotlyjs: str) -> None:
    """Simulate SCENARIO (a YAML file or a bundled scenario name), save its Results
    (Parquet tables, summary.json, scenario.json, meta.json) and an HTML report in
    DIR. Prints a verdict first (the SLOs met or not, memory, OOM risk, why requests
    failed and the one change that would help most, laid out and re-simulated), then
    the latencies (p50/p90/p95/p99/mean) and the run; every figure is in summary.json."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from kvsim.api import simulate as run
    from kvsim.plan.advice import constraints_for
    from kvsim.scenario import load_scenario

    overrides = list(sets) + ([f"sim.fidelity={fidelity}"] if fidelity else [])
    sc = described(load_scenario(scenario, overrides), sets)
    constraints, source = constraints_for(sc, slos)
    check_jitter_options(sc, jitter_n, jobs)  # NOTE: before the run
    band = check_band(sc) if speed_band else None
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
    runs = band_runs(sc) if band else None  # NOTE: before the verdict, which says it
    verdict = show_verdict(sc, res, constraints, source, advice and res.stopped is None,
                           [band_line(band, runs)] if band and runs else [])
    print_summary(res.summary, f"{sc.name} — {res.summary['latency_model']}")
    click.echo(f"results: {path}")
    if report:
        from kvsim.report import write_report

        with output_errors("--output", path / "report.html"):
            html = write_report(path / "report.html", [res], kind="simulate",
                                slo={b.key: b.limit_s for b in constraints.latency},
                                verdicts=[verdict], plotlyjs=plotlyjs)
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
    if band and runs:
        report_speed_band(band, res, path, runs)
    elif note := speed_note(sc):
        click.echo(f"note: {note}", err=True)
    if jitter_n is not None:
        from kvsim.cli._jitter_output import report_jitter

        report_jitter(sc, res, jitter_n, path, jobs)
    elif note := timing_note(sc, res.requests):
        click.echo(f"note: {note}", err=True)


def timing_note(sc: Any, requests: Any) -> str:
    """Why this run's reuse and TTFT tail are one draw of a race, and how to see its
    spread; "" when the shape does not hinge on timing (kvsim.plan.jitter) or no session
    comes back for a second turn."""
    from kvsim.plan.races import timing_reason

    reason = timing_reason(sc, requests)
    if not reason or not (requests["turn"] > 0).any():
        return ""
    how = ("--jitter-replications N shows their spread" if sc.latency.jittered else
           "--jitter-replications N with latency.jitter_cv or arrival_jitter_s set "
           "(kvsim calibrate engine measures a server's) shows their spread")
    return (f"{reason}: which slot a returning session finds free hinges on milliseconds, "
            f"so this run's prompt-cache reuse and TTFT p95 are one draw; {how}")
