"""A card's speed constants fitted from llama-bench output: the bench artifact, as the
latency model reads it.

``kvsim calibrate bench`` (:mod:`kvsim.calibrate.bench`) writes one; a scenario uses it
as ``latency: {kind: calibrated, path: ...}`` (:func:`kvsim.latency.factory.bench_latency`)
and ``kvsim validate --calibration`` reads it.  :func:`is_bench_artifact` tells it from a
torch-harness artifact (:mod:`kvsim.latency.artifact`) at the same place.

NOTE: the artifact stores the device spec it was fitted against; predictions scale that
spec by the fitted constants, so the spec only needs to be the same at fitting and at
prediction time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, ValidationError

from kvsim.config.specs import GpuSpec
from kvsim.config.units import FrozenModel
from kvsim.errors import InputError, from_validation_error
from kvsim.latency.backend import SpeedConstants

ARTIFACT_KIND = "llama-bench"


class BenchArtifact(FrozenModel):
    """One card's fitted speed constants and what they were fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["llama-bench"] = "llama-bench"
    version: int = 1
    device: GpuSpec
    backend: str
    model: str
    weights: tuple[str, ...]
    constants: SpeedConstants
    rows: int
    fit_abs_rel_err: dict[str, float]
    sources: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


def is_bench_artifact(path: str | Path) -> bool:
    """Whether a calibration file is a llama-bench artifact (not a torch-harness one)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("kind") == ARTIFACT_KIND


def load_bench_artifact(path: str | Path) -> BenchArtifact:
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError("latency.path", str(path), f"cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise InputError("latency.path", str(path), f"not JSON ({exc})") from None
    try:
        return BenchArtifact.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=f"calibration '{path}'") from None


def save_bench_artifact(art: BenchArtifact, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(art.model_dump_json(indent=1), encoding="utf-8")
    tmp.replace(p)
    return p
