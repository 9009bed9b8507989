"""The latency-model boundary: what one engine step and one transfer cost.

The simulator asks two questions (docs/design/DESIGN.md §3.5):

- ``step_time_s(batch)``: the wall time of one engine step that runs some prefill
  chunks and some decode tokens together;
- ``decode_steps_s(contexts, steps)``: the times of ``steps`` consecutive
  decode-only steps of a fixed batch whose every sequence grows by one token per
  step — the fast-forward path (docs/design/DESIGN.md §4) computes a whole stretch with numpy.

NOTE: ``decode_steps_s(c, k, s)[j]`` must equal ``step_time_s`` of the decode-only
batch with contexts ``c + j`` (and ``kv_read_saved_bytes`` ``s``) to within
floating-point rounding: fast and per-step fidelity must agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class BatchShape:
    """One engine step.

    ``prefill_tokens[i]`` new prompt tokens are computed for a sequence that already
    holds ``prefill_context[i]`` tokens of KV; each decoding sequence ``j`` reads
    ``decode_context[j]`` tokens of KV and writes one more.

    ``kv_read_saved_bytes``: bytes the step's KV read is short of the engine cache
    type's, because a policy demoted some of its sequences' tokens to fewer bytes
    (KIVI, ``recoverable_eviction``: kvsim.policies.runtime); a roofline reads the
    rest.  Constant through a decode stretch (no token changes precision inside one).

    ``ubatches``: the graphs the engine runs this step as, one after another, when it
    splits the step (llama.cpp's ubatches, kvsim.engines.llama_cpp.llama_ubatches): each
    a BatchShape of the tokens it computes; together they are this step's tokens, a
    prompt chunk split over several of them at its growing context.  () = one graph.
    NOTE: a model prices each graph's fixed cost once per graph: a calibrated model
    prices each graph as the one-graph step of its shape (its constant, the set-up of
    each sequence it holds a piece of), a roofline each graph's overhead and weight read
    (its sampled outputs where a prompt ends).

    ``after_prompt``: a decode-only step's place after the engine's last step that
    computed prompt tokens (0 = the first decode step after it; -1 = not counted, or
    not a decode-only step).  A model may price the first few such steps above steady
    state (:attr:`LatencyModel.settle_steps`).
    """

    prefill_tokens: tuple[int, ...] = ()
    prefill_context: tuple[int, ...] = ()
    decode_context: tuple[int, ...] = ()
    kv_read_saved_bytes: float = 0.0
    ubatches: tuple[BatchShape, ...] = ()
    after_prompt: int = -1

    @property
    def num_tokens(self) -> int:
        return sum(self.prefill_tokens) + len(self.decode_context)


class LatencyModel(Protocol):
    """What the engine and its fast-forward call on a latency model (roofline,
    calibrated, constant).

    NOTE: ``clamped_steps`` counts the steps a calibrated model clamped to its
    measured range (its provenance reports them); a model that never clamps holds
    None.  Fast-forward prices steps ahead and puts the count back, so both
    fidelities count the same steps.
    """

    clamped_steps: int | None

    @property
    def predicts_median(self) -> bool:
        """Whether the step times are measured medians (a calibration: each point the
        median of its repeats) rather than typical means (a roofline fitted on mean
        throughputs, a constant): timing noise centres its draws on what the model
        predicts (kvsim.latency.jitter)."""
        ...

    @property
    def settle_steps(self) -> int:
        """Decode-only steps after a prompt step (``BatchShape.after_prompt`` below it)
        that the model prices above steady state; fast-forward starts no stretch before
        them (0: none)."""
        ...

    @property
    def provenance(self) -> str:
        """e.g. "roofline(rtx-4090)" or "calibrated(path, MAPE 6.1%)"."""
        ...

    @property
    def gpu_bytes_per_s(self) -> float | None:
        """Sustained GPU memory bandwidth (prices KV dequantization); None: not modelled."""

    @property
    def kv_read_token_bytes(self) -> int:
        """KV bytes one old token adds to every decode step's read; 0: not modelled."""

    @property
    def decode_spread(self) -> tuple[float, ...]:
        """Measured decode step time over modelled, as quantiles; () where not measured
        (the run's inter-token percentiles carry it, kvsim.metrics.spread)."""
        ...

    @property
    def prefill_spread(self) -> tuple[float, ...]:
        """Measured time to first token over typical, as quantiles; () where not measured."""
        ...

    def step_time_s(self, batch: BatchShape) -> float: ...

    def decode_steps_s(self, contexts: np.ndarray, steps: int,
                       kv_read_saved_bytes: float = 0.0) -> np.ndarray: ...

    def decode_steps_list(self, contexts: Sequence[int], steps: int,
                          kv_read_saved_bytes: float = 0.0) -> list[float] | None:
        """:meth:`decode_steps_s` as the same floats in scalar Python (short stretches),
        or None where the model has no scalar path (the caller uses numpy)."""
        ...


class WrappedLatency:
    """Base of a latency model that changes another's step times (timing noise, a speed
    band's end): what the engine reads besides the times is the inner model's.

    NOTE: ``clamped_steps`` is the inner model's (a calibrated model counts clamps on
    itself); a subclass defines ``provenance`` and the three step-time methods.
    """

    def __init__(self, inner: LatencyModel) -> None:
        self.inner = inner

    @property
    def clamped_steps(self) -> int | None:
        return self.inner.clamped_steps

    @clamped_steps.setter
    def clamped_steps(self, value: int | None) -> None:
        self.inner.clamped_steps = value

    @property
    def settle_steps(self) -> int:
        return self.inner.settle_steps

    @property
    def predicts_median(self) -> bool:
        return self.inner.predicts_median

    @property
    def gpu_bytes_per_s(self) -> float | None:
        return self.inner.gpu_bytes_per_s

    @property
    def kv_read_token_bytes(self) -> int:
        return self.inner.kv_read_token_bytes

    @property
    def decode_spread(self) -> tuple[float, ...]:
        return self.inner.decode_spread

    @property
    def prefill_spread(self) -> tuple[float, ...]:
        return self.inner.prefill_spread
