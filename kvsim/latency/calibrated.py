"""Calibrated latency: step times from a measured, fitted artifact (docs/design/DESIGN.md §3.5).

The artifact (:mod:`kvsim.latency.artifact`) holds, per KV cache dtype, non-negative
coefficients of a linear step-time model over nine step features (a constant, prefill
chunks, prefill tokens, prefill attention pairs of long and of short chunks, decoding
sequences, whether two or more decode, KV tokens read by decode, and those beyond the
fit's KV knee) and the range of
each feature that was actually measured.
A step the engine runs as several graphs (``BatchShape.ubatches``: llama.cpp's ubatches)
costs the sum of its graphs, each priced as the one-graph step of its own shape: the
points were measured on one-graph steps, so a graph pays the constant (set-up, launch,
synchronisation), the set-up of each sequence it computes a piece of, and its pieces'
attention at their own size class (a prompt's last piece of a few dozen tokens takes the
small-chunk path).  Measured on llama-server (docs/design/calibration.md): a step of one
decode and three whole prompts of ~386 tokens, six graphs, took 0.33 s on a replay's
server (0.32-0.36 s on an idle one); the sum of its graphs prices 0.33 s, the whole step
as one graph 0.28 s.  The first decode steps after a step that computed prompt tokens
(``BatchShape.after_prompt`` k below :attr:`~CalibratedLatencyModel.settle_steps`) add the
measured ``after_prompt_s[k]``; decode stretches start after them, so ``decode_steps_s``
prices steady steps only.

Outside that range the model never extrapolates silently.  With
``out_of_range="clamp"`` (default) each sequence's context is clamped to the largest
measured context, then each per-step feature to its measured maximum, and the step is
*counted* (:attr:`CalibratedLatencyModel.clamped_steps`, reported in the provenance of
results); with ``out_of_range="refuse"`` such a step raises :class:`InputError` naming
the feature, the value and the measured range.

NOTE: lower bounds are not clamped: every feature's range includes 0 (a decode-only
step has no prefill, a prefill-only step no decode), so values between 0 and the
measured maximum are interpolation of a linear model, not extrapolation.
NOTE: ``decode_steps_s(c, k)[j] == step_time_s(decode batch c + j)`` up to rounding;
both go through the same clamp and the same coefficients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from kvsim.errors import InputError
from kvsim.latency.artifact import (
    FEATURES,
    CalibrationArtifact,
    LatencyFit,
    decode_multi,
    kv_spill,
    load_artifact,
)
from kvsim.latency.base import BatchShape

OutOfRange = Literal["clamp", "refuse"]
_SEQ, _MULTI, _KV, _SPILL = (FEATURES.index(n) for n in (
    "decode_seq", "decode_multi", "decode_kv", "decode_kv_spill"))


@dataclass
class CalibratedLatencyModel:
    """A :class:`~kvsim.latency.base.LatencyModel` built from one fit of an artifact."""

    fit: LatencyFit
    out_of_range: OutOfRange = "clamp"
    source: str = ""
    h2d_bytes_per_s: float | None = None
    device: str = ""  # where the artifact was measured (its ``device``)
    clamped_steps: int = field(default=0, init=False)
    gpu_bytes_per_s = None  # NOTE: a fit has no bandwidth term (LatencyModel)
    kv_read_token_bytes = 0  # NOTE: nor a per-byte KV read (LatencyModel)
    predicts_median = True  # NOTE: every point is the median of its repeats (LatencyModel)

    def __post_init__(self) -> None:
        self._coef = np.array([self.fit.coefficients_s[n] for n in FEATURES])
        self._max = np.array([np.inf] + [self.fit.valid[n].max for n in FEATURES[1:]])
        self._after_prompt = self.fit.after_prompt_s

    @property
    def settle_steps(self) -> int:
        """The decode steps after a prompt step that the fit prices above steady state
        (``LatencyFit.after_prompt_s``)."""
        return len(self._after_prompt)

    @property
    def provenance(self) -> str:
        """Source, fit error, the decode KV knee (if the fit has one), — once any — the
        steps clamped to the measured range, and the device the times were measured on
        (the scenario's GPU is not checked)."""
        clamped = f", {self.clamped_steps} steps clamped" if self.clamped_steps else ""
        device = f", measured on {self.device}" if self.device else ""
        knee = self.fit.kv_knee_tokens
        knee_text = f", decode KV knee {knee:,} tokens" if knee else ""
        return (f"calibrated({self.source or 'artifact'}, {self.fit.cache_type}, "
                f"MAPE {100 * self.fit.mape:.1f}%{knee_text}{clamped}{device})")

    @classmethod
    def from_artifact(cls, artifact: CalibrationArtifact, cache_type: str = "f16",
                      out_of_range: OutOfRange = "clamp", source: str = ""
                      ) -> CalibratedLatencyModel:
        h2d = [b.bytes_per_s for b in artifact.bandwidth
               if b.direction in ("h2d", "memcpy") and b.pinned]
        h2d = h2d or [b.bytes_per_s for b in artifact.bandwidth if b.direction != "d2h"]
        return cls(artifact.fit_for(cache_type), out_of_range, source or artifact.model,
                   max(h2d) if h2d else None, artifact.device)

    @classmethod
    def from_path(cls, path: str | Path, cache_type: str = "f16",
                  out_of_range: OutOfRange = "clamp") -> CalibratedLatencyModel:
        return cls.from_artifact(load_artifact(path), cache_type, out_of_range,
                                 source=Path(path).name)

    @property
    def decode_spread(self) -> tuple[float, ...]:
        """Measured decode step time over fitted, as quantiles (() if not measured);
        the run's inter-token percentiles carry it (:mod:`kvsim.metrics.spread`)."""
        return self.fit.decode_spread

    @property
    def prefill_spread(self) -> tuple[float, ...]:
        """Measured time to first token over typical, as quantiles (() if not measured);
        the run's TTFT percentiles carry it (:mod:`kvsim.metrics.spread`)."""
        return self.fit.prefill_spread

    # -- LatencyModel protocol -------------------------------------------------------
    def step_time_s(self, batch: BatchShape) -> float:
        # NOTE: a step run as several graphs costs each graph as the one-graph step of its
        # shape (how the points were measured): its constant, each of its sequences'
        # set-up, its chunks' attention at their own size class (module doc)
        if batch.ubatches:
            priced = [self._graph_s(g) for g in batch.ubatches]
            t, clamped = sum(t for t, _ in priced), any(c for _, c in priced)
        else:
            t, clamped = self._graph_s(batch)
        if clamped:
            self._out_of_range(batch)
        k = batch.after_prompt
        return t + self._after_prompt[k] if 0 <= k < len(self._after_prompt) else t

    def _graph_s(self, graph: BatchShape) -> tuple[float, bool]:
        """One graph's time and whether it was clamped to the measured range."""
        cap = self.fit.max_context
        p = np.asarray(graph.prefill_tokens, dtype=float)
        c = np.asarray(graph.prefill_context, dtype=float)
        d = np.asarray(graph.decode_context, dtype=float)
        clamped = bool((c + p > cap).any() or (d > cap).any())
        c = np.minimum(c, np.maximum(cap - p, 0.0))
        d = np.minimum(d, cap)
        x = self.fit.step_features(p, c, d)
        if over := bool((x > self._max).any()):
            x = np.minimum(x, self._max)
        return float(x @ self._coef), clamped or over

    def decode_steps_s(self, contexts: np.ndarray, steps: int,
                       kv_read_saved_bytes: float = 0.0) -> np.ndarray:
        # NOTE: fitted on tokens, not bytes: kv_read_saved_bytes is ignored, as in
        # step_time_s (a policy sets it only for a roofline: kvsim.policies.build)
        ctx = np.asarray(contexts, dtype=float)
        cap = float(self.fit.max_context)
        j = np.arange(steps, dtype=float)
        n = float(ctx.size)
        raw_kv = ctx.sum() + n * j
        # NOTE: per-sequence clamp: sum_i min(c_i + j, cap), exact and vectorised.
        kv = np.minimum(ctx[:, None] + j[None, :], cap).sum(axis=0) if ctx.size else raw_kv
        clamped = (kv < raw_kv) | (kv > self._max[_KV]) | (n > self._max[_SEQ])
        if clamped.any():
            if self.out_of_range == "refuse":
                first = int(np.argmax(clamped))
                self._refuse(BatchShape(decode_context=tuple(int(v) for v in ctx + first)))
            self.clamped_steps += int(clamped.sum())
        kv = np.minimum(kv, self._max[_KV])
        seqs = min(n, self._max[_SEQ])
        multi = min(decode_multi(int(n)), self._max[_MULTI])
        spill = kv_spill(kv, self.fit.kv_knee_tokens)
        return (self._coef[0] + self._coef[_SEQ] * seqs + self._coef[_MULTI] * multi
                + self._coef[_KV] * kv + self._coef[_SPILL] * spill)

    def decode_steps_list(self, contexts: Sequence[int], steps: int,
                          kv_read_saved_bytes: float = 0.0) -> list[float] | None:
        return None  # NOTE: no scalar path: the clamps count on numpy's (LatencyModel)

    # -- transfers -------------------------------------------------------------------
    def transfer_time_s(self, nbytes: float) -> float:
        """Host→device copy time at the measured (pinned when measured) bandwidth."""
        if self.h2d_bytes_per_s is None:
            raise InputError("latency.path", self.source,
                             "this artifact measured no host-device bandwidth")
        return float(nbytes) / self.h2d_bytes_per_s

    # -- out of range ----------------------------------------------------------------
    def _out_of_range(self, batch: BatchShape) -> None:
        if self.out_of_range == "refuse":
            self._refuse(batch)
        self.clamped_steps += 1

    def _refuse(self, batch: BatchShape) -> None:
        raise InputError(
            "latency", f"step with {batch.num_tokens} tokens "
            f"(max context {max(batch.prefill_context + batch.decode_context, default=0)})",
            f"outside the calibrated range of {self.source} (contexts ≤ "
            f"{self.fit.max_context}, batch ≤ {self.fit.max_batch}, prefill tokens ≤ "
            f"{self.fit.valid['prefill_token'].max:g}); set out_of_range: clamp or "
            "calibrate a larger grid")


def calibrated_latency(path: str | Path, cache_type: str = "f16",
                       out_of_range: OutOfRange = "clamp") -> CalibratedLatencyModel:
    """Build the model from an artifact path for one cache dtype."""
    return CalibratedLatencyModel.from_path(path, cache_type, out_of_range)


def cache_key(cache_type_k: str, cache_type_v: str) -> str:
    """Artifact fit key of a K/V cache-type pair: ``f16``, or ``q8_0/f16`` when they differ."""
    return cache_type_k if cache_type_k == cache_type_v else f"{cache_type_k}/{cache_type_v}"


def make_calibrated(scenario: Any, budget: Any | None = None) -> CalibratedLatencyModel:
    """The scenario's ``latency: {kind: calibrated, path, out_of_range}`` model.

    The fit is chosen by the engine's KV cache types.  ``budget`` is accepted for the
    factory's signature; a calibrated artifact already reflects the device it ran on.
    """
    cfg, eng = scenario.latency, scenario.engine
    artifact = load_artifact(cfg.path)
    check_model(artifact, scenario.model.name, str(cfg.path))
    return CalibratedLatencyModel.from_artifact(
        artifact, cache_key(eng.cache_type_k, eng.cache_type_v), cfg.out_of_range,
        source=Path(cfg.path).name)


def check_model(artifact: CalibrationArtifact, model: str, path: str) -> None:
    """A kernel artifact times one catalogue model's layers: refuse it for another model.

    NOTE: an engine artifact names the server's model file, not a catalogue name, so it
    is not checked (the user pairs a server with its scenario).
    """
    if artifact.source == "kernels" and artifact.model != model:
        raise InputError("latency.path", path,
                         f"measured {artifact.model}'s layers, but the scenario's model is "
                         f"{model}; calibrate {model} (kvsim calibrate kernels --model "
                         f"{model}) or set model: {artifact.model}")
