"""Timing noise: any latency model's step times, each times a lognormal draw centred on
what the model predicts — of mean 1, or of median 1 where its times are measured medians.

A real server does not take the same time twice for the same step (other threads, clocks,
caches); where several sessions compete for fewer slots, which slot a returning session
finds free hinges on those milliseconds (docs/scenarios.md, "Timing noise").  ``latency.jitter_cv``
(kvsim.latency.config.JitterKnobs) sets the noise's coefficient of variation; `kvsim
calibrate engine` measures a server's.  ``latency.jitter_prompt_cv``, when set, is the
CV of a step that computes prompt tokens: its time wobbles less than a decode step's (a
hiccup of a millisecond is a large part of a 2 ms decode step, a small one of a 100 ms
prompt step), and which slot a session finds hinges on the prompt steps' timing.
``latency.jitter_run_cv`` is the CV of a whole run's speed: one lognormal factor per run
(its own stream, ``latency-run-speed``) on every step, the drift of a machine from one
run to the next (clocks, heat, neighbours) that a calibration's rounds show and a
single run's step noise does not (docs/design/timing-noise.md, "Runs differ in speed").
:func:`with_jitter` wraps the scenario's model.  Requests can also reach the engine late
(``latency.arrival_delay_s`` / ``arrival_jitter_s``: :class:`ArrivalNoise`), which moves
those races where the step noise alone would not (docs/design/timing-noise.md).

NOTE: the draws come from their own stream, a ``SeedSequence`` of the jitter seed and the
name ``latency-jitter`` (the convention of kvsim.workload.generator.stream), one draw per
priced step with a nonzero time, in the order steps are priced: the same seed gives the
same run, and the workload's draws are untouched by the noise.  A prompt step's factor is
the same draw at its own CV (:class:`_Rescale`: the same quantile of its
lognormal), so setting ``jitter_prompt_cv`` moves no other step's draw.
NOTE: a calibrated model's step times are medians (each point the median of its repeats:
``LatencyModel.predicts_median``); a draw of mean 1 would run its timeline below the
measured median (by ``exp(-σ²/2)``, 1.4 % at CV 0.17), so its factors are taken at median
1 instead: the same draw times ``exp(σ²/2) = sqrt(1 + CV²)`` (:class:`_Rescale`).
NOTE: a jittered step cannot be jumped as part of a closed-form decode stretch (its
steps' noise would have to be drawn in the same order as per-step runs draw it), so a
jittered run simulates every step (kvsim.api.simulate: ``sim.fidelity`` is then ``step``).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from kvsim.latency.base import BatchShape, LatencyModel, WrappedLatency

JITTER_STREAM = "latency-jitter"
ARRIVAL_STREAM = "arrival-jitter"
RUN_STREAM = "latency-run-speed"
_BLOCK = 4096  # draws taken from the generator at once (same values as one at a time)


def lognormal_params(cv: float) -> tuple[float, float]:
    """``(mu, sigma)`` of the lognormal with mean 1 and coefficient of variation ``cv``."""
    sigma2 = math.log1p(cv * cv)
    return -sigma2 / 2, math.sqrt(sigma2)


def jitter_rng(seed: int, stream: str = JITTER_STREAM) -> np.random.Generator:
    """The noise's generator for ``seed`` (stable across runs and platforms)."""
    key = (zlib.crc32(stream.encode("utf-8")),)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


class Noise:
    """An endless sequence of lognormal factors (mean 1, CV ``cv``), handed out in order.

    NOTE: drawn in blocks of ``_BLOCK``; numpy's lognormal gives the same values in
    blocks as one by one, so the sequence depends on the seed only.
    """

    def __init__(self, cv: float, seed: int) -> None:
        self.cv = cv
        self.mu, self.sigma = lognormal_params(cv)
        self._rng = jitter_rng(seed)
        self._buf: list[float] = []
        self._pos = 0

    def next(self) -> float:
        """The next factor (one step's)."""
        if self._pos == len(self._buf):
            self._refill()
        self._pos += 1
        return self._buf[self._pos - 1]

    def take(self, n: int) -> list[float]:
        """The next ``n`` factors."""
        out: list[float] = []
        while len(out) < n:
            if self._pos == len(self._buf):
                self._refill()
            k = min(n - len(out), len(self._buf) - self._pos)
            out.extend(self._buf[self._pos:self._pos + k])
            self._pos += k
        return out

    def _refill(self) -> None:
        self._buf = self._rng.lognormal(self.mu, self.sigma, _BLOCK).tolist()
        self._pos = 0


def run_speed_factor(cv: float, seed: int, median: bool) -> float:
    """A run's speed factor: one lognormal draw of CV ``cv`` from the ``latency-run-speed``
    stream of ``seed``, of median 1 (``median``: the model predicts medians) or mean 1;
    1 at CV 0."""
    if cv <= 0:
        return 1.0
    mu, sigma = lognormal_params(cv)
    return float(jitter_rng(seed, RUN_STREAM).lognormal(0.0 if median else mu, sigma))


class JitteredLatency(WrappedLatency):
    """A :class:`~kvsim.latency.base.LatencyModel` whose every step time is the inner
    model's times the next factor of a :class:`Noise` (at ``prompt_cv`` for a step that
    computes prompt tokens, ``cv`` for the others: the scenario's resolved
    ``JitterKnobs.prompt_cv``) and times the run's speed factor (``run_cv``:
    :func:`run_speed_factor`).

    NOTE: ``clamped_steps`` is the inner model's (a calibrated model counts clamps on
    itself), and so are its spreads for steps that are not jittered; a step of no time
    stays 0 and takes no draw.  With ``cv`` and ``prompt_cv`` 0 every step's factor is
    the run's, exactly, so decode stretches may still be jumped.
    """

    def __init__(self, inner: LatencyModel, cv: float, seed: int, prompt_cv: float,
                 run_cv: float = 0.0) -> None:
        super().__init__(inner)
        self.cv = cv
        self.prompt_cv = prompt_cv
        self.run_cv = run_cv
        # NOTE: the draws are at the decode CV (at the prompt CV when that one is 0)
        self.noise = Noise(cv if cv > 0 else self.prompt_cv, seed)
        median = inner.predicts_median
        self.run_factor = run_speed_factor(run_cv, seed, median)
        self._decode = _Rescale(self.noise, cv, median, self.run_factor)
        self._prompt = _Rescale(self.noise, self.prompt_cv, median, self.run_factor)

    @property
    def provenance(self) -> str:
        prompt = "" if self.prompt_cv == self.cv else f", prompt steps {self.prompt_cv:g}"
        run = (f", run speed CV {self.run_cv:g} (this run x{self.run_factor:.3f})"
               if self.run_cv > 0 else "")
        return f"{self.inner.provenance} + jitter CV {self.cv:g}{prompt}{run}"

    @property
    def decode_spread(self) -> tuple[float, ...]:
        """() when decode steps are jittered: their simulated gaps already carry the
        noise that a calibrated spread stands for in an exact run (kvsim.metrics.spread);
        carrying both would count it twice."""
        return () if self.cv > 0 else self.inner.decode_spread

    @property
    def prefill_spread(self) -> tuple[float, ...]:
        """() when prompt steps are jittered (as :attr:`decode_spread`)."""
        return () if self.prompt_cv > 0 else self.inner.prefill_spread

    def step_time_s(self, batch: BatchShape) -> float:
        dt = self.inner.step_time_s(batch)
        if dt <= 0:
            return dt
        scale = self._prompt if batch.prefill_tokens else self._decode
        return dt * scale(self.noise.next())

    def decode_steps_s(self, contexts: np.ndarray, steps: int,
                       kv_read_saved_bytes: float = 0.0) -> np.ndarray:
        base = np.asarray(self.inner.decode_steps_s(contexts, steps, kv_read_saved_bytes))
        return np.array(self._apply(base.tolist()), dtype=np.float64)

    def decode_steps_list(self, contexts: Sequence[int], steps: int,
                          kv_read_saved_bytes: float = 0.0) -> list[float] | None:
        base = self.inner.decode_steps_list(contexts, steps, kv_read_saved_bytes)
        return None if base is None else self._apply(base)

    def _apply(self, base: list[float]) -> list[float]:
        """``base`` with each positive time times the next factor (in order)."""
        factors = iter(self.noise.take(sum(1 for d in base if d > 0)))
        return [d * self._decode(next(factors)) if d > 0 else d for d in base]


class _Rescale:
    """A draw of ``noise`` (lognormal, mean 1, the noise's CV) as the same quantile of the
    lognormal of CV ``cv`` and mean 1 — or median 1 (``median``: the draw times
    ``exp(σ²/2)``): itself (times that) at the noise's CV, 1 at CV 0; times ``run``
    (the run's speed factor)."""

    def __init__(self, noise: Noise, cv: float, median: bool = False, run: float = 1.0) -> None:
        self.same = cv == noise.cv
        self.mu, self.sigma = lognormal_params(cv)
        self.ratio = self.sigma / noise.sigma if noise.sigma > 0 else 0.0
        self.noise_mu = noise.mu
        self.centre = (math.sqrt(1.0 + cv * cv) if median else 1.0) * run  # exp(σ²/2)
        if median:
            self.mu = 0.0
        self.mu += math.log(run)

    def __call__(self, factor: float) -> float:
        if self.same:
            return factor * self.centre
        return math.exp(self.mu + self.ratio * (math.log(factor) - self.noise_mu))


def with_jitter(model: LatencyModel, cv: float, seed: int, prompt_cv: float,
                run_cv: float = 0.0) -> LatencyModel:
    """``model`` itself without jitter (``cv``, ``prompt_cv`` and ``run_cv`` 0), else
    wrapped in :class:`JitteredLatency`."""
    if cv > 0 or prompt_cv > 0 or run_cv > 0:
        return JitteredLatency(model, cv, seed, prompt_cv, run_cv)
    return model


class ArrivalNoise:
    """How late each request reaches the engine: lognormal draws of mean ``mean_s`` and
    standard deviation ``sd_s`` (``latency.arrival_delay_s`` / ``arrival_jitter_s``), or
    ``mean_s`` itself when ``sd_s`` is 0.

    A real client sends a turn a little after its think time ends (waking up, building
    the request) and the server takes it up after handling it (HTTP, tokenising): which
    slot a returning session finds free can hinge on those milliseconds
    (docs/design/timing-noise.md).
    NOTE: its own stream (``arrival-jitter`` of the jitter seed); the engine takes a
    session's draws at once when the session starts (:meth:`take`), in the order sessions
    start, which both fidelities share: the same seed gives the same delays.
    """

    def __init__(self, mean_s: float, sd_s: float, seed: int) -> None:
        if mean_s <= 0:
            raise ValueError("an arrival delay's mean must be positive")
        self.mean_s = mean_s
        mu, self.sigma = lognormal_params(sd_s / mean_s)  # NOTE: of mean 1, scaled below
        self.mu = math.log(mean_s) + mu
        self._rng = jitter_rng(seed, ARRIVAL_STREAM) if sd_s > 0 else None

    def take(self, n: int) -> list[float]:
        """The delays of a session's ``n`` turns, in turn order."""
        if self._rng is None:
            return [self.mean_s] * n
        return self._rng.lognormal(self.mu, self.sigma, n).tolist()


def arrival_noise(mean_s: float, sd_s: float, seed: int) -> ArrivalNoise | None:
    """None when requests arrive on time (``mean_s`` 0), else an :class:`ArrivalNoise`."""
    return ArrivalNoise(mean_s, sd_s, seed) if mean_s > 0 else None
