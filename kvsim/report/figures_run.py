"""Plotly figures for one run (or several runs overlaid), one function per figure.

Each function takes the plain data returned by :mod:`kvsim.report.data_run` and
returns a ``plotly.graph_objects.Figure`` (optuna.visualization style); it never
reads files and never computes metrics beyond unit conversion.

NOTE: every user-provided string (scenario names, session ids, failure reasons)
passes through :func:`esc` before it reaches a label: Plotly renders a subset of
HTML in labels, so an unescaped ``<script>`` or ``<a href=…>`` in a session id must
be shown as text, never interpreted.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvsim.report.data_run import GIB, time_scale

# The planning rule: stay at or under ~85% of device memory (docs/design/DESIGN.md §3.1).
PLAN_LINE = 0.85
PHASE_COLORS = {"think": "#d9d9d9", "queue": "#f4a582", "prefill": "#4393c3",
                "decode": "#2166ac"}
LAYOUT = dict(template="plotly_white", height=440, margin=dict(l=70, r=30, t=90, b=50),
              legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))


def title_dict(text: str) -> dict:
    """A title pinned to the top of the figure, above the legend row."""
    return dict(text=esc(text), yref="container", y=1.0, yanchor="top", pad=dict(t=12), x=0.06)


def esc(text: Any) -> str:
    """HTML-escape a user-provided string for a Plotly label."""
    return html.escape(str(text), quote=True)


def memory_figure(data: dict, title: str) -> go.Figure:
    """Stacked device memory (GiB) over time, total line, capacity and 85% lines, host tier.

    NOTE: memory samples are a step function (each holds until the next row), so the
    traces use ``shape="hv"`` rather than interpolating between samples."""
    t = np.asarray(data["time_s"], float)
    div, xlabel = time_scale(float(t[-1] - t[0]) if len(t) else 0.0)
    x = t / div
    fig = go.Figure()
    for label, values in data["device_layers"]:
        fig.add_trace(go.Scatter(x=x, y=np.asarray(values) / GIB, name=label, mode="lines",
                                 line=dict(width=0.5, shape="hv"), stackgroup="device",
                                 hovertemplate="%{y:.3f} GiB"))
    total = np.asarray(data["device_total_bytes"]) / GIB
    fig.add_trace(go.Scatter(x=x, y=total, name="device total", mode="lines",
                             line=dict(color="black", width=1.2, shape="hv"), hovertemplate="%{y:.3f} GiB"))
    for label, values in data["host_layers"]:
        fig.add_trace(go.Scatter(x=x, y=np.asarray(values) / GIB, name=f"host: {label}",
                                 mode="lines", line=dict(dash="dot", width=1.5, shape="hv"),
                                 hovertemplate="%{y:.3f} GiB"))
    peak = data["peak_device_bytes"] / GIB
    fig.add_trace(go.Scatter(x=[data["peak_time_s"] / div], y=[peak], mode="markers+text",
                             name="peak", marker=dict(color="crimson", size=9, symbol="x"),
                             text=[f"peak {peak:.2f} GiB"], textposition="top center"))
    cap = data.get("capacity_bytes")
    if cap:
        fig.add_hline(y=cap / GIB, line=dict(color="crimson", width=1.5),
                      annotation_text=f"capacity {cap / GIB:.1f} GiB")
        fig.add_hline(y=PLAN_LINE * cap / GIB, line=dict(color="orange", dash="dash"),
                      annotation_text="85% planning line", annotation_position="bottom right")
    fig.update_layout(title=title_dict(title), xaxis_title=xlabel, yaxis_title="memory (GiB)",
                      **LAYOUT)
    return fig


def gpu_memory_figure(data: dict, title: str) -> go.Figure:
    """Each GPU's share of its own memory over time, with the 85% planning line (which
    holds per GPU: the fullest one binds)."""
    t = np.asarray(data["time_s"], float)
    div, xlabel = time_scale(float(t[-1] - t[0]) if len(t) else 0.0)
    fig = go.Figure()
    for label, frac, peak in data["gpus"]:
        fig.add_trace(go.Scatter(x=t / div, y=np.asarray(frac) * 100,
                                 name=f"{label} (peak {peak:.1%})", mode="lines",
                                 line=dict(width=1.5, shape="hv"), hovertemplate="%{y:.1f}%"))
    fig.add_hline(y=100 * PLAN_LINE, line=dict(color="orange", dash="dash"),
                  annotation_text="85% planning line", annotation_position="bottom right")
    fig.update_layout(title=title_dict(title), xaxis_title=xlabel,
                      yaxis_title="share of the GPU's memory (%)", **LAYOUT)
    return fig


def sessions_figure(phases: pd.DataFrame, markers: pd.DataFrame | None, title: str,
                    order: Sequence[str] | None = None, max_sessions: int = 300) -> go.Figure:
    """Gantt-style timeline: one row per session, bars per phase, turn/failure/preempt marks."""
    order = list(order or dict.fromkeys(phases["session_id"]))[:max_sessions]
    keep = phases[phases["session_id"].isin(order)]
    span = float(keep["end_s"].max() - keep["start_s"].min()) if len(keep) else 0.0
    div, xlabel = time_scale(span)
    fig = go.Figure()
    for phase, color in PHASE_COLORS.items():
        sub = keep[keep["phase"] == phase]
        if sub.empty:
            continue
        fig.add_trace(go.Bar(
            y=[esc(s) for s in sub["session_id"]], base=sub["start_s"] / div,
            x=(sub["end_s"] - sub["start_s"]) / div, orientation="h", name=phase,
            marker=dict(color=color), customdata=sub["turn"],
            hovertemplate=f"{phase} turn %{{customdata}}: %{{x:.3g}} ({xlabel[6:-1]})"))
    if markers is not None and len(markers):
        marks = markers[markers["session_id"].isin(order)]
        for kind, symbol, color in (("turn", "line-ns-open", "#555"),
                                    ("preempt", "triangle-down", "darkorange"),
                                    ("failed", "x", "crimson")):
            sub = marks[marks["kind"] == kind]
            if sub.empty:
                continue
            fig.add_trace(go.Scatter(
                y=[esc(s) for s in sub["session_id"]], x=sub["time_s"] / div, mode="markers",
                name=kind, marker=dict(symbol=symbol, size=10, color=color,
                                       line=dict(width=1, color=color)),
                text=[esc(d) for d in sub["detail"]], hovertemplate="%{text}"))
    height = max(300, min(1600, 22 * len(order) + 120))
    fig.update_layout(**{**LAYOUT, "height": height}, title=title_dict(title), barmode="overlay",
                      xaxis_title=xlabel,
                      yaxis=dict(type="category", autorange="reversed", title="session",
                                 categoryorder="array", categoryarray=[esc(o) for o in order]))
    return fig


def cdf_figure(curves: Sequence[tuple[str, dict]], title: str, xlabel: str,
               slos: Sequence[tuple[str, float]] = ()) -> go.Figure:
    """CDFs (one per run) with the p95 level and the SLO lines ``(percentile, limit_s)``,
    e.g. ``("p99", 2.0)``: a vertical line at the limit and the percentile's level (a
    run meets it where its curve passes the level at or left of the line).

    NOTE: the x axis is fitted to the data (:func:`cdf_range`); an SLO beyond it is said
    at the axis' edge instead of stretching the axis to it.  A log axis (long tails)
    labels its decades only, minor ticks unlabelled."""
    fig = go.Figure()
    for label, data in curves:
        fig.add_trace(go.Scatter(
            x=data["x_s"], y=data["p"], mode="lines", line=dict(shape="hv"),
            name=f"{esc(label)} (p95 {data['p95_s']:.3g} s, n={data['n']})"))
    levels = {"p95"} | {pct for pct, _ in slos}
    for pct in sorted(levels):
        fig.add_hline(y=int(pct[1:]) / 100, line=dict(color="grey", dash="dot"),
                      annotation_text=pct, annotation_position="bottom left")
    lo, hi, log = cdf_range([d["x_s"] for _, d in curves])
    for pct, limit_s in slos:
        if limit_s <= hi:
            fig.add_vline(x=limit_s, line=dict(color="crimson", dash="dash"),
                          annotation_text=f"{pct} SLO {limit_s:.3g} s")
        else:
            fig.add_annotation(x=1, xref="paper", y=int(pct[1:]) / 100, yref="y",
                               xanchor="right", yanchor="bottom", showarrow=False,
                               font={"color": "crimson"},
                               text=f"{pct} SLO {limit_s:.3g} s → (beyond the data)")
    axis = {"title": xlabel + (" — log scale" if log else ""),
            "type": "log" if log else "linear",
            "range": [np.log10(lo), np.log10(hi)] if log else [lo, hi]}
    if log:
        axis.update(dtick=1, exponentformat="power",
                    minor={"ticks": "outside", "showgrid": True})
    fig.update_layout(title=title_dict(title), xaxis=axis, yaxis_title="share ≤ x",
                      yaxis_range=[0, 1.02], showlegend=True, **LAYOUT)
    return fig


def cdf_range(xs: Sequence[Any], pad: float = 0.04) -> tuple[float, float, bool]:
    """(low, high, log) of an x axis that fits the data ``xs`` (arrays of values): a log
    axis for long tails (max / min over 20), padded by ``pad`` of the span (of the
    decades on a log axis) on each side, never below 0 on a linear one."""
    vals = [np.asarray(x, dtype=float) for x in xs]
    vals = [v[np.isfinite(v)] for v in vals]
    lo = min((float(v.min()) for v in vals if len(v)), default=0.0)
    hi = max((float(v.max()) for v in vals if len(v)), default=1.0)
    if lo > 0 and hi / lo > 20:
        a, b = np.log10(lo), np.log10(hi)
        d = (b - a) * pad
        return float(10 ** (a - d)), float(10 ** (b + d)), True
    d = (hi - lo) * pad or abs(hi) * pad or 1.0
    return max(0.0, lo - d) if lo >= 0 else lo - d, hi + d, False


def concurrency_figure(data: dict, title: str) -> go.Figure:
    """Running / waiting requests and the engine batch size over time."""
    times = [np.asarray(d["time_s"], float) for d in (data.get("samples"), data.get("steps"))
             if d is not None]
    span = max(float(t.max() - t.min()) for t in times if len(t))
    div, xlabel = time_scale(span)
    fig = go.Figure()
    if "samples" in data:
        s = data["samples"]
        for col, color in (("running", "#2166ac"), ("waiting", "#d6604d")):
            fig.add_trace(go.Scatter(x=np.asarray(s["time_s"]) / div, y=s[col], name=col,
                                     mode="lines", line=dict(shape="hv", color=color)))
    if "steps" in data:
        st = data["steps"]
        fig.add_trace(go.Scatter(x=np.asarray(st["time_s"]) / div, y=st["batch_size"],
                                 name="batch size", mode="lines",
                                 line=dict(shape="hv", color="#1b7837", width=1)))
    fig.update_layout(title=title_dict(title), xaxis_title=xlabel, yaxis_title="requests", **LAYOUT)
    return fig


def pcie_figure(data: dict, title: str) -> go.Figure:
    """Cumulative PCIe traffic per direction (GiB), totals in the legend."""
    names = {"h2d": "host → device", "d2h": "device → host"}
    ends = [float(v) for s in data["series"].values() for v in (s["time_s"][0], s["time_s"][-1])]
    div, xlabel = time_scale(max(ends) - min(ends))
    fig = go.Figure()
    for d, s in data["series"].items():
        total = data["totals_bytes"][d] / GIB
        fig.add_trace(go.Scatter(x=np.asarray(s["time_s"]) / div,
                                 y=np.asarray(s["cumulative_bytes"]) / GIB, mode="lines+markers",
                                 line=dict(shape="hv"), marker=dict(size=4),
                                 name=f"{names[d]} (total {total:.3g} GiB)"))
    fig.update_layout(title=title_dict(title), xaxis_title=xlabel,
                      yaxis_title="transferred so far (GiB)", **LAYOUT)
    return fig


def prefix_figure(curves: Sequence[tuple[str, dict]], title: str) -> go.Figure:
    """Cumulative token-weighted prefix hit rate by arrival time, one line per run."""
    span = max(float(d["time_s"][-1] - d["time_s"][0]) for _, d in curves)
    div, xlabel = time_scale(span)
    fig = go.Figure()
    for label, d in curves:
        fig.add_trace(go.Scatter(x=np.asarray(d["time_s"]) / div, y=d["hit_rate"],
                                 mode="lines", name=f"{esc(label)} (overall "
                                 f"{100 * d['overall']:.1f}%)"))
    fig.update_layout(title=title_dict(title), xaxis_title=xlabel,
                      yaxis=dict(title="cached / prompt tokens so far", range=[0, 1.02],
                                 tickformat=".0%"), **LAYOUT)
    return fig


def accuracy_figure(table: pd.DataFrame, title: str, max_sessions: int = 60) -> go.Figure:
    """Accuracy proxy per session (worst first): mean bar, worst marker; events, share
    below 0.5 and LOST/COLLAPSE events in the hover."""
    t = table.head(max_sessions)
    if len(table) > max_sessions:
        title = f"{title} (worst {max_sessions} of {len(table)} sessions)"
    names = [esc(s) for s in t["session_id"]]
    dropped = t["dropped"] if "dropped" in t.columns else np.zeros(len(t))
    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=t["mean"], name="mean", marker_color="#4393c3",
                         customdata=np.stack([t["events"], t["below_half"], dropped], axis=1),
                         hovertemplate="mean %{y:.3f}<br>%{customdata[0]} events<br>"
                                       "share < 0.5: %{customdata[1]:.0%}<br>"
                                       "lost or collapsed: %{customdata[2]}"))
    fig.add_trace(go.Scatter(x=names, y=t["worst"], mode="markers", name="worst",
                             marker=dict(symbol="line-ew-open", size=16, color="crimson",
                                         line=dict(width=3))))
    fig.add_hline(y=0.5, line=dict(color="grey", dash="dot"))
    fig.update_layout(title=title_dict(title),
                      yaxis=dict(title="score multiplier", range=[0, 1.05]),
                      xaxis=dict(type="category", title="session"), **LAYOUT)
    return fig


def recall_cdf_figure(curves: Sequence[tuple[str, dict]], title: str) -> go.Figure:
    """Per-session mean recall, one CDF over sessions per run, with the 0.5 line."""
    fig = go.Figure()
    for label, d in curves:
        fig.add_trace(go.Scatter(
            x=d["x"], y=d["p"], mode="lines+markers", line=dict(shape="hv"),
            marker=dict(size=4), name=f"{esc(label)} (worst session {d['worst']:.3f}, "
            f"{d['below_half']:.0%} of {d['sessions']} sessions below 0.5)"))
    fig.add_vline(x=0.5, line=dict(color="grey", dash="dot"), annotation_text="0.5")
    fig.update_layout(title=title_dict(title),
                      xaxis=dict(title="session's mean score multiplier", range=[0, 1.05]),
                      yaxis=dict(title="share of sessions ≤ x", range=[0, 1.02]),
                      showlegend=True, **LAYOUT)
    return fig
