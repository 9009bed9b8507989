"""Exact statistics over inter-token gaps stored as affine runs (numpy only).

A run ``(gap_s, gap_delta_s, count)`` stands for the gaps ``gap_s + k·gap_delta_s``,
``k = 0..count−1``, evaluated in float64 as written (:mod:`kvsim.core.itl`).  Every
function here is exact with respect to that expansion — the same value numpy
would give on the expanded array — without expanding large inputs:

- quantiles use the one definition of :mod:`kvsim.metrics.summary` (smallest value
  with at least ``q`` of the gaps at or below it, numpy ``inverted_cdf``).  Small
  inputs are expanded; large ones bisect over the float64 values (ordered as their
  bit patterns, ≤ 64 rounds), counting the gaps ``≤ x`` in O(1) per run — a run is
  monotone in ``k``, so the count is a floor division corrected by ±1 against the
  float64 expansion;
- the mean is ``Σ (count·gap + delta·count(count−1)/2) / Σ count``.
"""

from __future__ import annotations

import math

import numpy as np

_MAG = np.int64(0x7FFF_FFFF_FFFF_FFFF)
EXPAND_MAX = 1 << 22  # gaps expanded in memory at most (32 MB; larger inputs bisect)
SMALL_TOTAL = 512  # per-request stats: expand in pure Python up to this many gaps
CHUNK_GROUPS = (1 << 15) - 1  # group_stats: groups sorted together (int16 radix keys)


def as_runs(gap_s, delta_s, count) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = np.asarray(gap_s, dtype=np.float64)
    d = np.zeros_like(g) if delta_s is None else np.asarray(delta_s, dtype=np.float64)
    n = np.asarray(count, dtype=np.int64)
    keep = n > 0
    return g[keep], d[keep], n[keep]


def expand(gap_s, delta_s, count) -> np.ndarray:
    """Every gap the runs stand for, run after run."""
    g, d, n = as_runs(gap_s, delta_s, count)
    if not len(n):
        return np.zeros(0)
    starts = np.cumsum(n) - n
    k = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(starts, n)
    return np.repeat(g, n) + k * np.repeat(d, n)


def count_le(x: float, g: np.ndarray, d: np.ndarray, n: np.ndarray) -> int:
    """Number of expanded gaps ``≤ x``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        est = np.where(d != 0, np.floor((x - g) / np.where(d != 0, d, 1.0)), 0.0)
    k = np.clip(np.nan_to_num(est, nan=0.0, posinf=n, neginf=-1), -1, n).astype(np.int64)
    up = d > 0
    down = d < 0
    # up: k = last index with value ≤ x; fix the float estimate against the expansion
    for _ in range(2):
        nxt = k + 1
        k = np.where(up & (nxt < n) & (g + nxt * d <= x), nxt, k)
        k = np.where(up & (k >= 0) & (g + np.maximum(k, 0) * d > x), k - 1, k)
    # down: values fall with k; k = first index with value ≤ x, count n − k
    kd = np.clip(np.ceil(np.nan_to_num((g - x) / np.where(down, -d, 1.0), nan=0.0)), 0, n)
    kd = kd.astype(np.int64)
    for _ in range(2):
        prv = kd - 1
        kd = np.where(down & (prv >= 0) & (g + np.maximum(prv, 0) * d <= x), prv, kd)
        kd = np.where(down & (kd < n) & (g + np.minimum(kd, n - 1) * d > x), kd + 1, kd)
    flat = np.where(g <= x, n, 0)
    total = np.where(up, np.minimum(k + 1, n), np.where(down, n - kd, flat))
    return int(total.sum())


def _key(x: np.ndarray | float) -> np.ndarray:
    """float64 → int64 with the same order (bit-pattern trick for negatives)."""
    i = np.asarray(x, dtype=np.float64).view(np.int64)
    return np.where(i < 0, i ^ _MAG, i)


def _unkey(k: int) -> float:
    i = np.int64(k)
    if i < 0:
        i = i ^ _MAG
    return float(np.array([i], dtype=np.int64).view(np.float64)[0])


def quantile(gap_s, delta_s, count, q: float) -> float:
    """Exact ``inverted_cdf`` quantile of the expanded gaps (NaN when there are none)."""
    return quantiles(gap_s, delta_s, count, (q,))[0]


def quantiles(gap_s, delta_s, count, qs) -> list[float]:
    g, d, n = as_runs(gap_s, delta_s, count)
    total = int(n.sum())
    if not total:
        return [math.nan] * len(qs)
    ranks = [min(max(math.ceil(q * total), 1), total) for q in qs]
    if len(n) == 1:  # one monotone run: the r-th smallest is known
        g0, d0, c = float(g[0]), float(d[0]), int(n[0])
        return [g0 + ((r - 1) if d0 >= 0 else (c - r)) * d0 for r in ranks]
    if total <= EXPAND_MAX:
        v = np.partition(expand(g, d, n), sorted({r - 1 for r in ranks}))
        return [float(v[r - 1]) for r in ranks]
    last = g + (n - 1) * d
    lo_k = int(_key(np.minimum(g, last).min()))
    hi_k = int(_key(np.maximum(g, last).max()))
    out = []
    for r in ranks:
        lo, hi = lo_k, hi_k  # smallest x (as a key) with count_le(x) ≥ r
        while lo < hi:
            mid = (lo + hi) // 2
            if count_le(_unkey(mid), g, d, n) >= r:
                hi = mid
            else:
                lo = mid + 1
        out.append(_unkey(lo))
    return out


def mean(gap_s, delta_s, count) -> float:
    g, d, n = as_runs(gap_s, delta_s, count)
    total = int(n.sum())
    if not total:
        return math.nan
    nf = n.astype(np.float64)
    return float((nf * g + d * (nf * (nf - 1) / 2.0)).sum() / total)


def maximum(gap_s, delta_s, count) -> float:
    g, d, n = as_runs(gap_s, delta_s, count)
    if not len(n):
        return math.nan
    return float(np.maximum(g, g + (n - 1) * d).max())


def run_stats(runs: list[tuple[float, float, int]]) -> tuple[float, float, float, float]:
    """(mean, p50, p95, max) of one request's runs; pure Python for the common cases."""
    if not runs:
        return (math.nan,) * 4
    if all(dd == 0.0 for _, dd, _ in runs):
        vals = sorted((gg, c) for gg, _, c in runs)
        total = sum(c for _, c in vals)
        out = []
        for q in (0.5, 0.95):
            r, acc = max(math.ceil(q * total), 1), 0
            for v, c in vals:
                acc += c
                if acc >= r:
                    out.append(v)
                    break
        m = sum(gg * c for gg, _, c in runs) / total
        return m, out[0], out[1], vals[-1][0]
    total = sum(c for _, _, c in runs)
    if total <= SMALL_TOTAL:  # expand in Python: same float64 values as ``expand``
        vals = sorted([gg + k * dd for gg, dd, c in runs for k in range(c)])
        return (sum(vals) / total, vals[max(math.ceil(0.5 * total), 1) - 1],
                vals[max(math.ceil(0.95 * total), 1) - 1], vals[-1])
    g, d, n = (np.array(c) for c in zip(*runs))
    p50, p95 = quantiles(g, d, n, (0.5, 0.95))
    return mean(g, d, n), p50, p95, maximum(g, d, n)


def group_stats(index, gap_s, delta_s, count, groups: int,
                chunk_gaps: int = 1 << 20) -> np.ndarray:
    """``(mean, p50, p95, max)`` per group of runs, as :func:`run_stats` of each group.

    ``index[i]`` is run ``i``'s group (non-decreasing: a group's runs are contiguous);
    row ``k`` of the result is group ``k`` (NaN without gaps).  Groups are expanded
    and sorted together, a chunk of whole groups of at most ``chunk_gaps`` gaps (and
    ``CHUNK_GROUPS`` groups) at a time: bounded memory; a larger group goes through
    :func:`run_stats` alone.

    NOTE: quantiles and maximum are exactly the expansion's values; the mean sums a
    group's sorted gaps with numpy (equal to run_stats' to float rounding).
    """
    out = np.full((groups, 4), np.nan)
    idx = np.asarray(index, dtype=np.int64)
    g, d, n = (np.asarray(a, dtype=t) for a, t in ((gap_s, np.float64),
                                                   (delta_s, np.float64), (count, np.int64)))
    bounds = np.searchsorted(idx, np.arange(groups + 1), side="left")
    cum = np.concatenate(([0], np.cumsum(n)))
    totals = cum[bounds[1:]] - cum[bounds[:-1]]  # gaps per group
    ends = np.cumsum(totals)
    a = 0
    while a < groups:
        if totals[a] > chunk_gaps:
            r0, r1 = bounds[a], bounds[a + 1]
            out[a] = run_stats(list(zip(g[r0:r1].tolist(), d[r0:r1].tolist(),
                                        n[r0:r1].tolist())))
            a += 1
            continue
        base = ends[a] - totals[a]
        b = max(int(np.searchsorted(ends, base + chunk_gaps, side="right")), a + 1)
        b = min(b, a + CHUNK_GROUPS)
        _chunk_stats(out, a, b, bounds, totals, idx, g, d, n)
        a = b
    return out


def _chunk_stats(out: np.ndarray, a: int, b: int, bounds: np.ndarray, totals: np.ndarray,
                 idx: np.ndarray, g: np.ndarray, d: np.ndarray, n: np.ndarray) -> None:
    """:func:`group_stats` of groups ``a..b−1`` (every one at most the chunk size)."""
    r0, r1 = bounds[a], bounds[b]
    tot = totals[a:b]
    has = tot > 0
    if not has.any():
        return
    v = expand(g[r0:r1], d[r0:r1], n[r0:r1])
    grp = np.repeat((idx[r0:r1] - a).astype(np.int16), n[r0:r1])
    order = np.argsort(v)  # then a stable (radix) sort by group: sorted within groups
    vs = v[order[np.argsort(grp[order], kind="stable")]]
    t = tot[has]
    off = (np.cumsum(tot) - tot)[has]
    rows = np.arange(a, b)[has]
    out[rows, 0] = np.add.reduceat(vs, off) / t
    for col, q in ((1, 0.5), (2, 0.95)):
        out[rows, col] = vs[off + np.maximum(np.ceil(q * t).astype(np.int64), 1) - 1]
    out[rows, 3] = vs[off + t - 1]
