"""Peak-preserving down-sampling of long time series for the HTML report.

A household-week sampled every second is 604 800 memory rows; plotting them all
makes a report of tens of megabytes that a browser renders slowly.  We keep the
*shape* and, above all, the *extremes*: the report's promise is that the plotted
memory peak equals the simulated peak.

Method (min/max buckets, as in classic oscilloscope / M4 decimation):

1. Split the time axis into ``buckets`` equal-width intervals.
2. In every non-empty bucket keep the first and the last row, and for each key
   column the row holding its minimum and the row holding its maximum.
3. Keep whole rows (never mix columns of different rows), in time order.

So at most ``2 + 2·len(keys)`` rows survive per bucket, every key column's global
maximum and minimum survive exactly (they are the max/min of their own bucket), and
stacked series stay consistent because all columns of a kept row are kept together.

NOTE: this is a pure function of its input: the same table always gives the same
rows, so reports are reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

DEFAULT_BUCKETS = 1500


def minmax_rows(
    df: pd.DataFrame, time_col: str, keys: Sequence[str], buckets: int = DEFAULT_BUCKETS
) -> pd.DataFrame:
    """Rows of ``df`` kept by min/max bucketing on ``keys`` (see module docstring).

    Tables with at most ``(2 + 2·len(keys))·buckets`` rows are returned unchanged
    (sorted by time); the result always contains each key's extreme rows.
    """
    if buckets < 1:
        raise ValueError("buckets must be >= 1")
    ordered = df.sort_values(time_col, kind="stable").reset_index(drop=True)
    per_bucket = 2 + 2 * len(keys)
    if len(ordered) <= per_bucket * buckets:
        return ordered
    t = ordered[time_col].to_numpy(dtype=float)
    span = t[-1] - t[0]
    if span <= 0:
        bucket = np.zeros(len(t), dtype=np.int64)
    else:
        bucket = np.minimum(((t - t[0]) / span * buckets).astype(np.int64), buckets - 1)
    frame = pd.DataFrame({"b": bucket, "i": np.arange(len(t))})
    grouped = frame.groupby("b", sort=False)["i"]
    keep = [grouped.min().to_numpy(), grouped.max().to_numpy()]
    for key in keys:
        vals = pd.DataFrame({"b": bucket, "v": ordered[key].to_numpy(dtype=float)})
        g = vals.groupby("b", sort=False)["v"]
        keep.append(g.idxmax().to_numpy())
        keep.append(g.idxmin().to_numpy())
    rows = np.unique(np.concatenate(keep))
    return ordered.iloc[rows].reset_index(drop=True)


def thin_monotone(x: np.ndarray, y: np.ndarray, max_points: int = 2000) -> tuple[
        np.ndarray, np.ndarray]:
    """Thin a monotone curve (a CDF) to at most ``max_points`` points.

    Keeps the first and the last point exactly (the minimum and the maximum of the
    distribution) and evenly spaced points in between; a CDF is monotone, so the
    drawn curve stays within one step of the full one.
    """
    n = len(x)
    if n <= max_points:
        return x, y
    idx = np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
    return x[idx], y[idx]
