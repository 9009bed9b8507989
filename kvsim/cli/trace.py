"""``kvsim trace``: generate household traces, import public traces, sample, inspect.

Output format follows the output file's extension (``.jsonl`` or ``.parquet``).
Outputs are written atomically (temp file + rename): a failing command leaves no
output file.  Import warnings (rows sorted under ``--sort``, failed rows skipped)
are printed as ``warning: ...`` lines on stderr.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from kvsim.cli._output import check_output, output_errors
from kvsim.config.units import check_finite_positive
from kvsim.errors import InputError


@contextmanager
def _echo_warnings() -> Iterator[None]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                click.echo(f"warning: {w.message}", err=True)


def _start(output: str) -> None:
    """Refuse a bad output name or location before reading or generating anything."""
    from kvsim.workload.io import trace_format

    trace_format(output, "--output")
    check_output("--output", output, folder=False)


def _finite_positive(flag: str, value: float | None, unit: str) -> None:
    """``value`` (when given) is a finite number > 0 (NaN and inf are refused)."""
    if value is not None:
        check_finite_positive(flag, value, f"a finite number > 0 ({unit})")


def _write(output: str, sessions: Iterable[Any], meta: Any) -> None:
    from kvsim.workload.io import write_trace

    with output_errors("--output", output):
        n = write_trace(output, sessions, meta)
    click.echo(f"wrote {n} sessions to {output}", err=True)


@click.group()
def trace() -> None:
    """Generate, import, sample and inspect session traces."""


@trace.command()
@click.argument("preset")
@click.option("--days", type=float, default=1.0, show_default=True, help="days to generate")
@click.option("--seed", type=int, default=0, show_default=True,
              help="random seed (>= 0); the same seed gives the same trace")
@click.option("--start-weekday", type=int, default=0, show_default=True, help="0 = Monday")
@click.option("-o", "--output", required=True, help="output trace (.jsonl or .parquet)")
def generate(preset: str, days: float, seed: int, start_weekday: int, output: str) -> None:
    """Generate household sessions from PRESET (name like family-4, or a YAML path)."""
    from kvsim.workload.generator import generate as gen
    from kvsim.workload.preset import load_preset
    from kvsim.workload.schema import TraceMeta

    _start(output)
    p = load_preset(preset)
    sessions = iter(gen(p, days, seed, start_weekday))
    first = next(sessions, None)
    if first is None:  # NOTE: a short span can draw no session (Poisson); say which input
        raise InputError("--days", f"{days:g}", f"a span in which {p.name} draws a session: "
                         f"seed {seed} drew none in it; give more days or another --seed")
    meta = TraceMeta(source=f"preset:{p.name}", seed=seed,
                     description=f"{days:g} days from weekday {start_weekday}")
    _write(output, itertools.chain([first], sessions), meta)


@trace.command(name="import")
@click.argument("fmt", metavar="FORMAT")
@click.argument("file")
@click.option("-o", "--output", required=True, help="output trace (.jsonl or .parquet)")
@click.option("--sort", is_flag=True, help="sort rows whose timestamps go backwards (warns)")
def import_(fmt: str, file: str, output: str, sort: bool) -> None:
    """Import FILE in FORMAT (mooncake, azure, burstgpt, sharegpt)."""
    from kvsim.workload.importers import import_trace

    _start(output)
    with _echo_warnings():
        meta, sessions = import_trace(fmt, file, sort=sort)
        _write(output, sessions, meta)


@trace.command()
@click.argument("file")
@click.option("--sessions", "n_sessions", type=int, default=None, help="keep N whole sessions")
@click.option("--rate", type=float, default=None,
              help="keep whole sessions until the request rate is R per second")
@click.option("--scale-to-rate", type=float, default=None,
              help="then scale arrival times so the request rate is R per second")
@click.option("--seed", type=int, default=0, show_default=True,
              help="random seed (>= 0) for which sessions --sessions / --rate keep")
@click.option("--sort", is_flag=True, help="accept an unsorted trace (sorted, with a warning)")
@click.option("-o", "--output", required=True, help="output trace (.jsonl or .parquet)")
def sample(file: str, n_sessions: int | None, rate: float | None, scale_to_rate: float | None,
           seed: int, sort: bool, output: str) -> None:
    """Down-sample FILE by whole sessions (and optionally rescale time)."""
    from kvsim.workload.io import TraceSessions, read_meta
    from kvsim.workload.sampling import kept_sessions
    from kvsim.workload.sampling import scale_to_rate as do_scale

    # NOTE: refused before the trace is read (sample / scale_to_rate would refuse them
    # only after reading it)
    _finite_positive("--rate", rate, "requests per second")
    _finite_positive("--scale-to-rate", scale_to_rate, "requests per second")
    _start(output)
    meta = read_meta(file)
    with _echo_warnings():
        kept = kept_sessions(TraceSessions(file, sort), n_sessions=n_sessions, rate=rate,
                             seed=seed)
        if scale_to_rate is not None:
            kept = do_scale(kept, scale_to_rate)  # refuses a rate it cannot reach
    note = f"sampled from {meta.source} (seed {seed})"
    _write(output, kept, meta.model_copy(update={"description": note}))


@trace.command()
@click.argument("file")
@click.option("--format", "fmt", default="kvsim", show_default=True,
              help="kvsim (a .jsonl/.parquet trace) or a raw format: mooncake, azure, "
                   "burstgpt, sharegpt")
@click.option("--json", "as_json", is_flag=True, help="print the statistics as JSON")
@click.option("--prefill-tok-s", type=float, default=2000.0, show_default=True,
              help="service model: prefill tokens per second")
@click.option("--decode-tok-s", type=float, default=50.0, show_default=True,
              help="service model: decode tokens per second")
@click.option("--sort", is_flag=True, help="sort rows whose timestamps go backwards (warns)")
def inspect(file: str, fmt: str, as_json: bool, prefill_tok_s: float, decode_tok_s: float,
            sort: bool) -> None:
    """Rows, sessions, arrivals, token percentiles, concurrency, reuse, references."""
    from kvsim.workload.importers import import_trace
    from kvsim.workload.inspect import ServiceModel, inspect_sessions
    from kvsim.workload.io import TraceSessions

    _finite_positive("--prefill-tok-s", prefill_tok_s, "tokens per second")
    _finite_positive("--decode-tok-s", decode_tok_s, "tokens per second")
    service = ServiceModel(prefill_tok_s=prefill_tok_s, decode_tok_s=decode_tok_s)
    with _echo_warnings():
        source = TraceSessions(file, sort) if fmt == "kvsim" else \
            import_trace(fmt, file, sort)[1]
        stats = inspect_sessions(source, service)
    if as_json:
        click.echo(json.dumps(stats, indent=2))
    else:
        _print_table(stats)


def _flatten(d: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and all(not isinstance(x, dict) for x in v.values()) \
                and len(v) <= 5:
            yield key, ", ".join(f"{a}={_fmt(b)}" for a, b in v.items())
        elif isinstance(v, dict):
            yield from _flatten(v, key + ".")
        else:
            yield key, _fmt(v)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _print_table(stats: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="trace statistics", show_header=True)
    table.add_column("metric")
    table.add_column("value")
    for key, value in _flatten(stats):
        table.add_row(key, value)
    Console(width=120).print(table)
