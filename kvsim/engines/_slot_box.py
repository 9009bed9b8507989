"""llama.cpp's load-time layout over several GPUs (docs/reference/engines.md §3.8): each
GPU's weights, KV buffer and compute buffer by the placement of
:mod:`kvsim.engines._slot_devices`, and ``--fit`` over the devices.

``--fit`` with several GPUs (ggml-org/llama.cpp ``common/fit.cpp``): if every device
keeps ``--fit-target`` (1 GiB) free with the default split, nothing changes; else an
unset context is shrunk (all devices together, less half a layer of waste per device and
one more: ``(n + 1) x`` a layer's weights / 2, / 6 for MoE), then the layers are filled
back to front: the last device first takes as many of the remaining layers (the output
layer first) as keep its target, then the one before it; what no device takes runs on
the CPU.  A ``--tensor-split`` the user gave, or ``--split-mode row``, is not
redistributed (fit gives up and the layers stay where the split puts them).

NOTE: kvsim fills whole layers also for MoE models, where llama.cpp first moves routed
experts to system RAM (a layout kvsim lays out on one GPU only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import format_bytes
from kvsim.engines._slot_devices import (
    Placement,
    free_shares,
    group_kv,
    layers_kv,
    place,
    split_points,
)
from kvsim.engines._slot_layout import mib, pad_to, slot_budget, slot_layout
from kvsim.engines.memory import MIB, DeviceShare, MemoryBudget
from kvsim.model.compute_buffer import llama_cpp_logits_bytes

if TYPE_CHECKING:
    from kvsim.engines.config import SlotEngineConfig
    from kvsim.model.geometry import KvGeometry
    from kvsim.model.weights import WeightSplit

FIT_TARGET_BYTES = 1024 * MIB   # §3.6: --fit-target per device
FIT_CTX_TOKENS = 4096           # §3.6: --fit-ctx


@dataclass(frozen=True)
class Box:
    """What a box layout needs besides the placement: the cards, the model, the
    engine, the reserves and one context's cache shape (``lay``: kvsim.engines._slot_layout)."""

    gpus: tuple[GpuSpec, ...]
    model: ModelSpec
    ws: WeightSplit
    geo: KvGeometry
    engine: SlotEngineConfig
    driver: int
    display: int
    n_ctx: int
    n_ctx_seq: int
    lay: dict[str, Any]

    @property
    def row(self) -> bool:
        return self.engine.split_mode == "row"

    def row_shares(self) -> list[float]:
        """Each device's rows of every matrix (``--split-mode row``): the tensor split,
        or CUDA's default, each device's total memory."""
        shares = self.engine.tensor_split or [float(g.reported_memory_bytes)
                                              for g in self.gpus]
        return [s / sum(shares) for s in shares]


@dataclass(frozen=True)
class Part:
    weights: int
    kv: int
    compute: int
    overhead: int
    layers: int
    output: bool

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.overhead


def device_parts(box: Box, p: Placement) -> list[Part]:
    """Each GPU's bytes for placement ``p`` (module docstring)."""
    m, ws, e = box.model, box.ws, box.engine
    groups = group_kv(m, box.geo, box.n_ctx, box.lay["swa"], e.parallel)
    logits = llama_cpp_logits_bytes(m, e.n_ubatch)
    compute = box.lay["compute"]
    layer_compute = compute if e.compute_buffer_bytes is not None else compute - logits
    on_gpu = [i for i, d in enumerate(p.layers) if d >= 0]
    last = p.output if p.output >= 0 else (p.layers[on_gpu[-1]] if on_gpu else -1)
    rows = box.row_shares() if box.row else None
    dense = ws.per_layer_bytes - ws.expert_bytes_per_layer
    parts = []
    for d in range(len(box.gpus)):
        held = p.held(d)
        if rows is None:
            weights = len(held) * ws.per_layer_bytes + (
                ws.head_bytes + ws.output_extra_bytes if p.output == d else 0)
        else:
            weights = int(rows[d] * (len(on_gpu) * dense + (ws.head_bytes if p.output >= 0
                                                            else 0))) \
                + len(held) * ws.expert_bytes_per_layer
        busy = bool(held) or p.output == d
        parts.append(Part(
            weights=weights, kv=layers_kv(groups, held, m.num_layers),
            compute=(layer_compute if busy else 0) + (logits if d == last and
                                                      e.compute_buffer_bytes is None else 0),
            overhead=box.driver + (box.display if d == 0 else 0), layers=len(held),
            output=p.output == d))
    return parts


def _default_placement(box: Box, gpu_layers: int, head: bool) -> Placement:
    shares = box.engine.tensor_split or free_shares(box.gpus, box.driver, box.display)
    return place(split_points(shares), box.model.num_layers, gpu_layers, head)


def _fits_targets(parts: list[Part], box: Box) -> bool:
    return all(pt.total <= g.usable_memory_bytes - FIT_TARGET_BYTES
               for pt, g in zip(parts, box.gpus, strict=True))


def _fill_back_to_front(box: Box) -> Placement:
    """--fit step 3 (module docstring): layers per device, the last device first."""
    L, nd = box.model.num_layers, len(box.gpus)
    counts = [0] * nd

    def placement(c: list[int]) -> Placement:
        n = sum(c)
        if n == 0:
            return Placement((-1,) * L, -1)
        return place(split_points(c), L, n - 1, True)

    for d in reversed(range(nd)):
        room = box.gpus[d].usable_memory_bytes - FIT_TARGET_BYTES
        lo, hi = 0, L + 1 - sum(counts[d + 1:])
        while lo < hi:  # the most layers device d takes and keeps its target
            mid = (lo + hi + 1) // 2
            trial = counts[:d] + [mid] + counts[d + 1:]
            ok = device_parts(box, placement(trial))[d].total <= room
            lo, hi = (mid, hi) if ok else (lo, mid - 1)
        counts[d] = lo
    return placement(counts)


def box_of(gpus: tuple[GpuSpec, ...], model: ModelSpec, ws: WeightSplit, geo: KvGeometry,
           engine: SlotEngineConfig, driver: int, display: int, ctx: int,
           head_first: bool | None = None) -> Box:
    """The box at context ``ctx`` (llama.cpp ``-c``: padded to 256, per-slot streams or
    one unified pool, as one GPU lays it out); ``head_first``: a partial offload keeps
    the output layer on the GPU (llama.cpp's --fit; default: when -ngl is unset)."""
    if head_first is None:
        head_first = engine.gpu_layers is None
    unified, pad = engine.allocator == "unified", engine.context_pad_tokens
    n_ctx = pad_to(ctx, pad)
    n_ctx_seq = n_ctx if unified else pad_to(n_ctx // engine.parallel, pad)
    n_ctx = n_ctx if unified else n_ctx_seq * engine.parallel
    lay = slot_layout(gpus[0], model, ws, geo, engine, n_ctx, n_ctx_seq, unified, driver,
                      display, head_first=head_first)
    return Box(gpus, model, ws, geo, engine, driver, display, n_ctx, n_ctx_seq, lay)


def fit_box(make: Any, engine: SlotEngineConfig) -> tuple[Box, Placement, list[str]]:
    """``--fit`` over the devices (module docstring): the box (``make(ctx)``), the
    placement and what fit changed, as notes."""
    box = make(engine.ctx_size)  # NOTE: -c (Ollama's runner: num_ctx x parallel)
    L, nd = box.model.num_layers, len(box.gpus)
    if engine.gpu_layers is not None:
        n = min(engine.gpu_layers, L)
        return box, _default_placement(box, n, n == L), []
    p = _default_placement(box, L, True)
    if _fits_targets(device_parts(box, p), box):
        return box, p, []
    notes = []
    if engine.fit_context:
        weights = sum(pt.weights for pt in device_parts(box, p))
        waste = (nd + 1) * (weights // L) // (6 if box.ws.expert_bytes_per_layer else 2)
        room = sum(g.usable_memory_bytes - FIT_TARGET_BYTES for g in box.gpus) - waste
        ctx = _largest_context(make, engine, lambda b: sum(
            pt.total for pt in device_parts(b, _default_placement(b, L, True))) <= room)
        if ctx < engine.ctx_size:
            notes.append(f"-c unset: --fit shrank the context from the model's "
                         f"{engine.ctx_size} to {ctx} tokens")
            box = make(ctx)
            p = _default_placement(box, L, True)
    if engine.tensor_split is not None or box.row:
        return box, p, notes
    p = _fill_back_to_front(box)
    if p.gpu_layers < L:
        notes.append(f"--fit: only {p.gpu_layers}/{L} layers leave 1 GiB free on each GPU; "
                     "the rest run on the CPU (much slower decode)")
    return box, p, notes


def _largest_context(make: Any, engine: SlotEngineConfig, fits: Any) -> int:
    """The training context if it fits, else the largest multiple of 256 that does, not
    below --fit-ctx (as kvsim.engines.llama_cpp does on one GPU)."""
    pad, top = engine.context_pad_tokens, engine.ctx_size
    if fits(make(top)):
        return top
    lo, hi = max(FIT_CTX_TOKENS // pad, 1), top // pad
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(make(mid * pad)) else (lo, mid - 1)
    return lo * pad


def box_budget(box: Box, p: Placement, logs: list[str], notes: list[str],
               estimate: Any = None, failure: str | None = None) -> MemoryBudget:
    """The box's MemoryBudget: the one-GPU fields of the whole model (pool, slots, rates),
    byte rows summed over the GPUs, ``devices`` per GPU; a GPU over its memory fails."""
    parts = device_parts(box, p)
    L, n = box.model.num_layers, p.gpu_layers
    head_first = p.output >= 0 and n < L
    lay = {**box.lay, "head_first": head_first}
    one = slot_budget(box.engine, box.gpus[0], box.model, box.ws, box.geo, lay, n,
                      box.n_ctx, box.n_ctx_seq, box.driver, box.display, [], [],
                      estimate=estimate)
    devices = tuple(DeviceShare(  # NOTE: row: every GPU holds a slice of all the layers
        index=i, gpu=g.name, device_bytes=g.usable_memory_bytes,
        layers=n if box.row else pt.layers,
        weight_fraction=box.row_shares()[i] if box.row else 1.0, weights_bytes=pt.weights,
        kv_bytes=pt.kv, compute_bytes=pt.compute, overhead_bytes=pt.overhead,
        holds_output=pt.output) for i, (g, pt) in enumerate(zip(box.gpus, parts, strict=True)))
    over = [d for d in devices if d.total_bytes > d.device_bytes]
    if failure is None and over:
        failure = (f"CUDA{over[0].index} ({over[0].gpu}): cudaMalloc failed: out of memory — "
                   f"needs {format_bytes(over[0].total_bytes)} of "
                   f"{format_bytes(over[0].device_bytes)}")
    kv = sum(pt.kv for pt in parts)
    logs = logs + _buffer_lines(parts)
    return replace(
        one, device_bytes=sum(d.device_bytes for d in devices),
        driver_reserve_bytes=box.driver * len(devices),
        weights_gpu_bytes=sum(pt.weights for pt in parts),
        weights_cpu_bytes=box.ws.cpu_bytes(n, head_first=head_first),
        activation_bytes=sum(pt.compute for pt in parts), kv_reserved_bytes=kv,
        kv_cpu_bytes=box.lay["kv_total"] - kv, kv_needed_bytes=kv,
        head_on_gpu=p.output >= 0, fits=failure is None, failure=failure,
        log_lines=tuple(logs), notes=tuple(notes),
        split="row" if box.row else "layer", devices=devices,
        tensor_parallel=len(devices) if box.row else 1,
        pipeline_parallel=1 if box.row else sum(1 for pt in parts if pt.layers or pt.output))


def _buffer_lines(parts: list[Part]) -> list[str]:
    """llama.cpp's per-device buffer lines (load_tensors, llama_kv_cache, llama_context)."""
    out = [f"load_tensors: CUDA{i} model buffer size = {mib(pt.weights)}"
           for i, pt in enumerate(parts)]
    out += [f"llama_kv_cache: CUDA{i} KV buffer size = {mib(pt.kv)}"
            for i, pt in enumerate(parts) if pt.kv]
    out += [f"llama_context: CUDA{i} compute buffer size = {mib(pt.compute)}"
            for i, pt in enumerate(parts) if pt.compute]
    return out


def main_gpu_budget(gpus: tuple[GpuSpec, ...], main: int, driver: int, display: int,
                    one_gpu: Any) -> MemoryBudget:
    """``--split-mode none``: ``one_gpu(gpu, display)``'s layout on the main GPU; the
    others hold nothing (llama.cpp keeps only the main device, so no CUDA context
    either), device 0 its display."""
    b = one_gpu(gpus[main], display if main == 0 else 0)
    devices = tuple(
        DeviceShare(index=i, gpu=g.name, device_bytes=g.usable_memory_bytes,
                    layers=b.gpu_layers, weight_fraction=1.0,
                    weights_bytes=b.weights_gpu_bytes, kv_bytes=b.kv_reserved_bytes,
                    compute_bytes=b.activation_bytes,
                    overhead_bytes=b.driver_reserve_bytes + b.display_reserve_bytes
                    + b.engine_overhead_bytes, holds_output=b.head_on_gpu)
        if i == main else
        DeviceShare(index=i, gpu=g.name, device_bytes=g.usable_memory_bytes, layers=0,
                    weight_fraction=1.0, weights_bytes=0, kv_bytes=0, compute_bytes=0,
                    overhead_bytes=display if i == 0 else 0)
        for i, g in enumerate(gpus))
    return replace(b, device_bytes=sum(g.usable_memory_bytes for g in gpus),
                   display_reserve_bytes=display, split="none", devices=devices)
