"""How much an engine's timing scatters, measured from calibration samples: the spreads
of decode steps and of times to first token around each point's typical value
(:func:`decode_spread`, :func:`prefill_spread`: the predicted percentiles carry them,
:mod:`kvsim.metrics.spread`), the decode and prompt steps' coefficients of variation
(:func:`step_time_cv`, :func:`prompt_step_cv`: ``latency.jitter_cv`` /
``jitter_prompt_cv``), the machine's speed from round to round (:func:`run_speed_cv`:
``latency.jitter_run_cv``), how late requests reach the server (:func:`arrival_delay`:
``latency.arrival_delay_s`` / ``arrival_jitter_s``) and the first decode steps after a
prompt (:func:`after_prompt_excess`). :func:`kvsim.calibrate.engine_samples.engine_artifact`
writes them into the artifact.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

import numpy as np

from kvsim.latency.artifact import FEATURES

if TYPE_CHECKING:
    from kvsim.calibrate.engine_samples import EngineSamples
    from kvsim.latency.artifact import LatencyFit


SPREAD_QUANTILES = 101
WARM_UP_GAPS = 4


def decode_spread(samples: EngineSamples, fit: LatencyFit) -> tuple[float, ...]:
    """Quantiles of the measured decode gaps over their point's typical step time.

    Gap ``i`` of a sequence that started at ``c`` cached tokens is the decode step at
    context ``c + i`` (the point features' convention) in a batch of ``b``; its ratio
    to the fitted step time at that shape is normalised as :func:`_spread` says.
    What remains is the step-to-step jitter and the speed changes from one request to
    the next within a round: the spread that inter-token percentiles show
    (:mod:`kvsim.metrics.spread`).

    NOTE: the first ``WARM_UP_GAPS`` gaps of each sequence are left out: on llama-server
    the first steps after a prompt run up to ~2.5x slower (graph rebuild, cold caches,
    measured by answer position), and their share of all gaps is set by the answer
    length — the calibration's ``decode_tokens``, not the workload's.
    """
    return _quantiles(_ratios(_decode_points(samples, fit)))


def step_time_cv(samples: EngineSamples, fit: LatencyFit) -> float | None:
    """The coefficient of variation of the decode gaps :func:`decode_spread` takes (each
    over its point's and round's typical step): the timing noise a scenario's
    ``latency.jitter_cv`` replays (kvsim.latency.jitter); None without two such gaps."""
    ratios = _ratios(_decode_points(samples, fit))
    if ratios.size < 2:
        return None
    return float(np.std(ratios, ddof=1) / np.mean(ratios))


MIN_SPEED_ROUNDS = 3
"""Rounds :func:`run_speed_cv` needs: the CV of two values says little."""


def run_speed_cv(samples: EngineSamples, fit: LatencyFit) -> float | None:
    """The coefficient of variation of the machine's speed from one round to the next:
    each round's median decode gap over its point's median (the round factor that
    :func:`_ratios` divides out), their CV over the rounds; what ``latency.jitter_run_cv``
    replays (one draw per run, kvsim.latency.jitter).  None under
    :data:`MIN_SPEED_ROUNDS` rounds.

    NOTE: rounds taken on the servers and at the times of the runs they predict (the e2e
    tests: one round on each replay's server) measure the drift between those runs;
    rounds taken back to back on one server measure little of it."""
    by_round = _over_point_medians(_decode_points(samples, fit))
    factors = [float(np.median(np.concatenate([r for r, _ in v]))) for v in by_round.values()]
    if len(factors) < MIN_SPEED_ROUNDS:
        return None
    return statistics.stdev(factors) / statistics.fmean(factors)


def prompt_step_cv(samples: EngineSamples) -> float | None:
    """The coefficient of variation of the times to first token (each over its point's
    and round's typical one, as :func:`prefill_spread`), weighted by the point's typical
    time: the timing noise of a step that computes prompt tokens, which
    ``latency.jitter_prompt_cv`` replays; None without two such times.

    NOTE: weighted by time because a long prompt step's wobble in seconds is what moves
    the steps after it; a short prompt's time to first token is mostly the request's
    own handling (HTTP, tokenising), whose hiccups are no step's.  Measured on
    llama-server (tests/e2e/test_llama_server_slots.py): 0.07-0.11 against a decode
    step's 0.16-0.19 on the same machine."""
    ratios, weights = _weighted_ratios(
        [[(v.round, np.array([v.ttft_s])) for v in vals if v.ttft_s > 0]
         for vals in samples.prefill.values()])
    if ratios.size < 2:
        return None
    mean = float(np.average(ratios, weights=weights))
    var = float(np.average((ratios - mean) ** 2, weights=weights))
    return math.sqrt(var) / mean


def arrival_delay(samples: EngineSamples) -> tuple[float, float] | None:
    """``(mean, standard deviation)`` in seconds of how late a request reaches the
    server beyond its typical handling — ``latency.arrival_delay_s`` / ``arrival_jitter_s``
    (kvsim.latency.jitter.ArrivalNoise) — over the prompts that measured both parts;
    None without two such prompts or when the mean is not positive.

    Each prompt's delay is the client's lateness (it sends after a pause: the time past
    the pause's end, which a closed-loop client's think time also has) plus its handling
    less the median handling of its round: the typical handling is in the calibrated
    time to first token already, so only its wobble is a delay.
    NOTE: measured on this calibration client between prompts to an idle server; a
    client that does more per turn or runs beside a busy server is later (kvsim replay
    under the 6-on-4 load: ~2x, docs/design/timing-noise.md).
    """
    by_round: dict[int, list[tuple[float, float]]] = {}
    for vals in samples.prefill.values():
        for v in vals:
            if v.late_s is not None and v.handling_s is not None:
                by_round.setdefault(v.round, []).append((v.late_s, v.handling_s))
    delays: list[float] = []
    for vals in by_round.values():
        mid = statistics.median(h for _, h in vals)
        delays.extend(late + handling - mid for late, handling in vals)
    if len(delays) < 2 or (mean := statistics.fmean(delays)) <= 0:
        return None
    return mean, statistics.stdev(delays)


def _decode_points(samples: EngineSamples, fit: LatencyFit
                   ) -> list[list[tuple[int, np.ndarray]]]:
    """Per decode grid point, each sample's ``(round, gaps over the fitted step)``
    after its warm-up gaps (:func:`decode_spread`)."""
    coef = np.array([fit.coefficients_s[n] for n in FEATURES])
    none = np.empty(0)
    points = []
    for (b, c), vals in samples.decode.items():
        per_sample = []
        for v in vals:
            gaps = np.asarray(v.gaps_s[WARM_UP_GAPS:])
            ctx = max(c, 1) + WARM_UP_GAPS + np.arange(len(gaps))
            fitted = np.array([fit.step_features(none, none, np.full(b, float(x))) @ coef
                               for x in ctx])
            per_sample.append((v.round, gaps[gaps > 0] / fitted[gaps > 0]))
        points.append(per_sample)
    return points


def after_prompt_excess(samples: EngineSamples) -> tuple[float, ...]:
    """Seconds each of the first ``WARM_UP_GAPS`` decode steps after a prompt step takes
    above a steady one (``LatencyFit.after_prompt_s``): over the one-sequence decode
    samples, the median of gap ``k`` minus its sample's median gap after the warm-up —
    0 where that is not positive — without trailing zeros.

    NOTE: the slowdown follows the prompt step, not the sequence: another slot's
    decode slows down alike after it (measured on llama-server, docs/design/
    calibration.md); batch samples are left out, their first gaps hold the other
    requests' prompts."""
    per_k: list[list[float]] = [[] for _ in range(WARM_UP_GAPS)]
    for (b, _), vals in samples.decode.items():
        for v in vals if b == 1 else ():
            gaps = np.asarray(v.gaps_s)
            if gaps.size > WARM_UP_GAPS:
                steady = float(np.median(gaps[WARM_UP_GAPS:]))
                for k in range(WARM_UP_GAPS):
                    per_k[k].append(float(gaps[k]) - steady)
    excess = [max(0.0, float(np.median(x))) if x else 0.0 for x in per_k]
    while excess and excess[-1] == 0.0:
        excess.pop()
    return tuple(excess)


def prefill_spread(samples: EngineSamples) -> tuple[float, ...]:
    """Quantiles of the measured times to first token over their point's typical one
    (normalised as :func:`_spread` says): the spread TTFT percentiles show."""
    return _spread([[(v.round, np.array([v.ttft_s])) for v in vals if v.ttft_s > 0]
                    for vals in samples.prefill.values()])


def _spread(points: list[list[tuple[int, np.ndarray]]]) -> tuple[float, ...]:
    """``SPREAD_QUANTILES`` quantiles of per-sample ratios ``(round, ratios)``, grouped
    by grid point, normalised as :func:`_ratios` says."""
    return _quantiles(_ratios(points))


def _ratios(points: list[list[tuple[int, np.ndarray]]]) -> np.ndarray:
    """Every per-sample ratio ``(round, ratios)`` of every grid point, normalised.

    Each ratio is divided by the median of its point (over all rounds), which takes
    out the fit's error at that point — the prediction carries it already — and then
    by the median of its round, which takes out how fast the machine ran in that
    round: a replay's percentiles are read within one run, and the spread of a whole
    session of rounds would add the drift between runs to it.
    """
    return _weighted_ratios(points)[0]


def _weighted_ratios(points: list[list[tuple[int, np.ndarray]]]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_ratios`, and each ratio's weight: its point's median (seconds, when the
    samples are times)."""
    ratios, weights = [], []
    for vals in _over_point_medians(points).values():
        r = np.concatenate([v for v, _ in vals])
        if r.size:
            ratios.append(r / np.median(r))
            weights.append(np.concatenate([np.full(v.size, w) for v, w in vals]))
    if not ratios:
        return np.empty(0), np.empty(0)
    return np.concatenate(ratios), np.concatenate(weights)


def _over_point_medians(points: list[list[tuple[int, np.ndarray]]]
                        ) -> dict[int, list[tuple[np.ndarray, float]]]:
    """Per round, each of its samples' ratios over its grid point's median (over all
    rounds), with that median: the fit's error at the point taken out, the round's
    speed left in (what :func:`_weighted_ratios` and :func:`run_speed_cv` read)."""
    by_round: dict[int, list[tuple[np.ndarray, float]]] = {}
    for per_sample in points:
        per_sample = [(rnd, r) for rnd, r in per_sample if r.size]
        if not per_sample:
            continue  # e.g. decodes no longer than the warm-up
        mid = float(np.median(np.concatenate([r for _, r in per_sample])))
        for rnd, r in per_sample:
            by_round.setdefault(rnd, []).append((r / mid, mid))
    return by_round


def _quantiles(ratios: np.ndarray) -> tuple[float, ...]:
    """``SPREAD_QUANTILES`` evenly spaced quantiles of ``ratios``; () when there are none."""
    if not ratios.size:
        return ()
    q = np.linspace(0.0, 1.0, SPREAD_QUANTILES)
    return tuple(float(v) for v in np.quantile(ratios, q, method="inverted_cdf"))
