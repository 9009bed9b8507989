"""The speed model's error band: how far from kvsim's prediction a card it did not see ran.

The backend constants (kvsim.latency.backend) are fitted on published llama.cpp
measurements; ``scripts/fit_speed.py`` then refits once per device without that device and
predicts it (leave-one-device-out), and writes, per (kind, backend, metric), the 10th and
90th percentiles of the signed error of kvsim's speed (``p10_rel_err`` / ``p90_rel_err``:
predicted over measured tokens/s, minus 1).  A step's time goes as the inverse of the
speed, so a card at the 90th percentile runs each step ``1 + p90`` times as long as
predicted, one at the 10th ``1 + p10`` times.

:func:`speed_band` reads the band of a scenario's backend — one-sequence decode for the
steps that compute no prompt token, prompt processing for the steps that do — and
:class:`ScaledLatency` is a latency model with its step times times those factors, so a
scenario can be rerun at either end (``kvsim simulate --speed-band``,
kvsim.cli._speed_band_output).

NOTE: a band belongs to the spec-sheet roofline with fitted constants only: a calibrated
model (the user's own card, measured), a constant model and ``rates: peak`` have none; nor
does a backend the constants carry no such percentiles for.
Design: docs/design/speed-model.md ("The band a user is shown").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvsim.latency.base import BatchShape, LatencyModel, WrappedLatency

if TYPE_CHECKING:
    import numpy as np

ENDS = ("fast", "slow")
"""The band's two ends: kvsim's speed at the 10th and at the 90th percentile of its error."""
SHARE = "8 in 10"
"""The share of left-out cards between the two ends (the 10th to the 90th percentile)."""


@dataclass(frozen=True)
class SpeedBand:
    """Step-time factors at the band's ends, ``(fast, slow)``, for decode-only steps and
    for steps that compute prompt tokens; ``rows``: the measurements behind each."""

    backend: str
    decode: tuple[float, float]
    prompt: tuple[float, float]
    decode_rows: int
    prompt_rows: int

    def factors(self, end: str) -> tuple[float, float]:
        """(decode, prompt) step-time factors at ``end`` ("fast" or "slow")."""
        i = ENDS.index(end)
        return self.decode[i], self.prompt[i]

    def ratio_words(self) -> str:
        """The band as measured over predicted speeds, e.g. "decode 0.88–1.12× and prompt
        processing 0.60–1.18×"."""
        def ratio(f: tuple[float, float]) -> str:
            return f"{1 / f[1]:.2f}–{1 / f[0]:.2f}×"
        return f"decode {ratio(self.decode)} and prompt processing {ratio(self.prompt)}"

    def speed_words(self) -> str:
        """:meth:`ratio_words` "kvsim's speed"."""
        return f"{self.ratio_words()} kvsim's speed"

    def summary(self) -> dict[str, float]:
        """The band as summary keys (``latency_fit_*``: the report's scenario card shows
        them): measured over predicted speed at each end."""
        return {"latency_fit_decode_speed_p10": 1 / self.decode[1],
                "latency_fit_decode_speed_p90": 1 / self.decode[0],
                "latency_fit_prompt_speed_p10": 1 / self.prompt[1],
                "latency_fit_prompt_speed_p90": 1 / self.prompt[0]}


def band_from_errors(errors: dict[str, dict[str, float]], backend: str) -> SpeedBand | None:
    """The band of ``backend`` from fitted constants' ``errors`` (one-sequence rows), or
    None when they carry no percentiles for it."""
    got = []
    for metric in ("tg_tps", "pp_tps"):
        e = errors.get(f"single/{backend}/{metric}", {})
        if "p10_rel_err" not in e or "p90_rel_err" not in e:
            return None
        got.append(((1.0 + e["p10_rel_err"], 1.0 + e["p90_rel_err"]), int(e.get("n", 0))))
    (decode, n_decode), (prompt, n_prompt) = got
    return SpeedBand(backend, decode, prompt, n_decode, n_prompt)


def speed_band(scenario: Any) -> SpeedBand | None:
    """The band of a scenario's latency model (module doc); None where it has none."""
    cfg = scenario.latency
    if cfg.kind != "roofline" or cfg.rates != "backend":
        return None
    from kvsim.latency.backend import load_constants, resolve_backend

    return band_from_errors(load_constants(cfg.constants).errors,
                            resolve_backend(cfg.backend, scenario.gpu))


class ScaledLatency(WrappedLatency):
    """A :class:`~kvsim.latency.base.LatencyModel` whose steps take ``prompt`` times the
    inner model's time when they compute prompt tokens, ``decode`` times it otherwise.

    NOTE: deterministic, so decode stretches are still jumped: ``decode_steps_s`` scales
    by ``decode`` exactly as ``step_time_s`` does a decode-only step.
    """

    def __init__(self, inner: LatencyModel, decode: float, prompt: float) -> None:
        if decode <= 0 or prompt <= 0:
            raise ValueError("step-time factors must be positive")
        super().__init__(inner)
        self.decode = decode
        self.prompt = prompt

    @property
    def provenance(self) -> str:
        return (f"{self.inner.provenance} x{self.decode:.3g} decode, x{self.prompt:.3g} "
                "prompt step time")

    def step_time_s(self, batch: BatchShape) -> float:
        return self.inner.step_time_s(batch) * (self.prompt if batch.prefill_tokens
                                                 else self.decode)

    def decode_steps_s(self, contexts: np.ndarray, steps: int,
                       kv_read_saved_bytes: float = 0.0) -> np.ndarray:
        return self.inner.decode_steps_s(contexts, steps, kv_read_saved_bytes) * self.decode

    def decode_steps_list(self, contexts: Sequence[int], steps: int,
                          kv_read_saved_bytes: float = 0.0) -> list[float] | None:
        base = self.inner.decode_steps_list(contexts, steps, kv_read_saved_bytes)
        return None if base is None else [d * self.decode for d in base]
