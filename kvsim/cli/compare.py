"""``kvsim compare``: which card to buy, or how good a prediction was.

- ``kvsim compare --gpus rtx-4060-ti-16gb,rtx-4090,rtx-5090 SCENARIO [plan flags]``:
  the capacity search per card; best feasible configuration, p95s, headroom, OOM
  risk, launch price and price per feasible concurrent session (a session guaranteed
  its full context: :mod:`kvsim.plan.parallel`).
- ``kvsim compare MEASURED PREDICTED``: two Results folders (a ``kvsim replay`` and a
  ``kvsim simulate`` of the same trace) → the error per metric.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import click
import pandas as pd
from click.core import ParameterSource

from kvsim.cli._output import check_output, output_errors
from kvsim.cli._plan_common import constraint_options, maybe_report, print_table
from kvsim.cli._speed_band_output import bands_note
from kvsim.cli.plan import (
    build_grid,
    grid_options,
    p95_note,
    plan_constraints,
    pooled,
    print_runs_table,
    run_search,
)
from kvsim.errors import InputError
from kvsim.plan.compare import compare_gpus, on_each_gpu, parse_gpus
from kvsim.plan.store import write_table
from kvsim.scenario import load_scenario

OUT_HELP = ("write results here. --gpus: compare.csv, compare.parquet, plan.parquet (every "
            "card's points) and report.html; MEASURED PREDICTED: errors.csv and report.html. "
            "No recommendation.json in either mode")

GPU_COLUMNS = ["gpu", "usable_gib", "feasible", "best_context_tokens", "best_parallel",
               "kv_dtype", "ttft_p95_s", "itl_p95_s", "peak_device_fraction", "oom_risk",
               "max_parallel", "price_usd", "usd_per_session"]
DEFAULT_SLO_NOTE = ("the SLOs of every card: --slo, else the scenario's slo section, else "
                    "kvsim's defaults (ttft_p95=2s, itl_p95=150ms)")


@click.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--gpus", default=None, help="compare these GPU profiles (comma-separated slugs "
              "or printed names; a box of several cards as 2x NAME or NAME+NAME, priced as "
              "their sum)")
@constraint_options
@functools.partial(grid_options, out_help=OUT_HELP)
def compare(inputs: tuple[str, ...], gpus: str | None, sets: tuple[str, ...],
            **opts: Any) -> None:
    """GPU what-if (--gpus A,B,C SCENARIO) or prediction error (MEASURED PREDICTED).

    \b
    --gpus A,B,C SCENARIO: the plan search per card, each card's verdict first
      (without --slo: the scenario's slo section, else ttft_p95=2s and
      itl_p95=150ms). The SLO and constraint
      options (--slo, --max-device-fraction, --max-oom-risk, --min-recall,
      --replications, --jobs, --conservative), the grid options (--set,
      --contexts, --parallel, --kv, --policy) and --no-progress apply to
      this mode only.
    MEASURED PREDICTED: two Results folders (kvsim replay, kvsim simulate);
      prints the error per metric. Only -o, --no-report and --plotlyjs apply.
    """
    if gpus is not None and len(inputs) != 1:
        raise InputError("compare", " ".join(inputs), "--gpus takes exactly one SCENARIO")
    if gpus is None and len(inputs) != 2:
        raise InputError("compare", " ".join(inputs),
                         "give --gpus A,B SCENARIO, or MEASURED_DIR PREDICTED_DIR")
    if gpus is None:
        _refuse_gpus_options(click.get_current_context())
    if opts["out_dir"] is not None:
        check_output("--out", opts["out_dir"], folder=True)
    if gpus is not None:
        _gpus(inputs[0], parse_gpus(gpus), sets, opts)
    else:
        _prediction(Path(inputs[0]), Path(inputs[1]), opts)


def _gpus(scenario: str, names: list[str], sets: tuple[str, ...], opts: dict[str, Any]) -> None:
    s = load_scenario(scenario, list(sets))
    c, source = plan_constraints(s, opts)
    grid = build_grid(s, opts["contexts"], opts["parallel"], opts["kv"], opts["policies"])

    def one(sg: Any, cons: Any, gr: Any) -> Any:
        return run_search(sg, cons, gr, opts, label=sg.gpu.name)

    per_gpu = on_each_gpu(scenario, list(sets), names)
    res = compare_gpus(s, names, c, grid, search_fn=one, scenarios=per_gpu)
    for _, row in res.table.iterrows():
        click.echo(f"verdict {row['gpu']}: {row['verdict']}")
    click.echo(f"  targets ({source}): " + "; ".join(c.describe()))
    was_pooled = any(pooled(plan.table) for plan in res.plans.values())
    print_runs_table("GPU comparison", res.table.to_dict("records"), GPU_COLUMNS, was_pooled)
    for _, row in res.table.iterrows():
        if row["grid_notes"]:
            click.echo(f"note: {row['gpu']}: {row['grid_notes']}")
    click.echo(f"note: {p95_note(opts['replications'], was_pooled)}")
    if note := bands_note(per_gpu):
        click.echo(f"note: {note}")
    click.echo("note: max par = the largest parallel of any feasible point, each session "
               "guaranteed its full context (on vllm/sglang the KV pool holds that many "
               "max_model_len requests); USD/session = price / max par; device GiB = "
               "what an engine may allocate, fit's 'device memory' (on unified memory the "
               "GPU's default share of RAM; compare.csv memory_gib: the whole memory)")
    for _, row in res.table.iterrows():
        if row["feasible"]:
            click.echo(f"{row['gpu']}: {row['flags']}")
            for note in flag_notes_of(res, row["gpu"]):
                click.echo(f"  note: {note}")
        else:
            click.echo(f"{row['gpu']}: nothing on the grid meets every target (its verdict "
                       "above names the nearest miss)")
    if opts["out_dir"] is not None:
        out = opts["out_dir"]
        slo = {b.key: b.limit_s for b in c.latency}
        with output_errors("--out", out):
            write_table(res.table, out / "compare.csv")
            write_table(res.table, out / "compare.parquet")
            write_table(_plans_table(res), out / "plan.parquet")
            path = maybe_report("compare", out, not opts["no_report"], compare=res.table,
                                slo=slo, plotlyjs=opts["plotlyjs"],
                                verdicts=[{"name": r.gpu, "headline": f"verdict: {r.verdict}",
                                           "meets": bool(r.feasible)}
                                          for r in res.table.itertuples()])
        click.echo(f"wrote {out}" + (f" and {path}" if path else ""))


def flag_notes_of(res: Any, gpu: str) -> list[str]:
    rec = res.plans[gpu].recommendation or {}
    return list(rec.get("flag_notes", []))


def _plans_table(res: Any) -> pd.DataFrame:
    return pd.concat([p.table.assign(gpu=g) for g, p in res.plans.items()], ignore_index=True)


PREDICTION_OPTIONS = ("inputs", "out_dir", "no_report", "plotlyjs")


def _refuse_gpus_options(ctx: click.Context) -> None:
    """MEASURED PREDICTED takes only -o and --no-report: any other option given is
    refused (it would be silently ignored)."""
    for param in ctx.command.params:
        if param.name in PREDICTION_OPTIONS or getattr(param, "hidden", False):
            continue
        source = ctx.get_parameter_source(param.name or "")
        if source in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            continue
        flag = max(param.opts, key=len)
        value = ctx.params.get(param.name or "")
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
        raise InputError(flag, shown, "applies to 'compare --gpus A,B SCENARIO' only; "
                         "'compare MEASURED PREDICTED' takes only -o, --no-report and "
                         "--plotlyjs")


def _prediction(measured: Path, predicted: Path, opts: dict[str, Any]) -> None:
    from kvsim.calibrate.validate import check_pair, compare_results
    from kvsim.metrics.results import Results

    m, p = Results.load(measured), Results.load(predicted)
    for note in check_pair(m, p):
        click.echo(f"note: {note}", err=True)
    df = compare_results(m, p)
    print_table(f"prediction error ({predicted} vs measured {measured})", df.to_dict("records"),
                ["metric", "measured", "predicted", "error", "rel_error"])
    if opts["out_dir"] is not None:
        out = opts["out_dir"]
        with output_errors("--out", out):
            write_table(df, out / "errors.csv")
            path = None
            if not opts["no_report"]:
                from kvsim.report import write_report

                path = write_report(out / "report.html", [m, p], kind="compare",
                                    plotlyjs=opts["plotlyjs"])
        click.echo(f"wrote {out / 'errors.csv'}" + (f" and {path}" if path else ""))
