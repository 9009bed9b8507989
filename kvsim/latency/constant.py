"""Constant latency: fixed step cost plus optional per-token terms (tests, theory).

With ``prefill_token_s = decode_token_s = 0`` every step takes exactly ``step_s``,
which makes queueing theory (M/D/1, Little's law) directly checkable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvsim.latency.base import BatchShape


class ConstantLatency:
    """``step_s + prefill_token_s · prefill tokens + decode_token_s · decode tokens``."""

    clamped_steps: int | None = None  # NOTE: never clamps (LatencyModel)
    settle_steps = 0  # NOTE: every decode step is steady (LatencyModel)
    predicts_median = False  # NOTE: a typical (mean) step (LatencyModel)
    gpu_bytes_per_s = None  # NOTE: no bandwidth term (LatencyModel)
    kv_read_token_bytes = 0  # NOTE: nor a per-byte KV read (LatencyModel)
    decode_spread: tuple[float, ...] = ()  # NOTE: a model, not a measurement
    prefill_spread: tuple[float, ...] = ()

    def __init__(self, step_s: float, prefill_token_s: float = 0.0,
                 decode_token_s: float = 0.0) -> None:
        self.step_s = step_s
        self.prefill_token_s = prefill_token_s
        self.decode_token_s = decode_token_s
        self.provenance = f"constant(step {step_s:g} s)"

    def step_time_s(self, batch: BatchShape) -> float:
        if not batch.num_tokens:
            return 0.0
        return (self.step_s + self.prefill_token_s * sum(batch.prefill_tokens)
                + self.decode_token_s * len(batch.decode_context))

    def decode_steps_s(self, contexts: np.ndarray, steps: int,
                       kv_read_saved_bytes: float = 0.0) -> np.ndarray:
        # NOTE: no per-byte KV term, so demoted tokens' bytes change nothing (step_time_s)
        n = len(contexts)
        return np.full(steps, self.step_s + self.decode_token_s * n if n else 0.0)

    def decode_steps_list(self, contexts: Sequence[int], steps: int,
                          kv_read_saved_bytes: float = 0.0) -> list[float] | None:
        return None  # NOTE: no scalar path: numpy's (LatencyModel)
