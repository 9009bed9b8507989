"""Engine calibration samples: pooled rounds, their points and fit.

:func:`kvsim.calibrate.engine.measure_engine` returns :class:`EngineSamples` — the raw
samples of one or more rounds (a round visits every grid point once).  Samples of
rounds taken at different times pool with :meth:`EngineSamples.extend`;
:func:`engine_artifact` turns them into a fitted artifact: one timing point per grid
entry (the median over its samples), the RAM-cache save/restore costs, and what
:mod:`kvsim.calibrate.engine_noise` measures of the samples' scatter (the spreads the
predicted percentiles carry; ``settings.step_time_cv``, ``prompt_step_cv``,
``run_speed_cv``, ``arrival_delay_s`` / ``arrival_jitter_s``, which the ``latency.jitter_*``
and ``arrival_*`` keys replay).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from kvsim.calibrate.engine_noise import (
    after_prompt_excess,
    arrival_delay,
    decode_spread,
    prefill_spread,
    prompt_step_cv,
    run_speed_cv,
    step_time_cv,
)
from kvsim.calibrate.fit import fit_points
from kvsim.latency.artifact import CalibrationArtifact, LatencyFit, TimingPoint

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
