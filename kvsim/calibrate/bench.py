"""Calibrate from llama-bench: fit one card's speed constants from its own measurements.

``kvsim calibrate bench FILE...`` reads llama-bench / llama-batched-bench output
(:mod:`kvsim.validate.llamabench`) measured on the user's card and fits that card's
:class:`~kvsim.latency.backend.BackendConstants` with the same least-squares fit the
shipped constants come from (:func:`kvsim.validate.fit.fit_constants`), leaning
towards the shipped constants of its backend so that what the runs cannot separate
(one model size cannot split fixed from per-layer overhead) stays as fitted on many
cards.  The result is a :class:`~kvsim.latency.bench_artifact.BenchArtifact` (JSON)
that a scenario uses as ``latency: {kind: calibrated, path: ...}`` and
``kvsim validate --calibration`` reads.

A caller must know: the artifact stores the device spec it was fitted against (the
catalogue's card, or for a CPU run a spec made from the host profile:
:func:`kvsim.validate.names.cpu_device`); predictions scale that spec by the fitted
constants, so the card's spec numbers only need to be the same at fitting and
prediction time, not exact.

NOTE: the constants are the card's, not the model's: the artifact predicts other
models and weight formats on the same card through the roofline's bytes and FLOPs.
"""

from __future__ import annotations

import numpy as np

from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.errors import InputError
from kvsim.latency.backend import load_constants
from kvsim.latency.bench_artifact import BenchArtifact
from kvsim.validate.fit import fit_constants, log_errors, make_row
from kvsim.validate.predict import setup_with
from kvsim.validate.records import Measurement, Skipped


def fit_bench(measurements: list[Measurement], *, device: GpuSpec, model: ModelSpec,
              sources: tuple[str, ...] = ()) -> BenchArtifact:
    """Fit ``device``'s constants on measurements of ``model`` (one backend)."""
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
