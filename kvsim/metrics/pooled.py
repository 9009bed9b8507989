"""Latency percentiles pooled over several runs, with a bootstrap interval over sessions.

A plan judges a point by the p95 users mean — GuideLLM's and benchmark_serving's: over
**all requests of all replications** (all inter-token gaps for ITL), not the mean of each
run's own p95 (a one-day household run has ~136 requests, so its own p95 rests on ~7 of
them).  :class:`LatencySample` is the small part of one run a worker hands back for that
(the ended requests' TTFT and E2E, the ITL runs, each tagged with its session);
:func:`pooled_quantile` is the summary's percentile (:mod:`kvsim.metrics.summary`,
``inverted_cdf``, with the calibrated spread) over their union, and
:func:`pooled_interval` adds its confidence interval from ``scipy.stats.bootstrap``
resampling **sessions** (a session's turns are not independent of one another; sessions
are, and there are many more of them than runs).  A household preset draws new sessions
in every run: each run's sessions are clusters of their own.  A trace replays the same
sessions in every run (its runs differ by timing noise only): ``shared_sessions`` makes a
session one cluster over all runs, so copies of it never pass for independent draws.

NOTE: the interval is a percentile bootstrap of a cluster resample; its ITL statistic
represents each gap run by at most :data:`CI_RUN_POINTS` evenly spaced gaps (and the
spread by at most :data:`CI_SPREAD_POINTS` quantiles), so its ends are within that
resolution of the exact pooled value, which the estimate always is.
Design: docs/design/answers.md.
"""

from __future__ import annotations

import inspect
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from kvsim.metrics import gaps
from kvsim.metrics.spread import spread_quantiles, with_spread
from kvsim.metrics.summary import PERCENTILE_METHOD, ended, itl_runs

METRICS = ("ttft", "itl", "e2e")
MIN_POOLED = 100  # NOTE: fewer requests than this and a p95 rests on a handful (≤ 5)
CI_RESAMPLES = 999
CI_RUN_POINTS = 8
CI_SPREAD_POINTS = 8
_BATCH_VALUES = 4_000_000  # values × resamples held at once by the bootstrap


@dataclass(frozen=True)
class LatencySample:
    """One run's latency values, each tagged with its session (0 … ``sessions`` − 1)."""

    sessions: int
    request_session: np.ndarray  # per ended request
    session_names: tuple[str, ...]  # session id of each code
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    itl_session: np.ndarray  # per ITL run
    itl_gap_s: np.ndarray
    itl_delta_s: np.ndarray
    itl_count: np.ndarray
    ttft_spread: tuple[float, ...] = ()
    itl_spread: tuple[float, ...] = ()


def latency_sample(results: object) -> LatencySample:
    """The :class:`LatencySample` of a Results (its requests that ended, as the summary)."""
    requests: pd.DataFrame = results.requests  # type: ignore[attr-defined]
    itl: pd.DataFrame = results.itl  # type: ignore[attr-defined]
    summary = dict(getattr(results, "summary", None) or {})
    done, done_itl = ended(requests, itl)
    codes, uniques = pd.factorize(done["session_id"].astype(str), sort=True)
    of = dict(zip(done["request_id"], codes))
    g, d, n = itl_runs(done_itl)
    itl_session = np.asarray([of.get(r, -1) for r in done_itl["request_id"]], dtype=np.int64)
    keep = itl_session >= 0
    return LatencySample(
        len(uniques), codes.astype(np.int64), tuple(str(u) for u in uniques),
        done["ttft_s"].to_numpy(dtype=float),
        done["e2e_s"].to_numpy(dtype=float), itl_session[keep], g[keep], d[keep], n[keep],
        tuple(summary.get("ttft_spread") or ()), tuple(summary.get("itl_spread") or ()))


def _requests(samples: Sequence[LatencySample], metric: str) -> np.ndarray:
    return np.concatenate([getattr(s, f"{metric}_s") for s in samples]) if samples \
        else np.zeros(0)


def _itl(samples: Sequence[LatencySample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.concatenate([getattr(s, f) for s in samples])  # type: ignore[return-value]
                 for f in ("itl_gap_s", "itl_delta_s", "itl_count"))


def pooled_count(samples: Sequence[LatencySample], metric: str) -> int:
    """How many values a pooled percentile rests on: requests (TTFT, E2E) or gaps (ITL)."""
    if metric == "itl":
        return int(_itl(samples)[2].sum()) if samples else 0
    return int(np.isfinite(_requests(samples, metric)).sum())


def pooled_quantile(samples: Sequence[LatencySample], metric: str, q: float) -> float:
    """The ``q`` quantile of ``metric`` (ttft / itl / e2e) over every run's values, as
    :func:`kvsim.metrics.summary.summarize` takes it over one run's."""
    if not samples:
        return math.nan
    if metric == "itl":
        return spread_quantiles(*_itl(samples), samples[0].itl_spread, [q])[0]
    spread = samples[0].ttft_spread if metric == "ttft" else ()
    v = with_spread(_requests(samples, metric), spread)
    return float(np.percentile(v, 100 * q, method=PERCENTILE_METHOD)) if len(v) else math.nan


def _few(values: Sequence[float], k: int) -> np.ndarray:
    v = np.sort(np.asarray(values, dtype=float))
    return v if len(v) <= k else v[np.linspace(0, len(v) - 1, k).round().astype(int)]


def _clusters(samples: Sequence[LatencySample], shared: bool) -> tuple[list[np.ndarray], int]:
    """Per run, its sessions' cluster numbers; and how many clusters.  Not ``shared``:
    later runs' sessions numbered after earlier ones'; ``shared``: one per session id."""
    if not shared:
        starts = np.cumsum([0] + [s.sessions for s in samples])
        return [np.arange(s.sessions) + b for s, b in zip(samples, starts)], int(starts[-1])
    ids: dict[str, int] = {}
    maps = [np.asarray([ids.setdefault(n, len(ids)) for n in s.session_names], dtype=np.int64)
            for s in samples]
    return maps, len(ids)


def _ci_values(samples: Sequence[LatencySample], metric: str, shared: bool
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(values, weights, cluster per value, clusters) over every run (the bootstrap's
    coarse representation, module NOTE)."""
    maps, clusters = _clusters(samples, shared)
    vals, wts, grp = [], [], []
    for s, cmap in zip(samples, maps):
        if metric == "itl":
            g, d, n = gaps.as_runs(s.itl_gap_s, s.itl_delta_s, s.itl_count)
            m = np.minimum(n, CI_RUN_POINTS)
            j = np.arange(int(m.sum())) - np.repeat(np.cumsum(m) - m, m)
            mm, nn = np.repeat(m, m), np.repeat(n, m)
            k = np.where(mm > 1, np.rint(j * (nn - 1) / np.maximum(mm - 1, 1)), 0)
            v, w = np.repeat(g, m) + k * np.repeat(d, m), nn / mm
            c, spread = np.repeat(s.itl_session, m), s.itl_spread
        else:
            v = getattr(s, f"{metric}_s")
            ok = np.isfinite(v)
            v, c, w = v[ok], s.request_session[ok], np.ones(int(ok.sum()))
            spread = s.ttft_spread if metric == "ttft" else ()
        if len(spread):
            f = _few(spread, CI_SPREAD_POINTS)
            v, w, c = np.multiply.outer(v, f).ravel(), np.repeat(w, len(f)), np.repeat(c, len(f))
        vals.append(v)
        wts.append(w)
        grp.append(cmap[c] if len(c) else c)
    return np.concatenate(vals), np.concatenate(wts), np.concatenate(grp), clusters


def _weighted_quantiles(values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of ``weights`` (resamples × values, ``values`` sorted): the smallest value
    with at least ``q`` of the row's weight at or below it (``inverted_cdf``)."""
    cw = np.cumsum(weights, axis=-1)
    k = (cw < q * cw[..., -1:] * (1 - 1e-12)).sum(axis=-1)
    return values[np.minimum(k, len(values) - 1)]


def pooled_interval(samples: Sequence[LatencySample], metric: str, q: float,
                    confidence: float = 0.95, seed: int = 0, shared_sessions: bool = False,
                    resamples: int = CI_RESAMPLES) -> tuple[float, float]:
    """(low, high) of the pooled ``q`` quantile's ``confidence`` interval: a percentile
    bootstrap (``scipy.stats.bootstrap``) over the runs' sessions (``shared_sessions``:
    the same sessions in every run, module doc); NaN ends with fewer than two sessions
    (no spread to resample).  ``seed`` makes it repeatable."""
    if not samples:
        return math.nan, math.nan
    v, w, grp, clusters = _ci_values(samples, metric, shared_sessions)
    if clusters < 2 or not len(v):
        return math.nan, math.nan
    order = np.argsort(v, kind="stable")
    v, w, grp = v[order], w[order], grp[order]

    def statistic(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        idx = np.moveaxis(np.atleast_2d(idx), axis, -1)
        rows = idx.reshape(-1, idx.shape[-1])
        counts = np.zeros((len(rows), clusters))
        np.add.at(counts, (np.arange(len(rows))[:, None], rows), 1.0)
        return _weighted_quantiles(v, counts[:, grp] * w, q).reshape(idx.shape[:-1])

    rng = np.random.default_rng([seed, zlib.crc32(metric.encode())])
    kw = {"rng": rng} if "rng" in inspect.signature(stats.bootstrap).parameters \
        else {"random_state": rng}
    res = stats.bootstrap((np.arange(clusters),), statistic, n_resamples=resamples,
                          vectorized=True, method="percentile", confidence_level=confidence,
                          batch=max(1, _BATCH_VALUES // len(v)), **kw)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
