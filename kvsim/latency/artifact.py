"""The calibration artifact: what a harness run measured, and the latency fit made from it.

One versioned JSON file per device × model (``calibration/DEVICE__MODEL.json``), referenced
with ``latency: {kind: calibrated, path: ...}``: where it was measured, the raw timing points,
measured KV bytes, bandwidths and quantization costs, per cache dtype the fitted step-time
coefficients with their MAPE and validity ranges, and the limits a run reached. The step-time
model is linear in nine non-negative coefficients over :func:`step_features` (prefill chunks
shorter than ``small_chunk_tokens`` get their own attention coefficient; a decode step of
two or more sequences pays ``decode_multi`` once).

NOTE: artifacts are frozen pydantic models; unknown keys are rejected and the format version
is checked on load, so an old artifact fails loudly instead of mis-predicting.
Design: docs/design/calibration.md (the model's features and the measured kernel switch).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvsim.errors import InputError, from_validation_error

ARTIFACT_VERSION = 1
FEATURES: tuple[str, ...] = (
    "step", "prefill_seq", "prefill_token", "prefill_attn", "prefill_attn_small",
    "decode_seq", "decode_multi", "decode_kv", "decode_kv_spill")
_FROZEN = ConfigDict(frozen=True, extra="forbid")


class TimingPoint(BaseModel):
    """One measurement: ``steps`` consecutive steps of the same shape family.

    ``kind="prefill"``: ``batch`` sequences each compute ``tokens`` new tokens on top of
    ``context`` cached ones, in ``steps`` chunk-steps (``tokens`` split evenly).
    ``kind="decode"``: ``batch`` sequences, each starting at ``context`` tokens, decode
    ``steps`` tokens one step at a time (context grows by one per step).
    ``measured_s`` is the total wall time of those steps.
    NOTE: with ``ubatch_tokens``, a chunk-step's features are those of its graphs, each a
    one-graph step (:func:`point_features`), as the calibrated model prices a step the
    engine splits (kvsim.latency.calibrated).
    """

    model_config = _FROZEN
    kind: Literal["prefill", "decode"]
    cache_type: str
    batch: int = Field(gt=0)
    context: int = Field(ge=0)
    tokens: int = Field(0, ge=0, description="prefill tokens per sequence (prefill only)")
    steps: int = Field(1, gt=0)
    measured_s: float = Field(gt=0)
    repeats: int = Field(1, gt=0, description="measurements the median was taken over")
    ubatch_tokens: int = Field(0, ge=0, description="prefill only: the engine ran each "
                               "chunk-step as graphs of at most this many tokens "
                               "(llama.cpp's n_ubatch); 0 = one graph a chunk-step")


class FeatureRange(BaseModel):
    model_config = _FROZEN
    min: float
    max: float


class LatencyFit(BaseModel):
    """Fitted step-time coefficients for one KV cache dtype."""

    model_config = _FROZEN
    cache_type: str
    coefficients_s: dict[str, float] = Field(description="feature name → seconds per unit")
    mape: float = Field(ge=0, description="mean absolute percentage error over the points")
    max_ape: float = Field(ge=0)
    points: int = Field(gt=0)
    valid: dict[str, FeatureRange] = Field(description="per-step feature ranges measured")
    max_context: int = Field(ge=0, description="largest context per sequence measured")
    max_batch: int = Field(gt=0, description="largest number of sequences in a step measured")
    small_chunk_tokens: int = Field(0, ge=0, description="prefill chunks shorter than this "
                                    "count their attention in prefill_attn_small; 0 = none")
    decode_spread: tuple[float, ...] = Field(
        (), description="quantiles (q = 0, 1/(n-1), …, 1) of each measured decode step's "
        "time over the fitted one: the device's step-to-step spread; () = none measured")
    prefill_spread: tuple[float, ...] = Field(
        (), description="quantiles (as decode_spread) of each measured time to first token "
        "over its point's typical one; () = none measured")
    after_prompt_s: tuple[float, ...] = Field(
        (), description="seconds the k-th decode step after a step that computed prompt "
        "tokens takes above a steady one (k = 0, 1, …); () = none measured")
    kv_knee_tokens: int = Field(0, ge=0, description="a decode step's KV tokens beyond "
                                "this many also cost decode_kv_spill each; 0 = no knee")

    @model_validator(mode="before")
    @classmethod
    def _older_features(cls, raw: Any) -> Any:
        """Artifacts written before a feature existed: its coefficient and range are 0
        (before the short-chunk split, A_small; before the knee, the KV spill; before
        the multi-sequence step, decode_multi)."""
        for name in ("prefill_attn_small", "decode_multi", "decode_kv_spill"):
            if isinstance(raw, dict) and name not in raw.get("coefficients_s", {}):
                raw = {**raw, "coefficients_s": {**raw.get("coefficients_s", {}), name: 0.0}}
                if isinstance(raw.get("valid"), dict):
                    raw["valid"] = {**raw["valid"], name: {"min": 0.0, "max": 0.0}}
        return raw

    def step_features(self, prefill_tokens: np.ndarray, prefill_context: np.ndarray,
                      decode_context: np.ndarray) -> np.ndarray:
        """:func:`step_features` of one step with this fit's chunk split and knee."""
        return step_features(prefill_tokens, prefill_context, decode_context,
                             self.small_chunk_tokens, self.kv_knee_tokens)


class KvBytes(BaseModel):
    model_config = _FROZEN
    cache_type: str
    tensor_bytes_per_token: float = Field(description="all layers, from the stored tensors")
    formula_bytes_per_token: float = Field(description="kv geometry formula, all layers")
    allocated_bytes_per_token: float | None = None
    reserved_bytes_per_token: float | None = None


class QuantCost(BaseModel):
    model_config = _FROZEN
    cache_type: str
    quantize_s_per_token: float = Field(ge=0, description="per token, all layers")
    dequantize_s_per_token: float = Field(ge=0, description="per token, all layers")
    attention_rel_error: float = Field(ge=0, description="‖o_q − o_ref‖ / ‖o_ref‖")


class Bandwidth(BaseModel):
    model_config = _FROZEN
    direction: Literal["h2d", "d2h", "memcpy"]
    pinned: bool
    bytes: int = Field(gt=0)
    bytes_per_s: float = Field(gt=0)


class LimitReached(BaseModel):
    model_config = _FROZEN
    what: str = Field(description="grid point or stage that failed")
    error: str


class CalibrationArtifact(BaseModel):
    """The whole artifact (``format_version`` guards the layout)."""

    model_config = _FROZEN
    format_version: Literal[1] = ARTIFACT_VERSION
    source: Literal["kernels", "engine"]
    device: str = Field(description="e.g. 'cpu' or 'cuda:0 NVIDIA GeForce RTX 4090'")
    model: str
    software: dict[str, str] = Field(default_factory=dict)
    created_utc: str = ""
    layers_built: int | None = Field(None, description="kernels: layers instantiated")
    layers_total: int | None = None
    grid: dict[str, list[int | str]] = Field(default_factory=dict)
    settings: dict[str, float | int | str | bool] = Field(default_factory=dict)
    points: tuple[TimingPoint, ...]
    fits: dict[str, LatencyFit]
    kv_bytes: tuple[KvBytes, ...] = ()
    quant: tuple[QuantCost, ...] = ()
    bandwidth: tuple[Bandwidth, ...] = ()
    limits_reached: tuple[LimitReached, ...] = ()

    def fit_for(self, cache_type: str) -> LatencyFit:
        if cache_type not in self.fits:
            raise InputError("latency.cache_type", cache_type,
                             "not measured in this artifact; measured: "
                             + ", ".join(sorted(self.fits)))
        return self.fits[cache_type]


def kv_spill(kv_tokens: np.ndarray | float, kv_knee_tokens: int) -> np.ndarray | float:
    """A decode step's KV tokens beyond the knee (0 without one): ``decode_kv_spill``.

    NOTE: with the KV tokens clamped to the measured maximum first, this equals the
    spill clamped to its own measured maximum (the calibrated model relies on it)."""
    if kv_knee_tokens <= 0:
        return np.zeros_like(kv_tokens) if isinstance(kv_tokens, np.ndarray) else 0.0
    return np.maximum(kv_tokens - kv_knee_tokens, 0.0)


def decode_multi(sequences: int) -> float:
    """The ``decode_multi`` feature of a step decoding ``sequences`` sequences: 1 for two
    or more.

    NOTE: on llama-server's CPU backend the second decoding slot cost ~1.4 ms a step and
    each one after it ~0.25 ms (docs/design/timing-noise.md, "Two slots cost more than
    twice one"); a linear ``decode_seq`` alone priced two slots 30 % short."""
    return float(sequences >= 2)


def step_features(prefill_tokens: np.ndarray, prefill_context: np.ndarray,
                  decode_context: np.ndarray, small_chunk_tokens: int = 0,
                  kv_knee_tokens: int = 0) -> np.ndarray:
    """Feature vector (in :data:`FEATURES` order) of one engine step (``decode_multi``:
    :func:`decode_multi`)."""
    p = np.asarray(prefill_tokens, dtype=float)
    c = np.asarray(prefill_context, dtype=float)
    d = np.asarray(decode_context, dtype=float)
    attn = p * (c + p / 2.0)
    small = p < small_chunk_tokens
    kv = float(d.sum())
    return np.array([1.0, float(p.size), p.sum(), attn[~small].sum(), attn[small].sum(),
                     float(d.size), decode_multi(d.size), kv,
                     float(kv_spill(kv, kv_knee_tokens))])


def point_features(pt: TimingPoint, small_chunk_tokens: int = 0,
                   kv_knee_tokens: int = 0) -> np.ndarray:
    """Summed features of all steps of a point (the model is linear, so sums add); a
    prefill chunk-step the engine split (``ubatch_tokens``) adds its graphs' features."""
    b, s = pt.batch, pt.steps
    if pt.kind == "prefill":
        chunk = pt.tokens / s
        if pt.ubatch_tokens and b * chunk > pt.ubatch_tokens:
            return _graph_features(pt, small_chunk_tokens)
        return _chunk_features(pt, small_chunk_tokens)
    kv = decode_step_kv(pt)
    return np.array([s, 0.0, 0.0, 0.0, 0.0, b * s, s * decode_multi(b), kv.sum(),
                     kv_spill(kv, kv_knee_tokens).sum()])


def _chunk_features(pt: TimingPoint, small_chunk_tokens: int) -> np.ndarray:
    """A prefill point's features with each chunk-step one graph."""
    b, s = pt.batch, pt.steps
    chunk = pt.tokens / s
    ctx = pt.context + chunk * np.arange(s)
    attn = b * (chunk * (ctx + chunk / 2.0)).sum()
    small = chunk < small_chunk_tokens
    return np.array([s, b * s, b * pt.tokens, 0.0 if small else attn,
                     attn if small else 0.0, 0.0, 0.0, 0.0, 0.0])


def _graph_features(pt: TimingPoint, small_chunk_tokens: int) -> np.ndarray:
    """A prefill point's features with each chunk-step cut into graphs of at most
    ``ubatch_tokens`` tokens, each sequence's piece ``ubatch_tokens // batch`` at most,
    each graph a one-graph step.

    NOTE: kvsim.engines.llama_cpp.llama_ubatches' split for ``batch`` equal sequences on
    consecutive slots (pinned by tests/calibrate/test_ubatch_points.py); restated here on
    fractional chunks rather than imported: this data module knows no engine."""
    b, s = pt.batch, pt.steps
    chunk = pt.tokens / s
    most = max(pt.ubatch_tokens // b, 1)
    out = np.zeros(len(FEATURES))
    for k in range(s):
        done = 0.0
        while done < chunk:
            piece = min(float(most), chunk - done)
            out += step_features(np.full(b, piece), np.full(b, pt.context + chunk * k + done),
                                 np.empty(0), small_chunk_tokens)
            done += piece
    return out


def decode_step_kv(pt: TimingPoint) -> np.ndarray:
    """The KV tokens each step of a decode point reads (empty for a prefill point)."""
    if pt.kind != "decode":
        return np.empty(0)
    return pt.batch * (pt.context + np.arange(pt.steps, dtype=float))


def point_step_ranges(pt: TimingPoint, small_chunk_tokens: int = 0, kv_knee_tokens: int = 0
                      ) -> dict[str, tuple[float, float]]:
    """Per-step feature ranges a point covers (for the validity range).

    NOTE: a chunk-step the engine split into graphs (``ubatch_tokens``) counts whole: its
    graphs' features lie inside it, and a scheduler without ubatches prices it whole."""
    if pt.kind == "decode":
        kv = decode_step_kv(pt)
        lo, hi = int(kv[0]), int(kv[-1])
        multi = decode_multi(pt.batch)
        return {"prefill_seq": (0, 0), "prefill_token": (0, 0), "prefill_attn": (0, 0),
                "prefill_attn_small": (0, 0), "decode_seq": (pt.batch, pt.batch),
                "decode_multi": (multi, multi),
                "decode_kv": (lo, hi), "decode_kv_spill": (kv_spill(lo, kv_knee_tokens),
                                                           kv_spill(hi, kv_knee_tokens))}
    f = _chunk_features(pt, small_chunk_tokens) / pt.steps
    return {"prefill_seq": (f[1], f[1]), "prefill_token": (f[2], f[2]),
            "prefill_attn": (f[3], f[3]), "prefill_attn_small": (f[4], f[4]),
            "decode_seq": (0, 0), "decode_multi": (0, 0), "decode_kv": (0, 0),
            "decode_kv_spill": (0, 0)}


def load_artifact(path: str | Path) -> CalibrationArtifact:
    """Read and validate an artifact; errors name the file and the field."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError("latency.path", str(p), f"cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise InputError("latency.path", str(p), f"not JSON (line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise InputError("latency.path", str(p), "not a calibration artifact")
    version = raw.get("format_version")
    if version != ARTIFACT_VERSION:
        raise InputError("format_version", version,
                         f"this kvsim reads calibration format {ARTIFACT_VERSION}")
    try:
        return CalibrationArtifact.model_validate(raw)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=p.name) from None


def save_artifact(artifact: CalibrationArtifact, path: str | Path) -> Path:
    """Write atomically (temp file + ``os.replace``)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(artifact.model_dump_json(indent=1))
            fh.write("\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
