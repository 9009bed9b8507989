"""Options and helpers shared by ``kvsim plan``, ``compare`` and ``sweep``.

Progress bars (rich, on stderr), the constraint flags, runner lookup and the
optional HTML report, so the three commands stay thin.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvsim.errors import InputError

ERR = Console(stderr=True)
OUT = Console()


def constraint_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The SLO / constraint flags of plan and compare."""
    opts = [
        click.option("--slo", "slos", multiple=True, metavar="METRIC_PCT=DURATION",
                     help="latency SLO, e.g. ttft_p95=2s or itl_p95=150ms, judged on the p95 "
                     "over every request of all replications (repeatable; default: the "
                     "scenario's slo section, else ttft_p95=2s and itl_p95=150ms)"),
        click.option("--max-device-fraction", type=float, default=0.85, show_default=True,
                     help="peak device memory / capacity"),
        click.option("--max-oom-risk", type=float, default=0.01, show_default=True,
                     help="share of replications with an OOM-class event"),
        click.option("--min-recall", type=float, default=None,
                     help="minimum mean recall (accuracy proxy) in [0, 1]"),
        click.option("--replications", "-n", type=int, default=8, show_default=True,
                     help="seeded replications per point (1-1000)"),
        click.option("--jobs", "-j", type=int, default=None,
                     help="worker processes, 1-1024 (default: all cores; 1 = in-process)"),
        click.option("--conservative", is_flag=True,
                     help="judge upper CI bounds (the pooled p95's session bootstrap, Wilson's "
                     "for OOM risk) instead of estimates; "
                     "with no OOM in n runs the bound is about 3.84/(n+3.84), so "
                     "--max-oom-risk must be above it (0.01 needs n >= 381)"),
        click.option("--runner", default=None, hidden=True,
                     help="MODULE:FUNC runner (Scenario -> RunOutput); tests/extensions"),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def load_runner(spec: str | None, default: Callable[..., Any]) -> Callable[..., Any]:
    if not spec:
        return default
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError):
        raise InputError("--runner", spec, "an importable MODULE:FUNC") from None


@contextmanager
def progress_bar(label: str, total: int, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr (a terminal only); yields ``advance(n)``.

    NOTE: when the work fails (bad input found while running) the bar is cleared, so
    the error stays the only line the user sees."""
    if not enabled or total == 0 or not ERR.is_terminal:
        yield lambda n: None
        return
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn())
    with Progress(*cols, console=ERR, transient=False) as prog:
        task = prog.add_task(label, total=total)
        try:
            yield lambda n: prog.advance(task, n)
        except BaseException:
            prog.live.transient = True
            raise


# Short column headers, so the tables stay readable in an 80-column terminal.
HEADERS = {"kv_dtype": "kv", "context_tokens": "context", "best_context_tokens": "context",
           "best_parallel": "parallel", "best_kv_dtype": "kv", "peak_device_fraction": "peak dev",
           "ttft_p95_s": "TTFT p95 s", "itl_p95_s": "ITL p95 s", "oom_risk": "OOM risk",
           "memory_gib": "GiB", "usable_gib": "device GiB", "price_usd": "USD", "usd_per_session": "USD/session",
           "max_parallel": "max par", "evaluated": "how", "failed_requests": "failed",
           "failed_too_long_requests": "too long", "failed_memory_requests": "out of KV"}
MIN_PIPE_WIDTH = 160  # NOTE: piped output (not a terminal) would otherwise wrap at 80


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(HEADERS.get(c, c), overflow="fold")
    for r in rows:
        table.add_row(*[_cell(r.get(c)) for c in columns])
    console = Console() if OUT.is_terminal else Console(width=MIN_PIPE_WIDTH)
    console.print(table)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def maybe_report(kind: str, out_dir: Path, enabled: bool, **tables: Any) -> Path | None:
    """Write ``<out_dir>/report.html`` through kvsim.report when it offers a writer."""
    if not enabled:
        return None
    try:
        from kvsim.report import write_report  # type: ignore[attr-defined]
    except ImportError:
        ERR.print("note: kvsim.report has no write_report yet; no HTML report written")
        return None
    path = out_dir / "report.html"
    write_report(path, kind=kind, **tables)
    return path
