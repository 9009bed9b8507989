"""Engine calibration samples: pooled rounds, their points, fit and measured spreads.

:func:`kvsim.calibrate.engine.measure_engine` returns :class:`EngineSamples` — the raw
samples of one or more rounds (a round visits every grid point once).  Samples of
rounds taken at different times pool with :meth:`EngineSamples.extend`;
:func:`engine_artifact` turns them into a fitted artifact: one timing point per grid
entry (the median over its samples), the RAM-cache save/restore costs, and the
measured spreads of decode steps and of times to first token around each point's
typical value (:func:`decode_spread`, :func:`prefill_spread`), which the predicted
percentiles carry (:mod:`kvsim.metrics.spread`), and the decode steps' coefficient of
variation (:func:`step_time_cv`, ``settings.step_time_cv``), which ``latency.jitter_cv``
replays, and the prompt steps' (:func:`prompt_step_cv`, ``settings.prompt_step_cv``), which
``latency.jitter_prompt_cv`` replays, and the machine's speed from round to round
(:func:`run_speed_cv`, ``settings.run_speed_cv``), which ``latency.jitter_run_cv``
replays, and how late requests reach the server
(:func:`arrival_delay`, ``settings.arrival_delay_s`` / ``arrival_jitter_s``), which
``latency.arrival_delay_s`` / ``arrival_jitter_s`` replay.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from kvsim.calibrate.fit import fit_points
from kvsim.latency.artifact import (
    FEATURES,
    CalibrationArtifact,
    LatencyFit,
    TimingPoint,
)

if TYPE_CHECKING:
    from kvsim.calibrate.engine import EngineGrid


@dataclass(frozen=True)
class PrefillSample:
    """One prompt: client-side time to first token, the server's cached and computed
    prompt tokens, the round it was measured in, and what :func:`arrival_delay` reads:
    how late the client sent it (``late_s``: after its pause, beyond the pause) and the
    time to first token the server's own prompt time leaves (``handling_s``: HTTP,
    tokenising, the first token's way back); None where not measured."""

    ttft_s: float
    cache_n: int
    prompt_n: int
    round: int = 0
    late_s: float | None = None
    handling_s: float | None = None


@dataclass(frozen=True)
class DecodeSample:
    """One decoding sequence: its median step time, its decode steps, every
    server-timed gap (the step-to-step spread, :func:`decode_spread`) and the round it
    was measured in."""

    step_s: float
    steps: int
    gaps_s: tuple[float, ...] = ()
    round: int = 0


@dataclass
class EngineSamples:
    """Raw samples of one or more calibration rounds, pooled before the fit.

    One round visits every grid point once (prefill, decode, RAM cache), so a slow
    minute on a shared machine touches every point alike instead of the few measured
    in it; samples of rounds taken at different times (say, between the replays they
    will predict) add up with :meth:`extend`.
    """

    props: dict
    prefill: dict[tuple[int, int], list[PrefillSample]] = field(default_factory=dict)
    decode: dict[tuple[int, int], list[DecodeSample]] = field(default_factory=dict)
    ram: list[tuple[int, float, float]] = field(default_factory=list)
    ram_absent: bool = False
    rounds: int = 0

    def extend(self, other: EngineSamples) -> EngineSamples:
        for mine, theirs in ((self.prefill, other.prefill), (self.decode, other.decode)):
            for key, vals in theirs.items():  # their rounds follow ours
                mine.setdefault(key, []).extend(
                    replace(v, round=v.round + self.rounds) for v in vals)
        self.ram.extend(other.ram)
        self.ram_absent |= other.ram_absent
        self.rounds += other.rounds
        return self


def _ram_cache_fit(samples: list[tuple[int, float, float]]) -> tuple[float, float, float]:
    """Seconds per saved token, per restored token, and fixed seconds per copy.

    Each is a least-squares slope through the origin over every sample, per saved or
    restored token: the simulator charges saves (synchronous on llama-server's loop
    thread) and restores separately.
    NOTE: the saved slot held A plus its one answer token; ~C either way.  The save
    difference cancels any fixed cost (both takeovers pay it), so its slope goes
    through the origin; the restore is fitted with an intercept: a fixed cost per copy
    (state set-up, buffer allocation) that the per-token slope cannot show.  A cost
    the noise hides is recorded as 0, not as negative.
    """
    n = np.array([s[0] for s in samples], dtype=float)
    save_s, restore_s = np.array([s[1] for s in samples]), np.array([s[2] for s in samples])
    save = max(0.0, float(n @ save_s / (n @ n)))
    if len(set(n.tolist())) > 1:
        (fixed, per_token), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(n), n]),
                                                 restore_s, rcond=None)
    else:
        fixed, per_token = 0.0, float(n @ restore_s / (n @ n))
    return save, max(0.0, float(per_token)), max(0.0, float(fixed))


def _points(samples: EngineSamples, grid: EngineGrid) -> list[TimingPoint]:
    """One point per grid entry: the median over its samples; a prompt longer than the
    server's ``n_ubatch`` ran as several graphs, which its point says
    (``TimingPoint.ubatch_tokens``)."""
    points = []
    for vals in samples.prefill.values():
        cache_n, prompt_n = statistics.median_low([(v.cache_n, v.prompt_n) for v in vals])
        points.append(TimingPoint(
            kind="prefill", cache_type=grid.cache_type, batch=1, context=cache_n,
            tokens=prompt_n, steps=math.ceil(prompt_n / grid.n_batch),
            measured_s=statistics.median(v.ttft_s for v in vals), repeats=len(vals),
            ubatch_tokens=grid.n_ubatch))
    for (b, c), vals in samples.decode.items():
        steps = max(1, min(v.steps for v in vals))
        points.append(TimingPoint(
            kind="decode", cache_type=grid.cache_type, batch=b, context=max(c, 1),
            steps=steps, measured_s=statistics.median(v.step_s for v in vals) * steps,
            repeats=len(vals)))
    return points


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


def engine_artifact(samples: EngineSamples, grid: EngineGrid) -> CalibrationArtifact:
    """Fit pooled samples into an artifact with ``source="engine"``."""
    props, points = samples.props, _points(samples, grid)
    slots = int(props.get("total_slots", 1))
    slot_ctx = int((props.get("default_generation_settings") or {}).get("n_ctx", 0))
    extra = {}
    if samples.ram and not samples.ram_absent:
        save, restore, fixed = _ram_cache_fit(samples.ram)
        extra = {"ram_cache_save_s_per_token": save, "ram_cache_restore_s_per_token": restore,
                 "ram_cache_fixed_s": fixed, "ram_cache_s_per_token": save + restore}
    model = str(props.get("model_alias") or props.get("model_path") or "server").split("/")[-1]
    fits = _with_spread(samples, fit_points(points, grid.small_chunk_tokens))
    return CalibrationArtifact(
        source="engine", device=f"llama-server at {props['url']}", model=model,
        software={"server": str(props.get("build_info", "llama-server"))},
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        grid={"prompt_tokens": list(grid.prompt_tokens), "context": list(grid.contexts),
              "batch": [b for b in grid.batches if b <= slots],
              "cache_type": [grid.cache_type]},
        settings={"repeats": samples.rounds, "decode_tokens": grid.decode_tokens,
                  "n_batch": grid.n_batch, "n_ubatch": grid.n_ubatch, "slots": slots,
                  "slot_ctx": slot_ctx,
                  **extra, **_cv_setting(samples, fits, grid.cache_type)},
        points=tuple(points), fits=fits)


def _cv_setting(samples: EngineSamples, fits: dict[str, LatencyFit], cache_type: str
                ) -> dict[str, float]:
    """``step_time_cv`` and ``run_speed_cv`` of the grid's cache type's fit,
    ``prompt_step_cv`` and the arrival delay (``arrival_delay_s``, ``arrival_jitter_s``),
    each left out when not measured."""
    fit = fits.get(cache_type) or next(iter(fits.values()), None)
    cv = None if fit is None else step_time_cv(samples, fit)
    run = None if fit is None else run_speed_cv(samples, fit)
    prompt, late = prompt_step_cv(samples), arrival_delay(samples)
    return ({} if cv is None else {"step_time_cv": cv}) | (
        {} if run is None else {"run_speed_cv": run}) | (
        {} if prompt is None else {"prompt_step_cv": prompt}) | (
        {} if late is None else {"arrival_delay_s": late[0], "arrival_jitter_s": late[1]})


def _with_spread(samples: EngineSamples, fits: dict[str, LatencyFit]) -> dict[str, LatencyFit]:
    ttft, after = prefill_spread(samples), after_prompt_excess(samples)
    return {k: f.model_copy(update={"decode_spread": decode_spread(samples, f),
                                    "prefill_spread": ttft, "after_prompt_s": after})
            for k, f in fits.items()}
