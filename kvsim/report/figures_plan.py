"""Plotly figures for planning outputs: plan heatmap, GPU comparison, policy
comparison and sweeps — one function per figure, data from
:mod:`kvsim.report.data_plan`.

NOTE: user strings (GPU names, policy labels, factor values) are escaped with
:func:`kvsim.report.figures_run.esc` before they reach a label.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from kvsim.report.data_plan import binding_label
from kvsim.report.figures_run import LAYOUT, PLAN_LINE, esc, title_dict


def plan_figure(grid: dict[str, Any], recommendation: dict[str, Any] | None = None
                ) -> go.Figure:
    """Heatmap of peak device fraction over context × parallel.

    Cells show ✓ (feasible) or the binding constraint; a dashed contour draws the 85%
    line, a solid one outlines the feasible region; a star marks the recommendation.
    """
    nx, ny = len(grid["parallels"]), len(grid["contexts"])
    xs, ys = np.arange(nx), np.arange(ny)
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        x=xs, y=ys, z=grid["fraction"], zmin=0, zmax=1.2, colorscale="RdYlGn_r",
        colorbar=dict(title="peak device", tickformat=".0%"), text=grid["hover"],
        hovertemplate="%{text}<extra></extra>"))
    frac = np.nan_to_num(grid["fraction"], nan=2.0)
    if nx > 1 and ny > 1:
        fig.add_trace(go.Contour(
            x=xs, y=ys, z=frac, showscale=False, hoverinfo="skip", name="85% line",
            contours=dict(start=PLAN_LINE, end=PLAN_LINE, size=1, coloring="none"),
            line=dict(color="black", dash="dash", width=2), showlegend=True))
        fig.add_trace(go.Contour(
            x=xs, y=ys, z=np.nan_to_num(grid["feasible"], nan=0.0), showscale=False,
            hoverinfo="skip", name="feasible region",
            contours=dict(start=0.5, end=0.5, size=1, coloring="none"),
            line=dict(color="#1b7837", width=3), showlegend=True))
    labels = np.where(grid["feasible"] == 1.0, "✓",
                      np.vectorize(lambda b: esc(binding_label(b)) if b else "")(
                          grid["binding"]))
    gx, gy = np.meshgrid(xs, ys)
    fig.add_trace(go.Scatter(x=gx.ravel(), y=gy.ravel(), mode="text", text=labels.ravel(),
                             hoverinfo="skip", showlegend=False,
                             textfont=dict(size=11, color="black")))
    if recommendation and all(recommendation.get(k, v) == v
                              for k, v in grid.get("group", {}).items() if pd.notna(v)):
        # NOTE: only on the grid of the recommendation's KV type and policy
        ctx, par = recommendation.get("context_tokens"), recommendation.get("parallel")
        cx = np.flatnonzero(grid["parallels"] == par)
        cy = np.flatnonzero(grid["contexts"] == ctx)
        if len(cx) and len(cy):
            fig.add_trace(go.Scatter(x=cx, y=cy, mode="markers", name="recommended",
                                     marker=dict(symbol="star-open", size=26, color="blue",
                                                 line=dict(width=2))))
    fig.update_layout(
        title=title_dict(f"Plan: context × parallel ({grid['label']})"), **LAYOUT,
        xaxis=dict(title="parallel sessions", tickvals=list(xs),
                   ticktext=[str(int(v)) for v in grid["parallels"]]),
        yaxis=dict(title="context (tokens)", tickvals=list(ys),
                   ticktext=[f"{int(v):,}" for v in grid["contexts"]]))
    return fig


def gpu_figure(table: pd.DataFrame) -> go.Figure:
    """Per card: feasible concurrent sessions (best config) and price per session."""
    has_price = "usd_per_session" in table.columns and table["usd_per_session"].notna().any()
    fig = make_subplots(rows=1, cols=2 if has_price else 1, subplot_titles=(
        "feasible concurrent sessions", "launch price per session (USD)")[: 2 if has_price
                                                                           else 1])
    names = [esc(g) for g in table["gpu"]]
    hover = []
    for r in table.to_dict("records"):
        parts = [f"context {int(r['best_context_tokens']):,}" if r["feasible"] else
                 "nothing feasible"]
        for col, fmt in (("kv_dtype", "KV {}"), ("ttft_p95_s", "mean TTFT p95 {:.3g} s"),
                         ("itl_p95_s", "mean ITL p95 {:.3g} s"),
                         ("peak_device_fraction", "peak device {:.0%}"),
                         ("oom_risk", "OOM risk {:.3g}"), ("price_usd", "price ${:,.0f}")):
            if col in r and pd.notna(r[col]):
                parts.append(fmt.format(esc(r[col]) if col == "kv_dtype" else r[col]))
        hover.append("<br>".join(parts))
    colors = ["#1b7837" if f else "#b2182b" for f in table["feasible"].astype(bool)]
    # NOTE: the sessions USD/session divides by: the most that fit (max_parallel)
    sessions = table["max_parallel"] if "max_parallel" in table.columns \
        else table["best_parallel"]
    fig.add_trace(go.Bar(x=names, y=sessions, marker_color=colors,
                         customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                         name="sessions"), row=1, col=1)
    if has_price:
        fig.add_trace(go.Bar(x=names, y=table["usd_per_session"], marker_color="#4393c3",
                             name="USD / session", hovertemplate="$%{y:,.0f}<extra></extra>"),
                      row=1, col=2)
    fig.update_layout(title=title_dict("GPU comparison (best feasible configuration per card)"),
                      showlegend=False, **LAYOUT)
    return fig


_POLICY_PANELS = (("peak_device_bytes", "peak device GiB", 2**30),
                  ("peak_kv_allocated_bytes", "peak KV GiB", 2**30),
                  ("ttft_p95_s", "TTFT p95 s", 1), ("itl_p95_s", "ITL p95 s", 1),
                  ("accuracy_mean", "recall mean", 1), ("accuracy_worst", "recall worst", 1),
                  ("accuracy_below_half", "refs below 0.5", 1))
RUN_COLORS = tuple(qualitative.Plotly)  # the template's colour cycle: as in the CDF overlays


def policy_figure(table: pd.DataFrame) -> go.Figure:
    """One bar panel per metric present: memory, p95 latencies and recall side by side.

    Runs are told apart by colour, named once in the legend (their labels can be long:
    :func:`kvsim.report.labels.run_labels`), not under every panel."""
    panels = [p for p in _POLICY_PANELS if p[0] in table.columns]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[1] for p in panels],
                        horizontal_spacing=min(0.06, 0.6 / max(1, len(panels))))
    names = [esc(s) for s in table["label"]]
    for k, (col, _, div) in enumerate(panels, start=1):
        for i, name in enumerate(names):
            fig.add_trace(go.Bar(x=[name], y=[table[col].iloc[i] / div], name=name,
                                 legendgroup=name, showlegend=k == 1,
                                 marker_color=RUN_COLORS[i % len(RUN_COLORS)],
                                 hovertemplate="%{x}: %{y:.4g}<extra></extra>"), row=1, col=k)
        if col.startswith("accuracy"):
            fig.update_yaxes(range=[0, 1.05], row=1, col=k)
    fig.update_xaxes(showticklabels=False)
    legend = 22 * len(names)  # px: one legend row per run, below the panels
    fig.update_layout(title=title_dict("Policy comparison: memory vs latency vs recall"),
                      **{**LAYOUT, "height": 420 + legend,
                         "margin": dict(l=50, r=30, t=90, b=30 + legend),
                         "legend": dict(orientation="v", yanchor="top", y=-0.04, x=0)})
    return fig


def sweep_figure(data: dict[str, Any]) -> go.Figure:
    """Parallel coordinates over the sweep's factors and summary metrics."""
    dims = []
    for d in data["dimensions"]:
        dim = {"label": esc(d["label"]), "values": d["values"]}
        if "ticktext" in d:
            # NOTE: parcoords draws tick text with textContent (no HTML subset), so the
            # raw string is shown as-is and escaping it would print "&lt;" literally.
            dim.update(tickvals=d["tickvals"], ticktext=[str(t) for t in d["ticktext"]])
        dims.append(dim)
    fig = go.Figure(go.Parcoords(
        dimensions=dims, line=dict(color=data["color"], colorscale="Viridis", showscale=True,
                                   colorbar=dict(title=esc(data["color_label"])))))
    fig.update_layout(title=title_dict(f"Sweep: {data['rows']} scenarios"),
                      **{**LAYOUT, "margin": dict(l=90, r=60, t=110, b=40)})
    return fig
