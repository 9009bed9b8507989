"""Plotly figure of ``kvsim validate``: predicted vs measured tokens/s, log-log.

NOTE: labels (GPU and model names from user files) are escaped with
:func:`kvsim.report.figures_run.esc`.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative

from kvsim.report.figures_run import LAYOUT, esc, title_dict


def predicted_vs_measured_figure(points: dict[str, dict[str, list[Any]]]) -> go.Figure:
    """One marker colour per backend; the diagonal and the ±25 % band as guides."""
    fig = go.Figure()
    allv = [v for g in points.values() for v in g["measured"] + g["predicted"] if v > 0]
    lo, hi = (min(allv) / 1.5, max(allv) * 1.5) if allv else (1.0, 1e4)
    for factor, dash, name in ((1.0, "solid", "predicted = measured"),
                               (1.25, "dot", "±25 %"), (0.8, "dot", None)):
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo * factor, hi * factor], mode="lines",
                                 line=dict(color="#888", dash=dash, width=1),
                                 name=name or "", showlegend=name is not None,
                                 hoverinfo="skip"))
    colours = qualitative.D3
    for i, (backend, g) in enumerate(points.items()):
        fig.add_trace(go.Scatter(
            x=g["measured"], y=g["predicted"], mode="markers", name=esc(backend),
            marker=dict(color=colours[i % len(colours)], size=7, opacity=0.8),
            text=[esc(t) for t in g["label"]], hovertemplate="%{text}<extra></extra>"))
    fig.update_layout(**LAYOUT, title=title_dict("Predicted vs measured throughput"))
    fig.update_xaxes(type="log", title="measured tokens/s", range=_log_range(lo, hi))
    fig.update_yaxes(type="log", title="kvsim tokens/s", range=_log_range(lo, hi))
    return fig


def _log_range(lo: float, hi: float) -> list[float]:
    import math
    return [math.log10(lo), math.log10(hi)]
