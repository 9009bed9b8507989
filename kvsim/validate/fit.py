"""Fit the backend speed constants on measurements, and leave-one-device-out errors.

:func:`fit_constants` finds the :class:`SpeedConstants` that minimise the squared log
error of predicted vs measured tokens/s (``scipy.optimize.least_squares``), with a
weak pull of every constant towards a physical default (so a backend whose rows
cannot separate two constants — one model size, say — keeps a sensible split):

- per backend: the nine :class:`BackendConstants`;
- shared by every backend: the weight formats' streaming and prefill factors (F16 = 1);
- per architecture class with rows from 2+ devices: a prefill and a bandwidth scale.

:func:`leave_one_device_out` refits without each device in turn and predicts it: the
error a card that is in no file would see.

NOTE: predictions go through :func:`kvsim.latency.backend.gpu_rates` and the roofline's
own :meth:`gpu_parts` — the same arithmetic as ``kvsim validate`` and the simulator,
so the fitted constants mean the same thing everywhere.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from kvsim.latency.backend import (
    FORMAT_FAMILIES, BackendConstants, ClassScale, SpeedConstants, arch_class, format_family,
    gpu_rates)
from kvsim.errors import InputError
from kvsim.latency.roofline import GpuRates
from kvsim.validate.predict import Setup, latency_for, step_batches, tokens_measured
from kvsim.validate.records import Measurement

PRIOR = {"bw_eff": 0.8, "kv_eff": 0.5, "kv_eff_no_fa": 0.4, "c_vec": 1.0, "c_mat": 1.0,
         "attn_eff": 0.3, "attn_eff_no_fa": 0.2, "overhead_s": 5e-4,
         "overhead_per_layer_s": 2e-5}
"""Physical defaults the fit starts from and leans towards (weakly, :data:`PRIOR_WEIGHT`)."""
PRIOR_WEIGHT = 0.05
CLASS_WEIGHT = 0.5
SHARED_FALLBACK = {"SYCL": "Vulkan", "default": "Vulkan"}
"""Backends with no rows of their own borrow a fitted one's constants (Intel's SYCL
path and anything unnamed: Vulkan, the portable backend)."""
LOW, HIGH = -14.0, 6.0  # bounds of every log-constant


@dataclass(frozen=True)
class Row:
    """One measurement with its resolved setup and unpriced step terms."""

    m: Measurement
    setup: Setup
    parts: np.ndarray   # (steps, 4): linear FLOPs, attention FLOPs, weight bytes, KV bytes
    tokens: int

    @property
    def device(self) -> str:
        return self.setup.gpu.name


def make_row(m: Measurement, s: Setup) -> Row:
    unit = latency_for(s, rates=GpuRates(1.0, 1.0, 1.0, 1.0, 0.0))
    parts = np.array([unit.gpu_parts(b) for b in step_batches(m)], dtype=np.float64)
    return Row(m, s, parts, tokens_measured(m))


class _Space:
    """The fitted parameters as a vector of logs, and back to SpeedConstants.

    ``prior``: the constants the fit leans towards and keeps for whatever its rows do
    not fit (formats, backends and classes they lack); None: :data:`PRIOR` for every
    backend, factor 1 for every format."""

    def __init__(self, rows: Sequence[Row], prior: SpeedConstants | None = None) -> None:
        self.prior = prior
        self.backends = sorted({r.setup.backend for r in rows})
        fams = sorted({format_family(r.setup.weight_format) for r in rows} - {"f16"})
        devs: dict[str, set[str]] = defaultdict(set)
        for r in rows:
            devs[arch_class(r.setup.gpu, r.setup.backend)].add(r.device)
        self.classes = sorted(c for c, d in devs.items() if len(d) >= 2 and ":" in c)
        self.names = [f"{b}.{k}" for b in self.backends for k in PRIOR] \
            + [f"fmt_bw.{f}" for f in fams] + [f"fmt_pp.{f}" for f in fams] \
            + [f"cls.{c}.{k}" for c in self.classes for k in ("pp_scale", "bw_scale")]
        self.x_prior = self.vector(prior)

    def vector(self, k: SpeedConstants | None) -> np.ndarray:
        """``k`` (None: the physical defaults) as this space's vector of logs."""
        x = np.zeros(len(self.names))
        for i, n in enumerate(self.names):
            head, _, key = n.partition(".")
            if head in ("fmt_bw", "fmt_pp"):
                table = {} if k is None else (k.format_bw if head == "fmt_bw" else k.format_pp)
                x[i] = math.log(table.get(key, 1.0))
            elif head == "cls":
                cls, _, attr = key.rpartition(".")
                scale = ClassScale() if k is None else k.classes.get(cls, ClassScale())
                x[i] = math.log(getattr(scale, attr))
            elif k is not None and (head in k.backends or "default" in k.backends):
                x[i] = math.log(getattr(k.backend(head), key))
            else:
                x[i] = math.log(PRIOR[key])
        return np.clip(x, LOW, HIGH)

    def prior_residuals(self, x: np.ndarray) -> np.ndarray:
        w = np.array([CLASS_WEIGHT if n.startswith("cls.") else PRIOR_WEIGHT
                      for n in self.names])
        return w * (x - self.x_prior)

    def constants(self, x: np.ndarray, fitted_on: str = "") -> SpeedConstants:
        v = dict(zip(self.names, np.exp(x)))
        base = self.prior
        backends = dict(base.backends) if base else {}
        backends.update({b: BackendConstants(**{k: float(v[f"{b}.{k}"]) for k in PRIOR})
                         for b in self.backends})
        for alias, src in SHARED_FALLBACK.items():
            if alias not in backends and src in backends:
                backends[alias] = backends[src]
        fmt_bw = {f: float(v.get(f"fmt_bw.{f}", base.format_bw.get(f, 1.0) if base else 1.0))
                  for f in FORMAT_FAMILIES}
        fmt_pp = {f: float(v.get(f"fmt_pp.{f}", base.format_pp.get(f, 1.0) if base else 1.0))
                  for f in FORMAT_FAMILIES}
        classes = dict(base.classes) if base else {}
        classes.update({c: ClassScale(pp_scale=float(v[f"cls.{c}.pp_scale"]),
                                      bw_scale=float(v[f"cls.{c}.bw_scale"]))
                        for c in self.classes})
        return SpeedConstants(backends=backends, format_bw=fmt_bw, format_pp=fmt_pp,
                              classes=classes, fitted_on=fitted_on)


def row_seconds(r: Row, k: SpeedConstants) -> float:
    """The measured test's predicted time under constants ``k``."""
    s = r.setup
    g = gpu_rates(s.gpu, s.model, s.weight_format, backend=s.backend, flash_attn=s.flash_attn,
                  constants=k)
    p = r.parts
    compute = p[:, 0] / g.linear_flops_per_s + p[:, 1] / g.attention_flops_per_s
    memory = p[:, 2] / g.weight_bytes_per_s + p[:, 3] / g.kv_bytes_per_s
    return float(np.sum(g.overhead_s + np.maximum(compute, memory)))


def log_errors(rows: Sequence[Row], k: SpeedConstants) -> np.ndarray:
    """log(predicted / measured) tokens/s per row."""
    return np.array([math.log(r.tokens / row_seconds(r, k) / r.m.value) for r in rows])


def fit_constants(rows: Sequence[Row], *, prior: SpeedConstants | None = None,
                  start: SpeedConstants | None = None, fitted_on: str = "",
                  max_nfev: int | None = None) -> SpeedConstants:
    """Least-squares constants for ``rows`` (module docstring), leaning towards
    ``prior`` (None: the physical defaults), starting from ``start`` (default: the
    prior)."""
    if not rows:
        raise InputError("measurements", "none", "at least one predictable row to fit on")
    space = _Space(rows, prior)
    x0 = space.x_prior if start is None else space.vector(start)

    def resid(x: np.ndarray) -> np.ndarray:
        return np.concatenate([log_errors(rows, space.constants(x)), space.prior_residuals(x)])

    sol = least_squares(resid, x0, method="trf", x_scale=1.0, max_nfev=max_nfev,
                        bounds=(np.full(len(x0), LOW), np.full(len(x0), HIGH)))
    return space.constants(sol.x, fitted_on)


def leave_one_device_out(rows: Sequence[Row], full: SpeedConstants,
                         max_nfev: int = 60) -> dict[str, float]:
    """Row id -> log error when its device was left out of the fit."""
    out: dict[str, float] = {}
    for dev in sorted({r.device for r in rows}):
        train = [r for r in rows if r.device != dev]
        test = [r for r in rows if r.device == dev]
        k = fit_constants(train, start=full, max_nfev=max_nfev)
        for r in test:
            if r.setup.backend not in k.backends and "default" not in k.backends:
                continue
            out[r.m.id] = float(log_errors([r], k)[0])
    return out
