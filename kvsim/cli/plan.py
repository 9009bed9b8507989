"""``kvsim plan SCENARIO``: the largest context × parallel that meets every target.

Prints every point tried with its binding constraint, the Pareto front and the
recommendation with the exact engine flags; ``-o DIR`` also writes
``plan.parquet``/``plan.csv``, ``front.csv`` and ``recommendation.json``, and a
report (``report.html``) unless ``--no-report``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from kvsim.cli._output import PLOTLYJS_HELP, check_output, output_errors
from kvsim.cli._plan_common import (
    ERR,
    constraint_options,
    load_runner,
    maybe_report,
    print_table,
    progress_bar,
)
from kvsim.cli._speed_band_output import bands_note
from kvsim.config.files import load_yaml, parse_yaml
from kvsim.config.units import format_latency, parse_count
from kvsim.errors import InputError
from kvsim.plan.advice import constraints_for
from kvsim.plan.executor import make_executor
from kvsim.plan.explain import identical_rows, plan_verdict
from kvsim.plan.flags import check_contexts, check_parallels
from kvsim.plan.parallel import PARALLEL_HELP
from kvsim.plan.replicate import simulate_run
from kvsim.plan.search import PlanGrid, PlanResult
from kvsim.plan.slo import Constraints
from kvsim.plan.store import write_table
from kvsim.plan.widen import search_widening
from kvsim.policies.registry import kinds_help
from kvsim.scenario import Scenario, load_scenario

DEFAULT_CONTEXTS = (4096, 8192, 16384, 32768, 65536, 131072)
DEFAULT_PARALLEL = (1, 2, 3, 4, 6, 8)
POINT_COLUMNS = ["kv_dtype", "policy", "context_tokens", "parallel", "feasible", "binding",
                 "ttft_p95_s", "itl_p95_s", "failed_requests", "peak_device_fraction",
                 "oom_risk", "evaluated"]


def parse_list(text: str | None, field: str, example: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    values = tuple(parse_count(v.strip(), field) for v in text.split(",") if v.strip())
    if not values:
        raise InputError(field, text, f"a comma-separated list, e.g. {example} (empty grid)")
    return values


def parse_policy(text: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    """``none`` | ``FILE.yaml`` (a mapping or a list of them) | ``KIND[:key=value,...]``."""
    if text == "none":
        return "none", ()
    if text.endswith((".yaml", ".yml")):
        doc = load_yaml(Path(text), "--policy")
        items = doc if isinstance(doc, list) else [doc]
        if not all(isinstance(d, dict) and "kind" in d for d in items):
            raise InputError("--policy", text, "mappings with a 'kind' key")
        return Path(text).stem, tuple(items)
    kind, _, rest = text.partition(":")
    cfg: dict[str, Any] = {"kind": kind}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InputError("--policy", text, "KIND[:key=value,...], a YAML file or 'none'")
        cfg[key] = parse_yaml(value, "--policy", text)
    return text, (cfg,)


def build_grid(s: Scenario, contexts: str | None, parallel: str | None, kv: str | None,
               policies: tuple[str, ...]) -> PlanGrid:
    ctx = parse_list(contexts, "--contexts", "8Ki,16Ki,32Ki") or tuple(
        c for c in DEFAULT_CONTEXTS if c <= s.model.max_context_tokens)
    check_contexts(ctx, s.model)
    par = parse_list(parallel, "--parallel", "1,2,4") or DEFAULT_PARALLEL
    check_parallels(par, s.engine)
    kvs: tuple[str | None, ...] = (None,)
    if kv is not None:
        kvs = tuple(k.strip() for k in kv.split(",") if k.strip())
        if not kvs:
            raise InputError("--kv", kv, "a comma-separated list of cache types (empty grid)")
    pols = tuple(parse_policy(p) for p in policies) or (("scenario", None),)
    return PlanGrid(ctx, par, kvs, pols)


PLAN_OUT_HELP = ("write plan.parquet, plan.csv, front.csv, recommendation.json and "
                 "report.html here")


def grid_options(fn: Any, out_help: str = PLAN_OUT_HELP) -> Any:
    """The grid and output flags of plan (and of ``compare --gpus``; ``out_help`` says
    what that command's ``-o`` writes)."""
    for opt in reversed([
        click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                     help="override a scenario key (repeatable)"),
        click.option("--contexts", default=None, help="per-session contexts in tokens, e.g. 8192,16384 or 8Ki,16Ki, "
                     "each at most the model's maximum (default: 4Ki to 128Ki, up to it)"),
        click.option("--parallel", default=None, help="parallel values, e.g. 1,2,4: "
                     + PARALLEL_HELP),
        click.option("--kv", default=None, help="KV cache types to try, e.g. f16,q8_0,q4_0"),
        click.option("--policy", "policies", multiple=True,
                     help="policy set to try: none | FILE.yaml | KIND[:k=v,...] (repeatable); "
                     f"KIND: {kinds_help()}"),
        click.option("-o", "--out", "out_dir", type=click.Path(path_type=Path), default=None,
                     help=out_help),
        click.option("--no-report", is_flag=True, help="do not write report.html"),
        click.option("--plotlyjs", type=click.Choice(["inline", "dir", "cdn"]),
                     default="inline", show_default=True, help=PLOTLYJS_HELP),
        click.option("--no-progress", is_flag=True, help="no progress bar"),
    ]):
        fn = opt(fn)
    return fn


def run_search(s: Scenario, c: Constraints, grid: PlanGrid, opts: dict[str, Any],
               label: str = "plan") -> PlanResult:
    """The search over ``grid``, widened while its answer sits on the edge of an axis the
    user left to its default (kvsim.plan.widen)."""
    runner = load_runner(opts["runner"], simulate_run)
    executor = make_executor(opts["jobs"])
    total = len(grid.contexts) * len(grid.parallels) * len(grid.kv_dtypes) * len(grid.policies)
    try:
        with progress_bar(f"{label}: runs", total * opts["replications"],
                          not opts["no_progress"]) as advance:
            return search_widening(s, c, grid, replications=opts["replications"],
                                   executor=executor, runner=runner,
                                   conservative=opts["conservative"], progress=advance,
                                   widen=(opts["parallel"] is None, opts["contexts"] is None))
    finally:
        executor.close()


def plan_constraints(s: Scenario, opts: dict[str, Any]) -> tuple[Constraints, str]:
    """The targets of plan and compare: --slo, else the scenario's slo section, else
    kvsim's defaults (kvsim.plan.advice.DEFAULT_SLOS)."""
    return constraints_for(s, tuple(opts["slos"]),
                           max_device_fraction=opts["max_device_fraction"],
                           max_oom_risk=opts["max_oom_risk"], min_recall=opts["min_recall"])


def shown_columns(table: Any) -> list[str]:
    """Point columns worth a terminal column (kv/policy only when they vary)."""
    cols = [k for k in POINT_COLUMNS if k in table.columns]
    return [k for k in cols if k not in ("kv_dtype", "policy") or table[k].nunique() > 1]


# Latency cells as people read them; the headers say what they are
SHOWN_AS = {"ttft_p95_s": "TTFT p95", "itl_p95_s": "ITL p95", "failed_requests": "failed/run"}


def pooled(table: Any) -> bool:
    """Did the search pool its latency percentiles (runs that hand their values back)?"""
    return "p95_pooled" in table and bool(table["p95_pooled"].fillna(False).astype(bool).any())


def p95_note(n: int, pooled: bool = True) -> str:
    """What the plan's p95 figures are, and how they relate to ``kvsim simulate``."""
    if not pooled:  # a runner that gives summaries only (--runner)
        return (f"mean TTFT/ITL p95: each of the {n} seeded runs' own p95, averaged (95 % "
                "Student-t CI of that mean, none from one run: *_low/*_high in plan.csv; the "
                "SLOs judge the mean, or the CI's upper end with --conservative). The runs' "
                "seeds are split from the scenario's seed and do not include it: 'kvsim "
                "simulate' runs that seed itself, one more draw that may fall outside the CI")
    return (f"TTFT/ITL p95: over every request (every gap) of the {n} seeded runs pooled, "
            "as GuideLLM and benchmark_serving mean it; 95 % CI from a bootstrap over "
            "sessions (scipy.stats.bootstrap): *_low/*_high in plan.csv, latency_requests "
            "the requests each rests on. The SLOs judge the pooled p95, or the CI's upper "
            "end with --conservative. The runs' seeds are split from the scenario's seed "
            "and do not include it: 'kvsim simulate' runs that seed itself, one more draw")


def jitter_note(noise_words: str) -> str:
    """What a plan's intervals hold when the scenario has timing noise (``noise_words``:
    ``JitterKnobs.noise_words``)."""
    return (f"timing noise: every run's timing carries {noise_words}, drawn from its own "
            "seed, so the intervals include how far the outcomes move when timing wobbles")


KV_POOL_NOTE = ("the vllm/sglang block pool holds fewer than parallel requests at the "
                "context (vLLM's 'Maximum concurrency' < parallel): --max-num-seqs would "
                "admit them, but not give each its full context")


def print_runs_table(title: str, rows: list[dict[str, Any]], columns: list[str],
                     pooled: bool = True) -> None:
    """:func:`print_table` with the latencies in ms below 10 s (s above), headed as the
    means of the runs' own p95 when they were not pooled."""
    names = SHOWN_AS if pooled else {**SHOWN_AS, "ttft_p95_s": "mean TTFT p95",
                                     "itl_p95_s": "mean ITL p95"}

    def cell(k: str, v: Any) -> Any:
        if k in ("ttft_p95_s", "itl_p95_s") and isinstance(v, float):
            return format_latency(v)
        return v

    print_table(title, [{names.get(k, k): cell(k, v) for k, v in r.items()} for r in rows],
                [names.get(c, c) for c in columns])


def recommendation_doc(res: PlanResult) -> dict[str, Any] | None:
    if res.recommendation is None:
        return None
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in res.recommendation.items()
            if k != "scenario" and not (isinstance(v, float) and math.isnan(v))}


@click.command()
@click.argument("scenario")
@constraint_options
@grid_options
def plan(scenario: str, sets: tuple[str, ...], **opts: Any) -> None:
    """Search context × parallel (× KV types, policies) for the largest feasible setting.
    Prints a verdict first (the recommendation and why it meets every target, or the
    nearest miss and what would help), widens an axis left to its default while the answer
    sits on its edge (on one you gave, says what memory would allow), and says why rows
    come out identical. Without --slo the targets are the scenario's
    slo section, else ttft_p95=2s and itl_p95=150ms."""
    s = load_scenario(scenario, list(sets))
    c, source = plan_constraints(s, opts)
    grid = build_grid(s, opts["contexts"], opts["parallel"], opts["kv"], opts["policies"])
    if opts["out_dir"] is not None:
        check_output("--out", opts["out_dir"], folder=True)
    res = run_search(s, c, grid, opts)
    verdict = [*plan_verdict(res.table, res.recommendation, c),
               f"targets ({source}): " + "; ".join(c.describe())]
    for line in verdict:
        click.echo(line if line.startswith("verdict:") else f"  {line}")
    cols, was_pooled = shown_columns(res.table), pooled(res.table)
    print_runs_table("points tried", res.table.to_dict("records"), cols, was_pooled)
    print_runs_table("Pareto front (largest feasible)", res.front.to_dict("records"),
                     [k for k in cols if k not in ("feasible", "binding", "evaluated")],
                     was_pooled)
    for line in [*res.grid_notes, *identical_rows(res.table)]:
        click.echo(f"note: {line}")
    click.echo(f"note: {p95_note(opts['replications'], was_pooled)}")
    if note := bands_note({s.gpu.name: s}):
        click.echo(f"note: {note}")
    if s.latency.jittered:
        click.echo(f"note: {jitter_note(s.latency.noise_words)}")
    if "binding" in res.table and (res.table["binding"] == "kv_pool").any():
        click.echo(f"note: kv_pool: {KV_POOL_NOTE}")
    for note in res.notes:
        ERR.print(f"note: {note}")
    rec = recommendation_doc(res)
    if rec is None:
        click.echo("no feasible configuration on this grid (the verdict above names the "
                   "nearest miss)")
    else:
        click.echo(f"recommended: context {rec['context_tokens']} × parallel {rec['parallel']}"
                   f" (kv {rec['kv_dtype']}, policy {rec['policy']})")
        click.echo(f"  {rec.get('flags', '')}")
        for note in rec.get("flag_notes", []):
            click.echo(f"  note: {note}")
    if opts["out_dir"] is not None:
        with output_errors("--out", opts["out_dir"]):
            write_plan(opts["out_dir"], res, rec, c, not opts["no_report"],
                       opts["replications"], verdict, opts["plotlyjs"])


def write_plan(out: Path, res: PlanResult, rec: dict[str, Any] | None, c: Constraints,
               report: bool, replications: int, verdict: list[str],
               plotlyjs: str = "inline") -> None:
    write_table(res.table, out / "plan.parquet")
    write_table(res.table, out / "plan.csv")
    write_table(res.front, out / "front.csv")
    tmp = out / ".recommendation.json.tmp"
    tmp.write_text(json.dumps({"verdict": verdict, "recommendation": rec,
                               "constraints": c.describe(),
                               "notes": res.notes + res.grid_notes,
                               "p95_note": p95_note(replications, pooled(res.table))},
                              indent=1, default=str), encoding="utf-8")
    tmp.replace(out / "recommendation.json")
    slo = {b.key: b.limit_s for b in c.latency}
    path = maybe_report("plan", out, report, plan=res.table, recommendation=rec, slo=slo,
                        verdicts=[{"headline": verdict[0], "details": verdict[1:],
                                   "meets": rec is not None}], plotlyjs=plotlyjs)
    click.echo(f"wrote {out}" + (f" and {path}" if path else ""))
