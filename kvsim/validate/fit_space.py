"""The fit's parameter space: which constants a set of rows can fit, as a vector of logs
and back to :class:`~kvsim.latency.backend.SpeedConstants`, and the physical defaults
(:data:`PRIOR`) it leans towards (kvsim.validate.fit: the fit itself)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvsim.latency.backend import (
    FORMAT_FAMILIES,
    BackendConstants,
    ClassScale,
    SpeedConstants,
    arch_class,
    memory_kind,
    vendor_class,
)

if TYPE_CHECKING:
    from kvsim.validate.fit import Row


PRIOR = {"bw_eff": 0.8, "kv_eff": 0.7, "kv_eff_no_fa": 0.5, "c_vec": 1.0, "c_mat": 1.0,
         "c_pow_pj": 1.0, "attn_eff": 0.6, "attn_eff_no_fa": 0.4, "overhead_s": 5e-4,
         "overhead_per_layer_s": 2e-5, "moe_eff": 0.5, "launch_per_layer_s": 5e-5,
         "attn_eff_rows": 0.3, "pp_reread": 1.0 / 128, "c_small": 1.0, "tile_tokens": 64.0}
"""Physical defaults the fit starts from and leans towards (weakly, :data:`PRIOR_WEIGHT`):
weights stream at ~80 % of peak bandwidth, flash-attention kernels reach ~60 % of the
matmul rate and read KV at ~70 % (less without flash attention), each FLOP costs ~1 pJ
at the power limit, a step ~0.5 ms plus ~20 µs per layer of launches (~50 µs more per
layer on CUDA where a step is not a captured graph: some 20 kernels a layer at a few µs
of launch each), MoE matmuls half the dense rate, and a per-row attention kernel (decode)
half the flash-attention rate; a prefill re-reads its weights once per 128-token tile
(llama.cpp's MMQ tiles are at most 128 tokens wide) with no help from the cache; a step
of 2 to 8 tokens (matrix-vector kernels) dequantises and multiplies at the vector ALUs'
peak, one pass per token, after the weight read; a tiled step pays half a 128-token
tile's compute once (``tile_tokens``: the shared files, all at 512-token micro-batches,
hardly move it; 64 was picked on docs/reference/measurements-prs' micro-batch sweeps,
docs/design/speed-model.md)."""
PRIOR_WEIGHT = 0.05
DEVIATION_WEIGHT = 0.5   # a class's or a backend's format departure from the shared value
FITTED_MEMORY_KINDS = ("hbm",)
"""Memory kinds with a bandwidth factor of their own (GDDR is the reference): HBM parts
reach a smaller share of their peak at one token than GDDR ones (a matrix-vector product
keeps too few reads in flight for the wide stacks). LPDDR and DDR share GDDR's factor: a
fitted LPDDR factor came out above 1 — confounded with the backends, since Apple's Metal
has no GDDR part to tell the two apart — and carried from Strix Halo to DGX Spark on CUDA
as a 16–24 % too fast decode (docs/design/speed-model.md)."""
SHARED_FALLBACK = {"SYCL": "Vulkan", "default": "Vulkan"}
"""Backends with no rows of their own borrow a fitted one's constants (Intel's SYCL
path and anything unnamed: Vulkan, the portable backend)."""
LOW, HIGH = -14.0, 6.0  # bounds of every log-constant
KEYS = tuple(PRIOR)


class FitSpace:
    """The fitted parameters as a vector of logs, and back to SpeedConstants.

    ``prior``: the constants the fit leans towards and keeps for whatever its rows do
    not fit (formats, backends and classes they lack); None: :data:`PRIOR` for every
    backend, factor 1 for every format."""

    def __init__(self, rows: Sequence[Row], prior: SpeedConstants | None = None) -> None:
        self.prior = prior
        self.backends = sorted({r.setup.backend for r in rows})
        self.fams = sorted({r.family for r in rows} - {"f16"})
        self.classes = _with_two_devices(rows, lambda r: arch_class(r.setup.gpu,
                                                                    r.setup.backend)) \
            + _vendor_classes(rows)
        self.pairs = [p for p in _with_two_devices(rows, lambda r: f"{r.setup.backend}:"
                                                   f"{r.family}") if len(self.backends) > 1]
        kinds = _with_two_devices(rows, lambda r: f"mem:{memory_kind(r.setup.gpu)}")
        self.kinds = [k.partition(":")[2] for k in kinds
                      if k.partition(":")[2] in FITTED_MEMORY_KINDS]
        self.names = [f"{b}.{k}" for b in self.backends for k in KEYS] \
            + [f"mem.{m}" for m in self.kinds] \
            + [f"fmt_bw.{f}" for f in self.fams] + [f"fmt_pp.{f}" for f in self.fams] \
            + [f"dev_bw.{p}" for p in self.pairs] + [f"dev_pp.{p}" for p in self.pairs] \
            + [f"cls.{c}.{k}" for c in self.classes for k in ("pp_scale", "bw_scale")]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.x_prior = self.vector(prior)
        self.weights = np.array([DEVIATION_WEIGHT if n.startswith(("cls.", "dev_", "mem."))
                                 else PRIOR_WEIGHT for n in self.names])

    def vector(self, k: SpeedConstants | None) -> np.ndarray:
        """``k`` (None: the physical defaults) as this space's vector of logs."""
        x = np.zeros(len(self.names))
        for i, n in enumerate(self.names):
            head, _, key = n.partition(".")
            if head in ("fmt_bw", "fmt_pp"):
                table = {} if k is None else (k.format_bw if head == "fmt_bw" else k.format_pp)
                x[i] = math.log(table.get(key, 1.0))
            elif head in ("dev_bw", "dev_pp") and k is not None:
                table = k.format_bw if head == "dev_bw" else k.format_pp
                fam = key.partition(":")[2]
                x[i] = math.log(table.get(key, table.get(fam, 1.0)) / table.get(fam, 1.0))
            elif head == "mem":
                x[i] = math.log(1.0 if k is None else k.memory_bw.get(key, 1.0))
            elif head == "cls":
                cls, _, attr = key.rpartition(".")
                scale = ClassScale() if k is None else k.classes.get(cls, ClassScale())
                x[i] = math.log(getattr(scale, attr))
            elif head in self.backends:
                has = k is not None and (head in k.backends or "default" in k.backends)
                value = getattr(k.backend(head), key) if has else PRIOR[key]
                x[i] = math.log(value if value > 0 else PRIOR[key])
        return np.clip(x, LOW, HIGH)

    def constants(self, x: np.ndarray, fitted_on: str = "") -> SpeedConstants:
        v = dict(zip(self.names, np.exp(x)))
        base = self.prior
        backends = dict(base.backends) if base else {}
        # NOTE: the launch overhead exists on CUDA only (cuda_graphs): 0 elsewhere
        # NOTE: c_dp4a is no parameter here (kvsim.validate.fit: a stage of its own):
        # the prior's value is kept
        backends.update({b: BackendConstants(**{k: float(v[f"{b}.{k}"]) if b == "CUDA" or
                                                k != "launch_per_layer_s" else 0.0
                                                for k in KEYS},
                                             c_dp4a=base.backends[b].c_dp4a
                                             if base and b in base.backends else 0.0)
                         for b in self.backends})
        for alias, src in SHARED_FALLBACK.items():
            if alias not in backends and src in backends:
                backends[alias] = backends[src]
        tables = {}
        for head, dev in (("fmt_bw", "dev_bw"), ("fmt_pp", "dev_pp")):
            old = (base.format_bw if head == "fmt_bw" else base.format_pp) if base else {}
            # NOTE: a family neither fitted nor in the prior is left out, so its
            # factors fall back (SpeedConstants.format_factors: PP_FALLBACK, else 1)
            t = {f: float(v.get(f"{head}.{f}", old.get(f, 1.0))) for f in FORMAT_FAMILIES
                 if f == "f16" or f"{head}.{f}" in v or f in old}
            # NOTE: a backend's factor is its deviation times the shared one: a prior's
            # deviation that is not refitted keeps its ratio to the refitted shared value
            for key, val in old.items():
                fam = key.partition(":")[2]
                if fam and key not in self.pairs:
                    t[key] = t.get(fam, 1.0) * val / old.get(fam, 1.0)
            t.update({p: t[p.partition(":")[2]] * float(v[f"{dev}.{p}"]) for p in self.pairs})
            tables[head] = t
        classes = dict(base.classes) if base else {}
        classes.update({c: ClassScale(pp_scale=float(v[f"cls.{c}.pp_scale"]),
                                      bw_scale=float(v[f"cls.{c}.bw_scale"]))
                        for c in self.classes})
        mem = {**(base.memory_bw if base else {}),
               **{m: float(v[f"mem.{m}"]) for m in self.kinds}}
        return SpeedConstants(backends=backends, format_bw=tables["fmt_bw"],
                              format_pp=tables["fmt_pp"], classes=classes, memory_bw=mem,
                              fitted_on=fitted_on)


def _vendor_classes(rows: Sequence[Row]) -> list[str]:
    """Vendor classes of backends whose rows come from 2+ vendors (else the backend's
    own constants are that vendor's), each with 2+ devices."""
    vendors: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        vendors[r.setup.backend].add(r.setup.gpu.vendor.lower())
    multi = [r for r in rows if len(vendors[r.setup.backend]) > 1]
    return _with_two_devices(multi, lambda r: vendor_class(r.setup.gpu, r.setup.backend))


def _with_two_devices(rows: Sequence[Row], key) -> list[str]:  # type: ignore[no-untyped-def]
    devs: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        devs[key(r)].add(r.device)
    return sorted(c for c, d in devs.items() if len(d) >= 2 and ":" in c)
