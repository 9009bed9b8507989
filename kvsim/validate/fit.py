"""Fit the backend speed constants on measurements, and leave-one-device-out errors.

:func:`fit_constants` finds the :class:`SpeedConstants` that minimise a robust loss
(``soft_l1``) of log(predicted / measured) tokens/s with ``scipy.optimize.least_squares``,
with a weak pull of every constant towards a physical default
(:data:`kvsim.validate.fit_space.PRIOR`) or, for a card's own calibration, towards the
shipped constants — so what a set of rows
cannot separate (one model size cannot split fixed from per-layer overhead) keeps a
sensible split:

- per backend: the :class:`BackendConstants`;
- per weight-format family: a streaming and a prefill factor shared by every backend
  (F16 = 1), and a backend's own departure from them where 2+ of its devices ran it;
- per architecture class with rows from 2+ devices: a prefill and a bandwidth scale;
- then, on the dp4a path's rows alone (Pascal, kvsim.latency.dp4a), ``c_dp4a``.

:func:`kvsim.validate.lodo.leave_one_device_out` refits without each device in turn and
predicts it: the error a card that is in no file would see.

NOTE: the fit evaluates all rows at once (:class:`_Rows`); it implements the formula of
:func:`kvsim.latency.backend.gpu_rates` and the roofline's step time over the terms of
:meth:`~kvsim.latency.roofline.RooflineLatency.gpu_parts`, and
:func:`row_seconds` checks it against them (tests/validate/test_speed_fit.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from kvsim.errors import InputError
from kvsim.latency.backend import (
    ROW_KERNEL_ROWS,
    ClassScale,
    SpeedConstants,
    arch_class,
    board_power_w,
    dp4a_weight,
    format_family,
    gpu_rates,
    matrix_rate,
    memory_kind,
    per_expert_tiles,
    small_batch_tokens,
    vector_rate,
    vendor_class,
)
from kvsim.latency.dp4a import UNQUANTIZED, dp4a_path
from kvsim.latency.expert_loop import loop_fields
from kvsim.latency.prompt_family import prompt_family
from kvsim.latency.rates import TILE_TOKENS_MAX, expert_loop_s, expert_tile_excess, linear_terms
from kvsim.latency.roofline import GpuRates
from kvsim.validate.fit_space import HIGH, KEYS, LOW, FitSpace
from kvsim.validate.predict import Setup, latency_for, step_batches, tokens_measured
from kvsim.validate.records import Measurement

LOSS_SCALE = 0.15        # soft_l1: errors beyond ~15 % count less than squared


@dataclass(frozen=True)
class Row:
    """One measurement with its resolved setup and unpriced step terms."""

    m: Measurement
    setup: Setup
    parts: np.ndarray   # (steps, 10): linear FLOPs, attention FLOPs, weight bytes, KV bytes,
    #                     tokens in the step, 1 for a decode-only step, the routed experts'
    #                     FLOPs (part of the linear ones), their pick share k/E, the bytes a
    #                     prefill token's tiles read again (RooflineLatency.gpu_weight_bytes),
    #                     the seconds of the host's loop over the experts (not fitted:
    #                     kvsim.latency.rates.expert_loop_s)
    tokens: int

    @property
    def device(self) -> str:
        return self.setup.gpu.name

    @property
    def family(self) -> str:
        return format_family(self.setup.weight_format)


def make_row(m: Measurement, s: Setup) -> Row:
    loop = loop_fields(s.gpu, s.backend, format_family(s.weight_format), s.model)
    unit = latency_for(s, rates=GpuRates(1.0, 1.0, 1.0, 1.0, 0.0, **loop))
    parts = np.array([(*unit.gpu_parts(b), b.num_tokens, not b.prefill_tokens,
                       b.num_tokens * unit.gpu_expert_flops_per_token, unit.expert_pick,
                       unit.gpu_weight_bytes,
                       expert_loop_s(unit.rates, b.num_tokens, unit.expert_pick,
                                     unit.loop_experts))
                      for b in step_batches(m)], dtype=np.float64)
    return Row(m, s, parts, tokens_measured(m))


def row_seconds(r: Row, k: SpeedConstants) -> float:
    """The measured test's predicted time under constants ``k`` (through gpu_rates)."""
    s = r.setup
    g = gpu_rates(s.gpu, s.model, s.weight_format, backend=s.backend, flash_attn=s.flash_attn,
                  constants=k, graphs=s.cuda_graphs, cublas_prompts=s.cublas_prompts)
    p = r.parts
    rows = g.attention_flops_per_s if g.attention_rows_flops_per_s is None \
        else g.attention_rows_flops_per_s
    att = np.where((p[:, 5] > 0) | (p[:, 4] < g.rows_below), rows, g.attention_flops_per_s)
    terms = [linear_terms(g, t) for t in p[:, 4]]  # the roofline's own definition
    rate, factor = (np.array([x[i] for x in terms]) for i in (0, 1))
    small = np.array([x[2] for x in terms], dtype=bool)
    excess = np.array([0.0 if d else expert_tile_excess(g, t, pick)  # prompt steps only
                       for t, d, pick in p[:, [4, 5, 7]]])
    compute = p[:, 0] / rate * factor + p[:, 1] / att + p[:, 6] * excess / rate
    memory = p[:, 2] / g.weight_bytes_per_s + p[:, 3] / g.kv_bytes_per_s
    adds = ((p[:, 5] > 0) | small) & g.decode_adds
    compute = compute + np.where((p[:, 5] > 0) | adds, 0.0,
                                 g.reread_s_per_byte_token * p[:, 8] * p[:, 4])
    batch = g.overhead_s if g.overhead_batch_s is None else g.overhead_batch_s
    over = np.where(p[:, 4] <= 1, g.overhead_s, batch)  # llama.cpp: one-token graphs
    body = np.where(adds, compute + memory, np.maximum(compute, memory))
    return float(np.sum(over + body + p[:, 9]))


def log_errors(rows: Sequence[Row], k: SpeedConstants) -> np.ndarray:
    """log(predicted / measured) tokens/s per row."""
    return np.array([math.log(r.tokens / row_seconds(r, k) / r.m.value) for r in rows])



def _fixed_factors(rows: Sequence[Row], space: FitSpace
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, the prior's (prefill, weight-bandwidth, memory) factors that are not
    fitted parameters: formats, backend deviations, class scales and memory kinds the
    rows cannot refit."""
    k = space.prior
    pp, bw, mem = np.ones(len(rows)), np.ones(len(rows)), np.ones(len(rows))
    if k is None:
        return pp, bw, mem
    for i, r in enumerate(rows):
        g, b, pp_fam = r.setup.gpu, r.setup.backend, row_pp_family(r)
        own_bw = k.format_factors(b, r.family)[0]
        own_pp = k.format_factors(b, pp_fam)[1]
        for head, table, own, out, fam in (("bw", k.format_bw, own_bw, bw, r.family),
                                           ("pp", k.format_pp, own_pp, pp, pp_fam)):
            shared = table.get(fam, 1.0)
            if f"fmt_{head}.{fam}" not in space.index:
                out[i] *= shared
            if f"dev_{head}.{b}:{fam}" not in space.index:
                out[i] *= own / shared
        for cls in (arch_class(g, b), vendor_class(g, b)):
            scale = k.classes.get(cls, ClassScale())
            pp[i] *= 1.0 if f"cls.{cls}.pp_scale" in space.index else scale.pp_scale
            bw[i] *= 1.0 if f"cls.{cls}.bw_scale" in space.index else scale.bw_scale
        if f"mem.{memory_kind(g)}" not in space.index:
            mem[i] *= k.memory_bw.get(memory_kind(g), 1.0)
    return pp, bw, mem


class _Rows:
    """Every row's spec-sheet rates, parameter indices and steps, as arrays."""

    def __init__(self, rows: Sequence[Row], space: FitSpace) -> None:
        g = [r.setup.gpu for r in rows]
        be = [r.setup.backend for r in rows]
        self.vec = np.array([vector_rate(x) for x in g])
        self.mat = np.array([matrix_rate(x, b, r.family not in UNQUANTIZED)
                             for x, b, r in zip(g, be, rows)])
        self.mat16 = np.array([matrix_rate(x, b, False) for x, b in zip(g, be)])
        # NOTE: a dp4a row reaches the first stage only at the prior's own fitted c_dp4a
        k = space.prior
        self.dp4a = np.array([k is not None and on_dp4a(r) for r in rows])
        self.dp4a_cost = np.array([dp4a_weight(k.backend(b)) / x.int8_tensor_ops if d else 0.0
                                   for x, b, d in zip(g, be, self.dp4a)])
        self.bw = np.array([x.memory_bandwidth_bytes_per_s for x in g])
        self.mem = self._idx(space, [f"mem.{memory_kind(x)}" for x in g])
        self.inv_power = np.array([1.0 / (board_power_w(x) or math.inf) for x in g])
        self.layers = np.array([r.setup.model.num_layers for r in rows], dtype=float)
        self.cuda = np.array([b == "CUDA" for b in be])
        self.graphs = np.array([r.setup.cuda_graphs for r in rows])
        self.rows_below = np.array([ROW_KERNEL_ROWS.get(b, 1) for b in be], dtype=float)
        self.small_max = np.array([small_batch_tokens(b) for b in be], dtype=float)
        self.tiles = self.small_max > 1   # backend.small_batch_tokens: one switch
        self.moe = np.array([bool(r.setup.model.num_experts) for r in rows])
        self.fa = np.array([r.setup.flash_attn for r in rows])
        self.b = np.array([space.backends.index(x) for x in be])
        fams = {"bw": [r.family for r in rows], "pp": [row_pp_family(r) for r in rows]}
        self.fam = {f"fmt_{k}": self._idx(space, [f"fmt_{k}.{f}" for f in fams[k]])
                    for k in fams}
        self.dev = {f"dev_{k}": self._idx(space, [f"dev_{k}.{b}:{f}" for b, f in zip(be, fams[k])])
                    for k in fams}
        arch = [arch_class(x, b) for x, b in zip(g, be)]
        vend = [vendor_class(x, b) for x, b in zip(g, be)]
        self.cls = {k: self._idx(space, [f"cls.{c}.{k}" for c in arch])
                    for k in ("pp_scale", "bw_scale")}
        self.vcls = {k: self._idx(space, [f"cls.{c}.{k}" for c in vend])
                     for k in ("pp_scale", "bw_scale")}
        self.fixed_pp, self.fixed_bw, self.fixed_mem = _fixed_factors(rows, space)
        self.parts = np.concatenate([r.parts for r in rows])
        self.owner = np.repeat(np.arange(len(rows)), [len(r.parts) for r in rows])
        own = np.array([per_expert_tiles(b) for b in be])  # GpuRates.expert_tiles
        self.expert_excess = _expert_excess(self.parts) * own[self.owner]
        self.log_meas = np.log([r.m.value / r.tokens for r in rows])  # log(1 / seconds)
        self.nb = len(space.backends)

    @staticmethod
    def _idx(space: FitSpace, names: list[str]) -> np.ndarray:
        return np.array([space.index.get(n, -1) for n in names])

    def log_errors(self, x: np.ndarray) -> np.ndarray:
        ev = np.exp(x)
        c = {k: ev[[i * len(KEYS) + j for i in range(self.nb)]][self.b]
             for j, k in enumerate(KEYS)}
        ext = np.append(ev, 1.0)  # index -1 (not fitted) reads factor 1
        f_bw = ext[self.fam["fmt_bw"]] * ext[self.dev["dev_bw"]]
        f_pp = ext[self.fam["fmt_pp"]] * ext[self.dev["dev_pp"]]
        pw = c["c_pow_pj"] * 1e-12 * self.inv_power
        scale_pp = self.fixed_pp * ext[self.cls["pp_scale"]] * ext[self.vcls["pp_scale"]]
        lin = scale_pp * f_pp * np.where(self.moe, c["moe_eff"], 1.0) / (
            c["c_vec"] / self.vec + np.where(self.dp4a, self.dp4a_cost, c["c_mat"] / self.mat)
            + pw)
        att16 = 1.0 / (c["c_vec"] / self.vec + c["c_mat"] / self.mat16 + pw)
        att = np.where(self.fa, c["attn_eff"], c["attn_eff_no_fa"]) * att16
        att_rows = c["attn_eff_rows"] * att16
        bw = self.bw * ext[self.mem] * self.fixed_mem
        w_bw = bw * c["bw_eff"] * ext[self.cls["bw_scale"]] * ext[self.vcls["bw_scale"]] \
            * f_bw * self.fixed_bw
        kv_bw = bw * np.where(self.fa, c["kv_eff"], c["kv_eff_no_fa"])
        over = c["overhead_s"] + c["overhead_per_layer_s"] * self.layers
        launched = over + np.where(self.cuda, c["launch_per_layer_s"], 0.0) * self.layers
        o, p = self.owner, self.parts
        one = np.where(self.graphs, over, launched)  # a one-token step: a graph or not
        per_row = (p[:, 5] > 0) | (p[:, 4] < self.rows_below[o])
        small = (p[:, 4] > 1) & (p[:, 4] <= self.small_max[o])  # matrix-vector (GpuRates)
        lin_s = np.where(small, (self.vec / c["c_small"])[o], lin[o])
        tiled = (p[:, 4] > np.maximum(self.small_max[o], 1)) & self.tiles[o]
        tile = tiled * c["tile_tokens"][o]
        factor = np.where(small, (p[:, 4] - 1.0) / p[:, 4],
                          1.0 + tile * np.ceil(p[:, 4] / TILE_TOKENS_MAX) / p[:, 4])
        compute = p[:, 0] / lin_s * factor + p[:, 1] / np.where(per_row, att_rows[o], att[o]) \
            + p[:, 6] / lin_s * tile * self.expert_excess
        memory = p[:, 2] / w_bw[o] + p[:, 3] / kv_bw[o]
        adds = (p[:, 5] > 0) | small
        compute = compute + np.where(adds, 0.0,
                                     c["pp_reread"][o] * p[:, 8] * p[:, 4] / bw[o])
        body = np.where(adds, compute + memory, np.maximum(compute, memory))
        step = np.where(p[:, 4] <= 1, one[o], launched[o]) + body + p[:, 9]
        seconds = np.bincount(o, weights=step, minlength=len(self.b))
        return -np.log(seconds) - self.log_meas


def _expert_excess(p: np.ndarray) -> np.ndarray:
    """Per step, :func:`kvsim.latency.rates.expert_tile_excess` over ``tile_tokens``
    (tiles of each used expert's tokens less the step's, per token); 0 for dense and
    decode-only steps."""
    t, pick = p[:, 4], p[:, 7]
    used = 1.0 - (1.0 - pick) ** np.floor(t)
    per = np.where(pick > 0, t * pick / np.where(used > 0, used, 1.0), 1.0)
    return np.where((pick > 0) & (p[:, 5] == 0), np.ceil(per / TILE_TOKENS_MAX) / per
                    - np.ceil(t / TILE_TOKENS_MAX) / t, 0.0)


def row_weights(rows: Sequence[Row]) -> np.ndarray:
    """Each row weighs ``1 / sqrt(rows of its device, kind and metric)``, normalised to a
    mean square of 1: a device that published a 40-point depth sweep informs the fit
    more than one pp512, but not forty times more."""
    key = [(r.device, r.m.kind, r.m.metric) for r in rows]
    count: dict[tuple[str, str, str], int] = defaultdict(int)
    for k in key:
        count[k] += 1
    w = np.array([1.0 / math.sqrt(count[k]) for k in key])
    return w / math.sqrt(float(np.mean(w * w)))


def fit_constants(rows: Sequence[Row], *, prior: SpeedConstants | None = None,
                  start: SpeedConstants | None = None, fitted_on: str = "") -> SpeedConstants:
    """Robust least-squares constants for ``rows`` (module docstring), leaning towards
    ``prior`` (None: the physical defaults), starting from ``start`` (default: the
    prior).

    NOTE: two stages. Rows on the dp4a path (:func:`on_dp4a`) are priced by ``c_dp4a``,
    which no other row informs: the first stage fits everything else without them (or
    with them at the prior's ``c_dp4a`` where it has one, as a card's own calibration
    does), the second fits ``c_dp4a`` alone on them with the rest held. So rows of
    other parts fit exactly as if the dp4a rows were not there."""
    if not rows:
        raise InputError("measurements", "none", "at least one predictable row to fit on")
    held = {b for b, c in (prior.backends.items() if prior else ()) if c.c_dp4a}
    dp4a = [r for r in rows if on_dp4a(r)]
    main = [r for r in rows if not on_dp4a(r) or r.setup.backend in held]
    if main:
        k = _fit_main(main, prior, start, fitted_on)
    elif prior is not None:
        k = prior.model_copy(update={"fitted_on": fitted_on})
    else:
        raise InputError("measurements", "dp4a rows only",
                         "rows of a part without the dp4a path to fit the rest on")
    return _fit_dp4a(dp4a, k) if dp4a else k


def on_dp4a(r: Row) -> bool:
    """Whether a row's linear layers run on the dp4a path (kvsim.latency.dp4a.dp4a_path)."""
    return dp4a_path(r.setup.gpu, r.setup.backend, r.family)


def row_pp_family(r: Row) -> str:
    """The family whose prefill factor a row's steps take
    (kvsim.latency.prompt_family.prompt_family)."""
    return prompt_family(r.setup.gpu, r.setup.backend, r.family, r.setup.cublas_prompts)


def _soft_l1(e: np.ndarray) -> np.ndarray:
    """``scipy``'s soft_l1 loss of errors in units of LOSS_SCALE, as residuals: errors
    beyond it count less than squared."""
    s = e / LOSS_SCALE
    return np.sqrt(2.0 * (np.sqrt(1.0 + s * s) - 1.0)) * np.sign(s)


def _fit_main(rows: Sequence[Row], prior: SpeedConstants | None,
              start: SpeedConstants | None, fitted_on: str) -> SpeedConstants:
    """The first stage: every constant but ``c_dp4a``, all rows at once."""
    space = FitSpace(rows, prior)
    arrays = _Rows(rows, space)
    x0 = space.x_prior if start is None else space.vector(start)
    n = len(rows)
    w = row_weights(rows)

    def resid(x: np.ndarray) -> np.ndarray:
        return np.concatenate([w * _soft_l1(arrays.log_errors(x)) * LOSS_SCALE
                               / math.sqrt(n),
                               space.weights * (x - space.x_prior) / math.sqrt(len(x))])

    sol = least_squares(resid, x0, method="trf", x_scale=1.0,
                        bounds=(np.full(len(x0), LOW), np.full(len(x0), HIGH)))
    return space.constants(sol.x, fitted_on)


def _fit_dp4a(rows: Sequence[Row], k: SpeedConstants) -> SpeedConstants:
    """The second stage: each backend's ``c_dp4a`` on its dp4a rows, the rest held."""
    for b in sorted({r.setup.backend for r in rows}):
        log_c = _fit_one_dp4a([r for r in rows if r.setup.backend == b], k, b)
        k = k.with_backend(b, c_dp4a=math.exp(log_c))
    return k


def _fit_one_dp4a(rows: Sequence[Row], k: SpeedConstants, backend: str) -> float:
    """log ``c_dp4a`` of one backend that fits ``rows`` best under ``k``."""
    w = row_weights(rows)
    x0 = math.log(dp4a_weight(k.backend(backend)))   # the fitted value or its default
    sol = least_squares(
        lambda x: w * _soft_l1(log_errors(rows, k.with_backend(backend,
                                                                c_dp4a=math.exp(x[0])))),
        [x0], method="trf", bounds=([LOW], [HIGH]))
    return float(sol.x[0])

