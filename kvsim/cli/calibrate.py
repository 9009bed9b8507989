"""``kvsim calibrate``: measure this device (kernels), a running server (engine), fit a
card's speed constants from llama-bench output (bench), or read an engine's startup log
(from-log)."""

from __future__ import annotations

import json

import click

from kvsim.cli._output import check_output, output_errors
from kvsim.errors import InputError


def _ints(text: str, field: str, minimum: int = 1) -> tuple[int, ...]:
    """A comma-separated list of integers >= ``minimum`` (none may be dropped)."""
    allowed = f"a comma-separated list of integers >= {minimum}"
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InputError(field, text, allowed) from None
    if not vals or min(vals) < minimum:
        raise InputError(field, text, allowed)
    return vals


def _names(text: str, field: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated list of names from ``allowed``; empty is an InputError."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names:
        raise InputError(field, text, "an empty list; give one or more of " + ", ".join(allowed))
    for name in names:
        if name not in allowed:
            raise InputError(field, name, "one of " + ", ".join(allowed))
    return names


@click.group()
def calibrate() -> None:
    """Measure KV bytes, step timings and bandwidth, fit a card's speed from llama-bench
    output, or read KV capacity facts from a startup log."""


@calibrate.command()
@click.option("--model", required=True, help="model profile name or YAML path")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="torch device to time the layers on")
@click.option("--layers", type=int, default=2, show_default=True,
              help="decoder layers to build (timings scale to the model's layer count)")
@click.option("--batches", default="1,2,4", show_default=True,
              help="batch sizes to time (sequences per step)")
@click.option("--contexts", default="256,1024,4096", show_default=True,
              help="cached tokens per sequence at each timed decode step (prefill chunks "
              "end at this length)")
@click.option("--prefill", default="64,256,1024", show_default=True,
              help="prefill chunk sizes (tokens)")
@click.option("--cache-types", default="f16,q8_0,q4_0", show_default=True,
              help="KV cache types to time, size and measure the error of (comma-separated)")
@click.option("--repeats", type=int, default=5, show_default=True,
              help="timed runs per measurement after a warm-up; the median is kept")
@click.option("--threads", type=int, default=None,
              help="torch CPU threads (default: torch's); fewer than cores on a shared box")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="artifact path, e.g. calibration/DEVICE__MODEL.json")
def kernels(model: str, device: str, layers: int, batches: str, contexts: str, prefill: str,
            cache_types: str, repeats: int, threads: int | None, output: str) -> None:
    """Build the model's layers with random weights and time them on DEVICE."""
    from kvsim.calibrate.kernels import KernelGrid, calibrate_kernels
    from kvsim.calibrate.torch_model import KV_DTYPES
    from kvsim.config.catalog import load_model
    from kvsim.model.names import model_slug

    types = _names(cache_types, "--cache-types", KV_DTYPES)
    if layers <= 0 or repeats <= 0:
        raise InputError("--layers/--repeats", (layers, repeats), "positive integers")
    grid = KernelGrid(batches=_ints(batches, "--batches"), contexts=_ints(contexts, "--contexts"),
                      prefill_tokens=_ints(prefill, "--prefill"), cache_types=types,
                      repeats=repeats)
    spec = load_model(model_slug(model, "--model"))
    check_output("--output", output, folder=False)
    art = calibrate_kernels(spec, device, layers, grid, threads=threads)
    _save(art, output)


@calibrate.command()
@click.option("--url", required=True, help="llama-server base URL, e.g. http://127.0.0.1:8080")
@click.option("--cache-type", default="f16", show_default=True,
              help="the server's KV cache type (-ctk/-ctv), recorded as the fit's key")
@click.option("--token-range", default="1000:30000", show_default=True,
              help="token ids LOW:HIGH used for synthetic prompts")
@click.option("--ban-tokens", default="", help="token ids LOW:HIGH to ban via logit_bias")
@click.option("--prompts", default="32,128,512", show_default=True, help="new prompt tokens")
@click.option("--contexts", default="0,512,1536", show_default=True,
              help="cached tokens (left at the default, shrunk to fit the server's slot)")
@click.option("--batches", default="1,2,4", show_default=True, help="parallel decodes")
@click.option("--decode-tokens", type=int, default=48, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True,
              help="rounds over the whole grid (each visits every point once); from 3 on, "
              "their spread is printed as latency.jitter_run_cv")
@click.option("--decode-repeats", type=int, default=3, show_default=True,
              help="decode requests per point per round")
@click.option("--small-chunk-tokens", type=int, default=64, show_default=True,
              help="prompts shorter than this get their own attention cost (ggml CPU flash "
                   "attention tiles 64 query rows; 0 = one cost for all)")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="artifact path (JSON), e.g. calibration/my-box__engine.json")
def engine(url: str, cache_type: str, token_range: str, ban_tokens: str, prompts: str,
           contexts: str, batches: str, decode_tokens: int, repeats: int,
           decode_repeats: int, small_chunk_tokens: int, output: str) -> None:
    """Fit a running llama-server's prefill, decode and batch costs (streamed requests)."""
    from kvsim.calibrate.engine import EngineGrid, calibrate_engine
    from kvsim.calibrate.wire import server_url

    url = server_url(url)
    # NOTE: EngineGrid checks its own fields (cache type, counts, repeats), named by flag
    grid = EngineGrid(prompt_tokens=_ints(prompts, "--prompts"),
                      contexts=_ints(contexts, "--contexts", minimum=0),
                      batches=_ints(batches, "--batches"), decode_tokens=decode_tokens,
                      repeats=repeats, decode_repeats=decode_repeats, cache_type=cache_type,
                      space=token_space(token_range, ban_tokens),
                      small_chunk_tokens=small_chunk_tokens)
    check_output("--output", output, folder=False)
    # NOTE: the default contexts follow the server's slot; contexts the user gave do not
    fit = click.get_current_context().get_parameter_source("contexts") \
        == click.core.ParameterSource.DEFAULT
    art = calibrate_engine(url, grid, fit_contexts=fit)
    measured = tuple(int(c) for c in art.grid.get("context", grid.contexts))
    if fit and measured != grid.contexts:
        click.echo("note: cached contexts " + ",".join(map(str, measured)) + " (the "
                   "default grid's, shrunk to the server's slot; --contexts sets them)",
                   err=True)
    _save(art, output)


@calibrate.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--model", help="the model the runs used: a profile name, a profile YAML, the "
              "GGUF file or its config.json (default: resolved from the output's model name); "
              "a GGUF's header, or a name carrying the format (llama-3.1-8b-Q4_K_M), gives "
              "the weight format to rows that name none (llama-batched-bench's)")
@click.option("--gpu", help="the card the runs used (default: llama-bench's gpu_info); "
              "unset for a CPU-only run, whose device is --host's CPU")
@click.option("--host", default="desktop-64gb", show_default=True,
              help="host profile whose CPU a CPU-only run measured")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="artifact path (JSON), e.g. calibration/my-card__bench.json")
def bench(files: tuple[str, ...], model: str | None, gpu: str | None, host: str,
          output: str) -> None:
    """Fit this card's speed constants from llama-bench / llama-batched-bench output
    (-o json, jsonl, csv or the markdown table): several -p/-n/-d values (and -b/-ub)
    pin prefill, decode and attention costs. Use the artifact as
    `latency: {kind: calibrated, path: ...}` or with `kvsim validate --calibration`."""
    from pathlib import Path

    from kvsim.calibrate.bench import fit_bench
    from kvsim.latency.bench_artifact import save_bench_artifact
    from kvsim.validate.names import device_spec, model_spec, with_file_format
    from kvsim.validate.run import read_files

    check_output("--output", output, folder=False)
    meas, skipped, problems = read_files([Path(f) for f in files])
    for p in problems + [f"{s.id}: {s.reason}" for s in skipped]:
        click.echo(f"warning: {p}", err=True)
    if not meas:
        raise InputError("FILE", ", ".join(files), "llama-bench or llama-batched-bench "
                         "output with at least one measured test")
    first = meas[0]
    dev = device_spec(gpu or first.gpu or None, backend=first.backend, host=host)
    mod = model_spec(model or first.model)
    meas = with_file_format(meas, model)
    art = fit_bench(meas, device=dev, model=mod, sources=tuple(Path(f).name for f in files))
    with output_errors("--output", output):
        save_bench_artifact(art, output)
    err = art.fit_abs_rel_err
    click.echo(f"{art.rows} tests on {dev.display_name} ({art.backend}), model {mod.name}: "
               f"fit |error| median {100 * err['median']:.1f} %, max {100 * err['max']:.1f} %; "
               f"wrote {output}")
    for line in art.skipped:
        click.echo(f"warning: not fitted: {line}", err=True)


@calibrate.command("from-log")
@click.argument("logfile", type=click.Path(dir_okay=False))
def from_log(logfile: str) -> None:
    """Read KV capacity facts (tokens, blocks, n_ctx, KV, weight and compute buffer sizes,
    batch sizes, flash attention, cache types) from a vLLM, llama.cpp or Ollama startup
    log and print them as JSON on stdout, with the scenario keys that pin them
    ("scenario"). Nothing is written or applied: copy the keys you need into your
    scenario."""
    from kvsim.engines.startup_log import read_log, scenario_keys

    facts = read_log(logfile)
    doc = {k: v for k, v in facts.model_dump(exclude_none=True).items() if v != {}}
    keys = scenario_keys(facts)
    click.echo(json.dumps({**doc, **({"scenario": keys} if keys else {})}, indent=1))


def _save(art, output: str) -> None:  # type: ignore[no-untyped-def]
    """Write the artifact (an unwritable --output is one line) and print its fits."""
    from kvsim.latency.artifact import save_artifact

    with output_errors("--output", output):
        save_artifact(art, output)
    _print_fits(art, output)


def token_space(token_range: str, ban_tokens: str):  # type: ignore[no-untyped-def]
    from kvsim.calibrate.wire import TokenSpace

    lo, hi = _range(token_range, "--token-range")
    banned = tuple(range(*_range(ban_tokens, "--ban-tokens"))) if ban_tokens else ()
    return TokenSpace(low=lo, high=hi, banned=banned)


def _range(text: str, field: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi)
    except ValueError:
        raise InputError(field, text, "LOW:HIGH token ids") from None
    if not sep or a < 0 or b <= a:
        raise InputError(field, text, "LOW:HIGH with 0 <= LOW < HIGH")
    return a, b


def _p5_p95(spread: tuple[float, ...]) -> str:
    """p5 / p95 of a spread given as evenly spaced quantiles ("-" when none)."""
    k = len(spread) // 20
    return f"{spread[k]:.2f} / {spread[-1 - k]:.2f}" if spread else "-"


def _print_fits(art, output: str) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{art.source} calibration → {output}")
    for col in ("cache type", "points", "MAPE", "max APE", "max context", "max batch",
                "decode KV knee", "decode spread p5/p95", "TTFT spread p5/p95"):
        table.add_column(col)
    for f in art.fits.values():
        table.add_row(f.cache_type, str(f.points), f"{100 * f.mape:.1f}%",
                      f"{100 * f.max_ape:.1f}%", str(f.max_context), str(f.max_batch),
                      f"{f.kv_knee_tokens:,}" if f.kv_knee_tokens else "-",
                      _p5_p95(f.decode_spread), _p5_p95(f.prefill_spread))
    Console().print(table)
    if isinstance(cv := art.settings.get("step_time_cv"), float):
        prompt = art.settings.get("prompt_step_cv")
        click.echo(_jitter_line(cv, prompt if isinstance(prompt, float) else None))
    if isinstance(run := art.settings.get("run_speed_cv"), float):
        click.echo(_run_line(run, int(art.settings.get("repeats", 0))))
    if isinstance(late := art.settings.get("arrival_delay_s"), float):
        click.echo(_arrival_line(late, float(art.settings.get("arrival_jitter_s", 0.0))))
    for lim in art.limits_reached:
        click.echo(f"limit reached: {lim.what}: {lim.error}", err=True)


def _arrival_line(delay_s: float, sd_s: float) -> str:
    """What the measured arrival delay means for ``latency.arrival_delay_s`` and
    ``latency.arrival_jitter_s`` (engine_noise.arrival_delay)."""
    from kvsim.latency.config import arrival_keys

    return (f"requests reach the server {delay_s * 1e3:.2f} ms late (sd {sd_s * 1e3:.2f} ms: "
            f"the client's lateness and the server's request handling): set "
            f"{arrival_keys(delay_s, sd_s)} to replay it (docs/scenarios.md, Timing noise)")


def _run_line(cv: float, rounds: int) -> str:
    """What the rounds' speed drift means for ``latency.jitter_run_cv`` (below
    JITTER_CV_MAX, kvsim.latency.config)."""
    from kvsim.latency.config import JITTER_CV_MAX

    value = f"{cv:.3f}" if cv < JITTER_CV_MAX else "0.99"
    return (f"run-to-run speed CV {cv:.3f} over {rounds} rounds: set latency.jitter_run_cv: "
            f"{value} to replay how far this machine's speed drifts between runs "
            "(docs/scenarios.md, Timing noise)")


def _jitter_line(cv: float, prompt_cv: float | None = None) -> str:
    """What the measured step-time CVs mean for ``latency.jitter_cv`` and
    ``latency.jitter_prompt_cv``, which take values below JITTER_CV_MAX
    (kvsim.latency.config)."""
    from kvsim.latency.config import JITTER_CV_MAX

    prompt = ""
    if prompt_cv is not None:
        value = (f"{prompt_cv:.3f}" if prompt_cv < JITTER_CV_MAX
                 else f"0.99 (prompt steps measured {prompt_cv:.3f})")
        prompt = f" and latency.jitter_prompt_cv: {value}"
    if cv < JITTER_CV_MAX:
        return (f"step-time CV {cv:.3f}: set latency.jitter_cv: {cv:.3f}{prompt} to replay "
                "this timing noise (docs/scenarios.md, Timing noise)")
    return (f"step-time CV {cv:.3f}: at or above {JITTER_CV_MAX:g}, more than "
            "latency.jitter_cv takes: this server's steps stalled now and then (a busy "
            "machine?); measure again on a quieter one, or replay the largest noise kvsim "
            f"takes (latency.jitter_cv: 0.99{prompt.replace(' and ', ', ')})")
