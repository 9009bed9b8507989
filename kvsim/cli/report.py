"""``kvsim report RESULTS_DIR... -o report.html``: one self-contained HTML report.

Loads each results folder (``kvsim.metrics.results.Results.load``), refuses folders
written by another kvsim release or missing a table (one line naming what is wrong,
exit code 2), and writes the page atomically — never a half-written HTML file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kvsim import __version__
from kvsim.cli._output import check_output, output_errors, plotlyjs_option
from kvsim.errors import InputError


def _release(version: str) -> tuple[str, ...]:
    return tuple(str(version).split(".")[:2])


def load_for_report(path: str | Path) -> Any:
    """A :class:`Results` with its ``meta.json`` attached as ``.meta``.

    Raises :class:`InputError` naming the folder and what is missing, a format or
    kvsim release (major.minor) other than this one, or an unreadable table.
    """
    from kvsim.metrics.results import Results

    p = Path(path)
    res = Results.load(p)  # names missing / damaged files and a wrong format version
    written_by = str(res.meta.get("kvsim_version", "unknown"))
    if _release(written_by) != _release(__version__):
        raise InputError("results", str(p), f"written by kvsim {written_by}; this is kvsim "
                         f"{__version__} — re-run the simulation with this version")
    return res


@click.command()
@click.argument("results_dirs", nargs=-1, required=True,
                type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", default="report.html", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="HTML file to write")
@click.option("--title", default=None, help="page title (default: the first scenario's name)")
@click.option("--slo", "slos", multiple=True, metavar="METRIC_PCT=DURATION",
              help="SLO line on the METRIC's CDF, METRIC in ttft/itl/e2e and PCT in "
              "p50/p95/p99, with a duration (2s, 150ms; a bare number is seconds), e.g. "
              "--slo ttft_p95=2s --slo e2e_p99=30s (repeatable; as kvsim plan's --slo); the "
              "verdicts judge these (default: each run's scenario slo section, else "
              "ttft_p95=2s and itl_p95=150ms)")
@plotlyjs_option
def report(results_dirs: tuple[Path, ...], output: Path, title: str | None,
           slos: tuple[str, ...], plotlyjs: str) -> None:
    """Write one HTML report for RESULTS_DIR... (Results folders written by kvsim
    simulate or kvsim replay): a verdict per run first and, with several, the runs side
    by side with their differences from the first, then the overlaid figures. The plan
    heatmap and GPU comparison are in the report.html that plan -o / compare --gpus -o
    write."""
    from kvsim.plan.slo import build_constraints
    from kvsim.report import write_report

    # NOTE: the plan's parser: the same metrics, percentiles and limits
    slo = {bound.key: bound.limit_s for bound in build_constraints(slos).latency}
    check_output("--output", output, folder=False)
    runs = [load_for_report(d) for d in results_dirs]
    extra = {"slo": slo, "plotlyjs": plotlyjs} | ({"title": title} if title else {})
    with output_errors("--output", output):
        path = write_report(output, runs, extra)
    size_mib = path.stat().st_size / 2**20
    click.echo(f"report: {path} ({size_mib:.1f} MiB, {len(runs)} run(s))")
