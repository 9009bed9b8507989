"""``kvsim validate FILE...``: kvsim's speed predictions beside published or your own
measurements, and its load-time memory layout beside engines' start-up memory logs
(kvsim.validate.run).

Prints one row per prediction (a table for llama-bench speeds, one for serving engines'
speed figures, one for memory figures), the summary
per (kind, backend, metric) and every row it could not predict with the reason;
``--json`` prints all three as one JSON object; ``--report`` writes an HTML page with
predicted vs measured speeds (log-log, one colour per backend).  Problems reading a file
are one line each on stderr; the exit code is 2 only when nothing could be read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kvsim.cli._output import check_output, output_errors
from kvsim.errors import InputError

if TYPE_CHECKING:
    from kvsim.latency.backend import SpeedConstants
    from kvsim.validate.run import Validation

HELP_FILES = ("measurement files: the layouts of docs/reference/measurements (llamabench-scoreboard, "
              "speed-vs-load, engine-memory-logs: vLLM, SGLang, llama.cpp and Ollama "
              "start-up memory figures), the engine-speed layout of "
              "docs/reference/vllm-speed (a serving engine's own latency, TPOT or tokens/s "
              "for a stated prompt, answer and batch, replayed through the simulator), "
              "a serving benchmark's printout as pasted (vllm bench serve / latency, "
              "SGLang bench_serving: replayed on --gpu's card), "
              "llama-bench output (-o json, jsonl, csv or "
              "its markdown table, with the 'Device 0: ...' start-up lines if pasted; "
              "-pg tests too; a run on several GPUs is laid out on that box with its "
              "-sm/-ts/-mg), llama-batched-bench's table, `ollama ps` (its table, "
              "with an `ollama -v` line if pasted, or the /api/ps JSON: SIZE and where it "
              "sits, beside kvsim's layout on --gpu's card), or an engine's own start-up "
              "log as pasted (llama-server, Ollama's server.log, vLLM: the card, model, "
              "weights and settings from its lines, its buffer and KV figures compared)")


@click.command(help="Print kvsim's predicted tokens/s beside measured ones and its load-time "
               "memory layout (KV tokens and bytes, weights, compute buffers, Ollama's "
               "estimate, whether the engine starts) beside engines' printed start-up "
               "figures, the median and p90 |error| per kind, backend and metric, and "
               "every row it could not predict with the reason.\n\nFILE: " + HELP_FILES)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--gpu", help="the device every row ran on (a profile name or a printed name): "
              "for output that names none, or an Apple chip without its GPU-core count "
              "(a memory log keeps its number of GPUs; a speed row is then predicted on "
              "that one card, and a serving engine's figure replayed on it)")
@click.option("--model", help="the model every row ran: a profile name (one carrying the "
              "weight format, llama-3.1-8b-Q4_K_M, gives it to rows that name none: "
              "llama-batched-bench's) or a GGUF file (its header gives it)")
@click.option("--engine-version", help="the engine release the start-up figures came from, "
              "for output that shows none (`ollama ps`, a log pasted without its banner): "
              "Ollama's 0.10.1, vLLM's 0.9.2; unset, a dated row is laid out as the release "
              "of its month and an undated one as the newest kvsim knows")
@click.option("--constants", type=click.Path(path_type=Path), help="speed constants YAML "
              "(default: the fitted ones shipped with kvsim; `kvsim calibrate bench` writes "
              "a card's own)")
@click.option("--calibration", type=click.Path(path_type=Path), help="a `kvsim calibrate "
              "bench` artifact: predict with that card's own fitted constants")
@click.option("--host", default="desktop-64gb", show_default=True,
              help="host profile whose CPU runs on the CPU backend used (with --calibration)")
@click.option("--json", "as_json", is_flag=True, help="print rows, summary and skipped as JSON")
@click.option("--rows/--no-rows", default=True, show_default=True,
              help="print the per-row table (the summary and skipped rows are always printed)")
@click.option("--report", type=click.Path(path_type=Path),
              help="write an HTML page with predicted vs measured")
def validate(files: tuple[Path, ...], gpu: str | None, model: str | None,
             engine_version: str | None, constants: Path | None, calibration: Path | None,
             host: str, as_json: bool, rows: bool, report: Path | None) -> None:
    from kvsim.validate.names import (
        device_spec,
        model_spec,
        with_engine_version,
        with_file_format,
    )
    from kvsim.validate.run import read_inputs
    from kvsim.validate.run import validate as run_validate

    if report is not None:
        check_output("--report", report, folder=False)
    consts = _constants(constants)
    gpu_spec = None if gpu is None else device_spec(gpu, backend="", host=host)
    model_sp = None if model is None else model_spec(model)
    if calibration is not None:
        from kvsim.latency.bench_artifact import load_bench_artifact

        if not calibration.is_file():
            raise InputError("--calibration", str(calibration), "file not found")
        art = load_bench_artifact(calibration)
        gpu_spec, consts = art.device, art.constants
    meas, skipped, problems = read_inputs(list(files))
    meas = with_engine_version(with_file_format(meas, model), engine_version)
    for p in problems:
        click.echo(f"warning: {p}", err=True)
    if not meas and not skipped:
        raise InputError("FILE", ", ".join(map(str, files)), "at least one file with "
                         "measurements in a known layout: " + HELP_FILES)
    v = run_validate(meas, gpu=gpu_spec, model=model_sp, constants=consts,
                     replay=_replay)
    v.skipped = skipped + v.skipped
    v.problems = problems
    if report is not None:
        with output_errors("--report", report):
            _write_report(v, report)
    if as_json:
        click.echo(json.dumps(v.to_json(), indent=1))
    else:
        _print(v, rows)


def _replay(scenario: Any, sessions: list[Any]) -> Any:
    """A serving engine's figure replayed (kvsim.validate.engine_speed.Replay)."""
    from kvsim.api import simulate

    return simulate(scenario, sessions=sessions).summary


def _constants(path: Path | None) -> SpeedConstants | None:
    if path is None:
        return None
    from kvsim.latency.backend import load_constants

    if not path.is_file():
        raise InputError("--constants", str(path), "file not found")
    return load_constants(str(path))


def _print(v: Validation, rows: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    speed = [r for r in v.rows if r["kind"] not in ("memory", "serving")]
    if rows and speed:
        t = Table(title="predicted vs measured (tokens/s)", title_justify="left")
        for c in ("id", "gpu", "backend", "model", "weights", "test", "measured", "predicted",
                  "error"):
            t.add_column(c, justify="right" if c in ("measured", "predicted", "error") else "left")
        for r in speed:
            t.add_row(str(r["id"]), str(r["gpu"]), str(r["backend"]), str(r["model"]),
                      str(r["weights"]), _test(r), f"{r['measured_tps']:.2f}",
                      f"{r['predicted_tps']:.2f}", f"{100 * r['rel_err']:+.1f} %")
        con.print(t)
    if rows and any(r["kind"] == "serving" for r in v.rows):
        con.print(_serving_table(v, Table))
    if rows and any(r["kind"] == "memory" for r in v.rows):
        con.print(_memory_table(v, Table))
    s = Table(title="summary per kind, backend and metric", title_justify="left")
    for c in ("kind", "backend", "metric", "n", "median |err|", "p90 |err|", "median err"):
        s.add_column(c)
    for r in v.summary():
        s.add_row(r["kind"], r["backend"], r["metric"], str(r["n"]),
                  f"{100 * r['median_abs_rel_err']:.1f} %", f"{100 * r['p90_abs_rel_err']:.1f} %",
                  f"{100 * r['median_rel_err']:+.1f} %")
    con.print(s)
    starts = [r for r in v.rows if r["metric"] == "startup"]
    if starts:
        missed = sum(1 for r in starts if r["rel_err"])
        con.print(f"start-up outcome (error 0 = kvsim agrees, 1 = it does not): {missed} of "
                  f"{len(starts)} predicted wrongly")
    if v.skipped:
        k = Table(title=f"not predicted ({len(v.skipped)} rows)", title_justify="left")
        k.add_column("id")
        k.add_column("reason")
        for sk in v.skipped:
            k.add_row(sk.id, sk.reason)
        con.print(k)


def _memory_table(v: Validation, table: Any) -> Any:
    """Memory-log rows: measured and predicted in the figure's unit, and the error."""
    t = table(title="predicted vs measured (start-up memory)", title_justify="left")
    for c in ("id", "engine", "gpu", "model", "weights", "figure", "measured", "predicted",
              "error"):
        t.add_column(c, justify="right" if c in ("measured", "predicted", "error") else "left")
    for r in v.rows:
        if r["kind"] != "memory":
            continue
        figure = str(r["metric"]) + (f" ({r['device']})" if r["device"] else "")
        error = ("agrees" if not r["rel_err"] else "MISS") if r["metric"] == "startup" \
            else f"{100 * r['rel_err']:+.1f} %"
        t.add_row(str(r["id"]), str(r["backend"]), str(r["gpu"]), str(r["model"]),
                  str(r["weights"]), figure, _amount(r["measured"], r["unit"]),
                  _amount(r["predicted"], r["unit"]), error)
    return t


def _serving_table(v: Validation, table: Any) -> Any:
    """Serving engines' figures (kvsim.validate.engine_speed): in the figure's unit."""
    t = table(title="predicted vs measured (serving engines, replayed)", title_justify="left")
    for c in ("id", "engine", "gpu", "model", "weights", "shape", "figure", "measured",
              "predicted", "error"):
        t.add_column(c, justify="right" if c in ("measured", "predicted", "error") else "left")
    for r in v.rows:
        if r["kind"] == "serving":
            t.add_row(str(r["id"]), str(r["backend"]), str(r["gpu"]), str(r["model"]),
                      str(r["weights"]), f"{r['input_len']} in, {r['output_len']} out "
                      f"x{r['batch']}", str(r["metric"]), f"{r['measured']:,.4g} {r['unit']}",
                      f"{r['predicted']:,.4g} {r['unit']}", f"{100 * r['rel_err']:+.1f} %")
    return t


def _amount(value: Any, unit: Any) -> str:
    from kvsim.config.units import format_bytes

    if unit == "bytes":
        return format_bytes(float(value))
    if unit in ("tokens", "layers"):
        return f"{float(value):,.0f}"
    return str(value)


def _test(r: dict[str, Any]) -> str:
    from kvsim.validate.predict import DEFAULT_UBATCH
    from kvsim.validate.records import test_name

    name = test_name(r["metric"], r["n_prompt"], r["n_gen"])
    if r["depth"]:
        name += f" @ d{r['depth']}"
    if r["batch"] > 1:
        name += f" x{r['batch']}"
    if r.get("n_ubatch") not in (None, DEFAULT_UBATCH):  # llama-bench -ub: a micro-batch sweep
        name += f" ub{r['n_ubatch']}"
    return name


def _write_report(v: Validation, path: Path) -> None:
    from kvsim.report.page import write_report

    # NOTE: the figure plots llama-bench tokens/s
    speed = [r for r in v.rows if r["kind"] not in ("memory", "serving")]
    write_report(path, extra={"validation": speed, "title": "kvsim validate"})
