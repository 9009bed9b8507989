"""Calibrate from llama-bench: fit one card's speed constants from its own measurements.

``kvsim calibrate bench FILE...`` reads llama-bench / llama-batched-bench output
(:mod:`kvsim.validate.llamabench`) measured on the user's card and fits that card's
:class:`~kvsim.latency.backend.BackendConstants` with the same least-squares fit the
shipped constants come from (:func:`kvsim.validate.fit.fit_constants`), leaning
towards the shipped constants of its backend so that what the runs cannot separate
(one model size cannot split fixed from per-layer overhead) stays as fitted on many
cards.  The result is a :class:`BenchArtifact` (JSON) that a scenario uses as
``latency: {kind: calibrated, path: ...}`` and ``kvsim validate --calibration`` reads.

A caller must know: the artifact stores the device spec it was fitted against (the
catalogue's card, or for a CPU run a spec made from the host profile); predictions
scale that spec by the fitted constants, so the card's spec numbers only need to be
the same at fitting and prediction time, not exact.

NOTE: the constants are the card's, not the model's: the artifact predicts other
models and weight formats on the same card through the roofline's bytes and FLOPs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, ValidationError

from kvsim.config.specs import GpuSpec, HostSpec, ModelSpec
from kvsim.config.units import FrozenModel
from kvsim.errors import InputError, from_validation_error
from kvsim.latency.backend import SpeedConstants, load_constants
from kvsim.validate.records import Measurement, Skipped

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


def cpu_device(host: HostSpec) -> GpuSpec:
    """The device spec of a CPU-only llama.cpp run: the host's memory and FLOP rates."""
    return GpuSpec(name=f"cpu-{host.name}", display_name=f"CPU ({host.display_name})",
                   vendor="CPU", segment="cpu", memory_bytes=host.memory_bytes,
                   memory_bandwidth_bytes_per_s=host.memory_bandwidth_bytes_per_s,
                   fp16_tensor_flops=host.cpu_flops, fp16_fp32acc_tensor_flops=host.cpu_flops,
                   fp32_flops=host.cpu_flops, unified_memory=True, architecture="cpu",
                   source=f"host profile {host.name} ({host.source})")


def fit_bench(measurements: list[Measurement], *, device: GpuSpec, model: ModelSpec,
              sources: tuple[str, ...] = ()) -> BenchArtifact:
    """Fit ``device``'s constants on measurements of ``model`` (one backend)."""
    from kvsim.validate.fit import fit_constants, log_errors, make_row
    from kvsim.validate.predict import setup_with

    rows, skipped = [], []
    for m in measurements:
        s = setup_with(m, device, model)
        if isinstance(s, Skipped):
            skipped.append(f"{s.id}: {s.reason}")
        else:
            rows.append(make_row(m, s))
    backends = sorted({r.setup.backend for r in rows})
    if len(backends) != 1:
        raise InputError("FILE", ", ".join(sources) or "measurements",
                         f"runs of one backend on one card (found {backends or 'none'} "
                         f"among {len(rows)} usable rows)")
    k = fit_constants(rows, prior=load_constants(),
                      fitted_on=f"{len(rows)} llama-bench rows on {device.name}")
    err = np.abs(np.expm1(log_errors(rows, k)))
    return BenchArtifact(device=device, backend=backends[0], model=model.name,
                         weights=tuple(sorted({r.setup.weight_format for r in rows})),
                         constants=k, rows=len(rows),
                         fit_abs_rel_err={"median": float(np.median(err)),
                                          "max": float(err.max())},
                         sources=sources, skipped=tuple(skipped))


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
