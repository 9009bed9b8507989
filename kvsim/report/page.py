"""One self-contained HTML report for simulate, plan, compare and sweep.

The first screen answers: a **verdict** per run (or the plan's, or each card's) — the
SLOs met or not, memory, OOM risk, the binding constraint, the change that would help
(``id='verdict'``) — then, with several runs, a **comparison table** with each run's
difference from the first (:mod:`kvsim.report.data_compare`), or the cards of a GPU
comparison with latency, memory, flags and verdict; the run cards and figures follow.

The page carries plotly.js once: inline in ``<head>`` (the default, so it opens
offline), or — ``plotlyjs="dir"`` — as ``plotly.min.js`` written beside the page, shared
by every report in that folder (still offline), or from the plotly CDN
(``plotlyjs="cdn"``, a small file that needs the network).  Every figure is a ``<div>``
plus a small script calling ``Plotly.newPlot`` with JSON that Plotly escapes (``<``,
``>`` and ``/`` become ``\\u003c``… so a string can never close the script tag).  Figures
whose data is absent are replaced by a one-line note rather than drawn empty.

NOTE: output is deterministic — figure div ids are numbered, never random — so the
same results give byte-identical reports.
"""

from __future__ import annotations

import html
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import plotly.io as pio
from plotly.offline import get_plotlyjs, get_plotlyjs_version

from kvsim import __version__
from kvsim.metrics.summary import ended
from kvsim.report import data_compare as dcmp
from kvsim.report import data_plan as dp
from kvsim.report import data_recall as dc
from kvsim.report import data_run as dr
from kvsim.report import figures_plan as fp
from kvsim.report import figures_run as fr
from kvsim.report.card import card_data, card_html
from kvsim.report.data_gpus import gpu_memory
from kvsim.report.labels import run_labels

MAX_DETAILED_RUNS = 4   # per-run figures (memory, sessions, ...) for the first runs only
MAX_OVERLAID_RUNS = 12  # CDF / prefix overlays
PLOT_CONFIG = {"responsive": True, "displaylogo": False}
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;
max-width:1200px;padding:1em 2em;color:#222}
h1{margin-bottom:.2em} .note{color:#777;font-style:italic;margin:.3em 0 1em}
.card{border:1px solid #ddd;border-radius:8px;padding:.5em 1.2em;margin:1em 0}
.kpis{display:flex;flex-wrap:wrap;gap:.6em} .kpi{background:#f4f6fa;padding:.4em .8em;
border-radius:6px} .kpi span{display:block;font-size:.8em;color:#555}
.cols{display:flex;gap:2em;flex-wrap:wrap;margin:.8em 0;align-items:flex-start}
.facts th{text-align:left;padding-right:1em;font-weight:600;color:#444}
caption{text-align:left;font-weight:600}
pre{white-space:pre-wrap;font-size:.8em;background:#f8f8f8;padding:.8em}
.figure{margin:1.5em 0} code{background:#f4f6fa;padding:.2em .4em}
.verdict{border-left:6px solid #b2182b;background:#fbf3f3;padding:.4em 1.2em;margin:1em 0}
.verdict.meets{border-color:#1b7837;background:#f2f8f3} .verdict p{margin:.3em 0}
table.cmp{border-collapse:collapse;margin:1em 0;font-size:.9em}
table.cmp th,table.cmp td{border-bottom:1px solid #ddd;padding:.3em .7em;text-align:right}
table.cmp th:first-child,table.cmp td:first-child{text-align:left}
"""
PLOTLYJS = ("inline", "dir", "cdn")
PLOTLYJS_FILE = "plotly.min.js"


class _Page:
    """Collects sections in order; each figure gets a deterministic div id."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.figures = 0
        self.notes: list[str] = []

    def figure(self, fig: Any) -> None:
        self.figures += 1
        div = pio.to_html(fig, full_html=False, include_plotlyjs=False,
                          div_id=f"fig-{self.figures}", config=PLOT_CONFIG)
        self.parts.append(f"<section class='figure'>{div}</section>")

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.parts.append(f"<p class='note'>{html.escape(text)}</p>")

    def raw(self, markup: str) -> None:
        self.parts.append(markup)


def _maybe(page: _Page, data: Any, make: Callable[[Any], Any], absent: str) -> None:
    if data is None or (hasattr(data, "__len__") and len(data) == 0):
        page.note(absent)
    else:
        page.figure(make(data))


def _run_sections(page: _Page, res: Any, label: str) -> None:
    tbl = lambda name: getattr(res, name, None)  # noqa: E731 - tiny accessor
    _maybe(page, dr.memory_stack(tbl("memory"), tbl("summary"), tbl("scenario")),
           lambda d: fr.memory_figure(d, f"Device memory — {label}"),
           f"{label}: no memory samples (measured run?); memory timeline omitted.")
    gpus = gpu_memory(tbl("memory"), tbl("summary"))
    if gpus is not None:
        page.figure(fr.gpu_memory_figure(gpus, f"Memory per GPU — {label}"))
    phases = dr.session_phases(tbl("requests"))
    _maybe(page, phases, lambda d: fr.sessions_figure(
        d, dr.session_markers(tbl("requests"), tbl("events")), f"Sessions — {label}",
        dr.session_order(tbl("requests"))),
        f"{label}: no requests; session timeline omitted.")
    _maybe(page, dr.concurrency(tbl("memory"), tbl("steps")),
           lambda d: fr.concurrency_figure(d, f"Concurrency and batch — {label}"),
           f"{label}: no step or sample data; concurrency omitted.")
    _maybe(page, dr.pcie_traffic(tbl("events"), tbl("transfers")),
           lambda d: fr.pcie_figure(d, f"PCIe traffic — {label}"),
           f"{label}: no PCIe traffic (nothing offloaded or restored); figure omitted.")
    _maybe(page, dc.accuracy_per_session(tbl("references")),
           lambda d: fr.accuracy_figure(d, f"Recall proxy per session — {label}"),
           f"{label}: no reference events; accuracy proxy omitted.")


def _spread(run: Any, key: str) -> tuple[float, ...]:
    """A run's calibrated spread (summary ``ttft_spread`` / ``itl_spread``), if any."""
    return tuple((getattr(run, "summary", None) or {}).get(key) or ())


def _ended_itl(run: Any) -> Any:
    """A run's ``itl`` rows of the requests that ended (as the summary's percentiles)."""
    req, itl = getattr(run, "requests", None), getattr(run, "itl", None)
    if not (dr.nonempty(req) and "request_id" in getattr(itl, "columns", ())):
        return itl
    return ended(req, itl)[1]


def _overlay_sections(page: _Page, labeled: Sequence[tuple[str, Any]],
                      slo: dict[str, float]) -> None:
    """CDFs of TTFT, inter-token gaps and E2E, each with the SLO lines on its metric
    (``slo``: summary key → seconds, e.g. ``{"ttft_p95_s": 2.0, "e2e_p99_s": 30.0}``)."""
    labeled = labeled[:MAX_OVERLAID_RUNS]
    specs = (("TTFT", lambda r: dr.ttft_cdf(getattr(r, "requests", None),
                                             spread=_spread(r, "ttft_spread")),
              "ttft", "time to first token (s)"),
             ("Inter-token latency", lambda r: dr.itl_cdf(_ended_itl(r),
                                                          spread=_spread(r, "itl_spread")),
              "itl", "gap between tokens (s)"),
             ("End-to-end latency", lambda r: dr.e2e_cdf(getattr(r, "requests", None)),
              "e2e", "end-to-end latency (s)"))
    for name, fn, metric, xlabel in specs:
        curves = [(lab, d) for lab, r in labeled if (d := fn(r)) is not None]
        lines = sorted((k.removeprefix(f"{metric}_").removesuffix("_s"), v)
                       for k, v in slo.items() if k.startswith(f"{metric}_"))
        _maybe(page, curves, lambda c, n=name, x=xlabel, s=lines: fr.cdf_figure(
            c, f"{n} CDF", x, s),
               f"No {name} data; CDF omitted.")
    curves = [(lab, d) for lab, r in labeled
              if (d := dr.prefix_hits(getattr(r, "requests", None))) is not None]
    _maybe(page, curves, lambda c: fr.prefix_figure(c, "Prefix cache hit rate"),
           "No prompt tokens; prefix hit rate omitted.")
    if len(labeled) > 1:  # one run: its per-session figure below says it all
        curves = [(lab, d) for lab, r in labeled
                  if (d := dc.session_recall_cdf(getattr(r, "references", None))) is not None]
        _maybe(page, curves, lambda c: fr.recall_cdf_figure(c, "Recall proxy per session"),
               "No reference events in any run; per-session recall comparison omitted.")


REC_KEYS = ("gpu", "kv_dtype", "policy", "context_tokens", "parallel", "ttft_p95_s",
            "itl_p95_s", "peak_device_fraction", "oom_risk", "accuracy_mean")


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) \
        and value != ""


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _verdict_section(page: _Page, verdicts: Sequence[dict[str, Any]]) -> None:
    """The verdicts first (module doc): one block per run, plan or card."""
    e = html.escape
    blocks = []
    for v in verdicts:
        cls = "verdict meets" if v.get("meets") else "verdict"
        name = f"<b>{e(str(v['name']))}</b>: " if v.get("name") else ""
        lines = "".join(f"<p>{e(str(d))}</p>" for d in v.get("details") or ())
        blocks.append(f"<div class='{cls}'><p>{name}{e(str(v['headline']))}</p>{lines}</div>")
    page.raw("<section id='verdict'><h2>Verdict</h2>" + "".join(blocks) + "</section>")


def _table(caption: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return (f"<table class='cmp'><caption>{e(caption)}</caption><tr>{head}</tr>{body}"
            "</table>")


def _comparison_section(page: _Page, runs: Sequence[Any], labels: Sequence[str]) -> None:
    """Several runs: the metrics side by side, each difference from the first."""
    df = dcmp.comparison(runs, labels)
    if df is None or df.empty:
        return
    cols = [labels[0]] + [c for name in labels[1:] for c in (name, f"Δ {name}")]
    page.raw("<section id='comparison'>" + _table(
        f"Runs side by side (Δ: the difference from {labels[0]})", ["metric", *cols],
        [[r["metric"], *[r.get(c, "") for c in cols]] for r in df.to_dict("records")])
        + "</section>")


def _cards_section(page: _Page, compare: Any) -> None:
    rows = dcmp.card_rows(compare)
    if rows:
        page.raw("<section id='cards'>" + _table(
            "Per card: the best configuration that meets every target",
            [h for _, h in dcmp.CARD_COLUMNS],
            [[r[k] for k, _ in dcmp.CARD_COLUMNS] for r in rows]) + "</section>")


def _plan_sections(page: _Page, extra: dict[str, Any]) -> None:
    rec = extra.get("recommendation") or None
    if rec:
        flags = rec.get("flags")
        text = ", ".join(f"{k} = {_short(rec[k])}" for k in REC_KEYS if _present(rec.get(k)))
        page.raw(f"<section class='card'><h2>Recommendation</h2><p>{html.escape(text)}</p>"
                 + (f"<p><code>{html.escape(str(flags))}</code></p>" if flags else "")
                 + "</section>")
    if "plan" in extra:
        grids = dp.plan_grids(extra["plan"])
        if not grids:
            page.note("The plan tried no points; heatmap omitted.")
        for grid in grids:
            page.figure(fp.plan_figure(grid, rec))
    if "compare" in extra:
        _cards_section(page, extra["compare"])
        _maybe(page, dp.gpu_comparison(extra["compare"]), fp.gpu_figure,
               "The GPU comparison is empty; figure omitted.")
    if "sweep" in extra:
        _maybe(page, dp.sweep_dimensions(extra["sweep"]), fp.sweep_figure,
               "The sweep has no factor or metric columns; figure omitted.")


def build_report(results_list: Sequence[Any], extra: dict[str, Any] | None = None) -> str:
    """The report HTML for runs (``Results``-like objects) and planning outputs.

    ``results_list``: objects with DataFrame attributes ``requests, itl, steps, memory,
    events`` (and optional ``references``, ``transfers``), dict attributes ``summary``,
    ``scenario``, ``meta``.  ``extra`` (all keys optional): ``title`` (str), ``slo``
    (``{"ttft_p95_s": s, "e2e_p99_s": s, ...}``: ttft/itl/e2e at p50/p95/p99), ``plan``, ``compare``, ``sweep``,
    ``policies`` (DataFrames, columns in :mod:`kvsim.report.data_plan`) and
    ``recommendation`` (dict with ``context_tokens``, ``parallel`` and ``flags``).
    """
    extra = dict(extra or {})
    runs = list(results_list)
    page = _Page()
    labels = run_labels(runs)
    verdicts = extra.get("verdicts")
    if verdicts is None and runs:
        verdicts = dcmp.run_verdicts(runs, labels, extra.get("slo"))
    if verdicts:
        _verdict_section(page, verdicts)
    _comparison_section(page, runs, labels)
    for label, res in zip(labels[:MAX_DETAILED_RUNS], runs):
        page.raw(card_html({**card_data(res), "name": label}))
    _plan_sections(page, extra)
    if extra.get("validation"):
        from kvsim.report.data_validate import validation_points
        from kvsim.report.figures_validate import predicted_vs_measured_figure
        page.figure(predicted_vs_measured_figure(validation_points(extra["validation"])))
    table = extra.get("policies")
    table = dp.runs_table(runs) if table is None else table
    fig_data = dp.policy_comparison(table)
    if fig_data is not None:
        page.figure(fp.policy_figure(fig_data))
    labeled = list(zip(labels, runs))
    if runs:
        _overlay_sections(page, labeled, dict(extra.get("slo") or {}))
    for label, res in labeled[:MAX_DETAILED_RUNS]:
        page.raw(f"<h2>{html.escape(label)}</h2>")
        _run_sections(page, res, label)
    if len(runs) > MAX_DETAILED_RUNS:
        page.note(f"{len(runs) - MAX_DETAILED_RUNS} more runs: per-run figures shown for "
                  f"the first {MAX_DETAILED_RUNS} only.")
    first = str(dr.run_config(runs[0])[0].get("name") or "run") if runs else "kvsim report"
    title = str(extra.get("title") or first)
    return _document(title, page, str(extra.get("plotlyjs") or "inline"))


def _plotly_tag(mode: str) -> tuple[str, str]:
    """(the plotly.js script tag, what it means for the reader) of a --plotlyjs mode."""
    if mode == "dir":
        return (f"<script type='text/javascript' src='{PLOTLYJS_FILE}'></script>",
                f"works offline with {PLOTLYJS_FILE} beside it")
    if mode == "cdn":
        src = f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"
        return (f"<script type='text/javascript' src='{src}' charset='utf-8'></script>",
                "loads plotly.js from the network")
    return f"<script type='text/javascript'>{get_plotlyjs()}</script>", "works offline"


def _document(title: str, page: _Page, plotlyjs: str = "inline") -> str:
    t = html.escape(title)
    tag, reads = _plotly_tag(plotlyjs)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<meta name='generator' content='kvsim {__version__}'><title>{t} — kvsim</title>"
        f"<style>{CSS}</style>{tag}"
        f"</head><body data-figures='{page.figures}'><h1>{t}</h1>"
        f"<p class='note'>kvsim {__version__} report · {page.figures} figures · "
        f"{reads}</p>" + "\n".join(page.parts) + "</body></html>\n")


def _write_plotlyjs(path: Path) -> None:
    """plotly.js beside the reports, written atomically unless already there as is."""
    js = get_plotlyjs()
    if path.is_file() and path.stat().st_size == len(js.encode()) and \
            path.read_text(encoding="utf-8") == js:
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(js)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(path: str | os.PathLike[str], results_list: Sequence[Any] = (),
                 extra: dict[str, Any] | None = None, *, kind: str | None = None,
                 **tables: Any) -> Path:
    """Build the report and write it atomically (temp file beside ``path``, then
    ``os.replace``); on any error nothing is left at ``path`` or beside it.

    ``kind`` ("simulate", "plan", "compare", "sweep") only sets the default title;
    keyword ``tables`` (``plan=``, ``compare=``, ``sweep=``, ``policies=``,
    ``recommendation=``, ``slo=``, ``title=``, ``verdicts=``, ``plotlyjs=``) are merged
    into ``extra``.  ``plotlyjs="dir"`` also writes ``plotly.min.js`` beside the page
    (once: an identical file there is kept).
    """
    target = Path(path)
    merged = {**(extra or {}), **tables}
    if kind and "title" not in merged and not results_list:
        merged["title"] = f"kvsim {kind}"
    if merged.get("plotlyjs", "inline") not in PLOTLYJS:
        raise ValueError(f"plotlyjs: one of {', '.join(PLOTLYJS)}")
    text = build_report(results_list, merged)
    target.parent.mkdir(parents=True, exist_ok=True)
    if merged.get("plotlyjs") == "dir":
        _write_plotlyjs(target.parent / PLOTLYJS_FILE)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # NOTE: mkstemp creates 0600; a report is meant to be shared
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
