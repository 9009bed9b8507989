"""Load-time memory budgets by engine, and the searches over them (the largest context,
parallelism or memory share that stays under the planning line).

:func:`memory_budget` asks the config's engine for its layout (``Engine.memory_budget``);
the fields are :class:`kvsim.engines.memory.MemoryBudget`'s.
"""

from __future__ import annotations

import math
from typing import Any

from kvsim.config.specs import GpuSpec, HostSpec, ModelSpec
from kvsim.config.units import format_bytes
from kvsim.engines import engine_for
from kvsim.engines.config import (
    CONTEXT_KEYS,
    PagedEngineConfig,
    SlotEngineConfig,
    drop_derived_context,
)
from kvsim.engines.memory import DEFAULT_DRIVER_RESERVE_BYTES, PLANNING_LIMIT, MemoryBudget
from kvsim.errors import InputError

EngineConfig = PagedEngineConfig | SlotEngineConfig


def memory_budget(gpu: GpuSpec, model: ModelSpec, weights: str, engine: EngineConfig,
                  driver_reserve_bytes: int = DEFAULT_DRIVER_RESERVE_BYTES,
                  display_reserve_bytes: int = 0, parallel: int | None = None,
                  more_gpus: tuple[GpuSpec, ...] = ()) -> MemoryBudget:
    """The load-time layout of ``engine`` serving ``model`` in ``weights`` on ``gpu``
    (and ``more_gpus``, the box's other GPUs in CUDA order: then ``devices`` holds each).

    ``parallel`` only matters for paged engines: how many full-length sequences
    ``kv_needed_bytes`` should hold (default 1).  Slot engines take it from the config.
    """
    if driver_reserve_bytes < 0 or display_reserve_bytes < 0:
        raise InputError("reserve", min(driver_reserve_bytes, display_reserve_bytes),
                         "reserves must be >= 0 bytes")
    traits = engine_for(engine.preset)
    if more_gpus and not traits.lays_out_gpus:
        raise InputError("gpu", 1 + len(more_gpus), f"one GPU for now with {traits.name}: "
                         "its per-GPU memory layout is not built yet")
    return traits.memory_budget(
        gpu, model, weights, engine, driver_reserve_bytes, display_reserve_bytes,
        parallel or 1, tuple(more_gpus))


def box_reserves(scenario: Any) -> dict[str, Any]:
    """A scenario's reserves and the box's other GPUs, as keyword arguments of
    :func:`memory_budget` and the searches over it (which pass them on)."""
    return {"driver_reserve_bytes": scenario.driver_reserve_bytes,
            "display_reserve_bytes": scenario.display_reserve_bytes,
            "more_gpus": tuple(scenario.gpus[1:])}


def check_host_memory(b: MemoryBudget, host: HostSpec, context_tokens: int,
                      field: str = "engine.context_tokens") -> None:
    """Refuse a layout whose KV left on the CPU exceeds the host's RAM: the engine
    allocates it at start-up and cannot (weights on the CPU are not counted: llama.cpp
    memory-maps them, so an oversized model pages from disk, slowly, but loads).  On a
    unified-memory machine CPU and GPU share one memory (docs/reference/hardware-and-models.md §3):
    the GPU's part of the layout and the KV on the CPU must fit it together."""
    if host.unified_with_gpu:
        if b.total_bytes + b.kv_cpu_bytes <= host.memory_bytes:
            return
        raise InputError(field, context_tokens,
                         f"this layout needs {format_bytes(b.total_bytes)} for the GPU and "
                         f"{format_bytes(b.kv_cpu_bytes)} of KV on the CPU, more than the "
                         f"{format_bytes(host.memory_bytes)} that {host.name} shares between "
                         "them; lower context_tokens or parallel")
    if b.kv_cpu_bytes <= host.memory_bytes:
        return
    raise InputError(field, context_tokens,
                     f"this layout puts {format_bytes(b.kv_cpu_bytes)} of KV in host RAM, "
                     f"more than the host's {format_bytes(host.memory_bytes)} ({host.name}); "
                     "lower context_tokens or parallel, or give a larger host")


def weights_beyond_ram(b: MemoryBudget, host: HostSpec) -> int:
    """Bytes of the weights left on the CPU that the host's RAM cannot keep resident
    beside the KV on the CPU (on a unified-memory machine, beside the GPU's whole layout
    too, as :func:`check_host_memory` counts it); 0 when they fit.  llama.cpp
    memory-maps them, so the rest is read from disk as each token needs it, while
    kvsim's latency model reads them at the host's RAM bandwidth (the host profiles
    carry no disk figure): the predicted speed is then too fast."""
    beside = b.kv_cpu_bytes + (b.total_bytes if host.unified_with_gpu else 0)
    return max(0, b.weights_cpu_bytes + beside - host.memory_bytes)


def engine_with(engine: EngineConfig, **update: Any) -> EngineConfig | None:
    """``engine`` with ``update``d knobs, or None where that combination is invalid
    (a point that simply does not exist).  NOTE: llama.cpp's two contexts follow the
    update: one naming ``ctx_size`` keeps that -c, one naming ``context_tokens`` or
    ``parallel`` keeps the per-session context (:func:`drop_derived_context`)."""
    if update.keys() & set(CONTEXT_KEYS) and "fit_context" in type(engine).model_fields:
        update.setdefault("fit_context", False)  # NOTE: a context set is not --fit's to shrink
    try:
        return type(engine).model_validate(
            {**drop_derived_context(engine.model_dump(), set(update)), **update})
    except Exception:  # noqa: BLE001 - an invalid combination simply does not fit
        return None


def acceptable(b: MemoryBudget, parallel: int, limit: float = PLANNING_LIMIT) -> bool:
    """Loads, keeps every layer on the GPU, and peaks at or under ``limit`` of memory."""
    if not (b.fits and b.all_layers_on_gpu and b.needed_fraction <= limit):
        return False
    if b.num_gpu_blocks is not None:   # paged: all sequences at full length at once
        held = parallel * b.blocks_per_request <= b.num_gpu_blocks if b.blocks_per_request \
            else parallel * b.slot_tokens <= b.kv_pool_tokens
        return held and parallel <= b.extra.get("max_num_seqs", parallel)
    return True


def largest_where(lo: int, hi: int, ok: Any) -> int:
    """Largest integer x in [lo, hi] with ok(x) for a monotone predicate; lo-1 if none."""
    if hi < lo or not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _parallel_of(engine: EngineConfig, parallel: int | None) -> int:
    return engine.parallel if isinstance(engine, SlotEngineConfig) else (parallel or 1)


def share_within(gpu: GpuSpec, model: ModelSpec, weights: str, engine: PagedEngineConfig,
                 limit: float = PLANNING_LIMIT, **reserves: int) -> float | None:
    """vLLM / SGLang: the engine's memory fraction if the whole device stays at or under
    ``limit`` with it, else the largest lower one (3 decimals) that does; None if none.

    NOTE: the fraction is only the engine's share: the driver reserve, the display and
    what the engine takes outside it (vLLM's CUDA graphs, SGLang's activations) come on
    top, and the total grows by the share alone, so the share left is linear.
    """
    b = memory_budget(gpu, model, weights, engine, **reserves)
    if b.device_fraction <= limit:
        return engine.gpu_memory_utilization
    if b.devices:  # NOTE: per GPU; a rank whose pool the smallest one caps counts in full
        utils = [_share_at(limit * d.device_bytes, d.total_bytes, d.kv_bytes, pool, share,
                           d.device_bytes) for d, pool, share in
                 zip(b.devices, b.extra["kv_pool_bytes"], b.extra["share_bytes"], strict=True)]
        util = min(utils)
    else:
        util = _share_at(limit * b.device_bytes, b.total_bytes, b.kv_reserved_bytes,
                         b.extra["kv_pool_bytes"], b.extra["share_bytes"],
                         gpu.reported_memory_bytes)
    return util if util > 0 else None


def _share_at(room: float, total: int, kv: int, pool: int, share: int, reported: int
              ) -> float:
    """The share (3 decimals, rounded down) that puts ``total`` at ``room``.

    NOTE: the pool is whole blocks, so the KV reserved falls short of the pool's bytes
    by less than one block; what lies outside the share is the rest of the total."""
    outside = total - kv + pool - share
    return math.floor((room - outside) / reported * 1000) / 1000


def _at_limit(gpu: GpuSpec, model: ModelSpec, weights: str, engine: EngineConfig,
              limit: float, reserves: dict[str, int]) -> EngineConfig | None:
    """``engine`` as it would run under ``limit``: a paged engine's fraction lowered by
    :func:`share_within` (its pool preallocated, so that is what the line bounds);
    None if no fraction keeps it under."""
    if not isinstance(engine, PagedEngineConfig):
        return engine
    util = share_within(gpu, model, weights, engine, limit, **reserves)
    return None if util is None else engine.model_copy(update={"gpu_memory_utilization": util})


def max_context_at(gpu: GpuSpec, model: ModelSpec, weights: str, engine: EngineConfig,
                   parallel: int | None = None, limit: float = PLANNING_LIMIT,
                   step_tokens: int = 256, **reserves: int) -> int:
    """Largest context (the engine's own flag: llama.cpp ``-c`` = ``ctx_size``, else
    ``context_tokens``; a multiple of ``step_tokens``) that
    stays :func:`acceptable` at this parallelism; 0 if none does.  A paged engine's
    memory fraction is first lowered to the line (:func:`share_within`).

    Searched up to what the engine can use: llama.cpp ``-c`` is the total of all slots
    (split into streams, or one ``-kvu`` pool) and llama-server caps each slot at the
    training context, so ``parallel`` × the model's maximum; Ollama ``num_ctx`` and
    vLLM/SGLang ``max_model_len`` are per sequence, at most the model's maximum."""
    p = _parallel_of(engine, parallel)
    at = _at_limit(gpu, model, weights, engine, limit, reserves)
    if at is None:
        return 0
    engine = at
    per_seq_cap = model.max_context_tokens
    pool = engine_for(engine.preset).context_scope == "pool"
    scale, key = (p, "ctx_size") if pool else (1, "context_tokens")

    def ok(k: int) -> bool:
        cfg = engine_with(engine, **{key: k * step_tokens})
        return cfg is not None and acceptable(
            memory_budget(gpu, model, weights, cfg, parallel=p, **reserves), p, limit)

    best = largest_where(1, per_seq_cap * scale // step_tokens, ok)
    return max(0, best) * step_tokens


def max_parallel_at(gpu: GpuSpec, model: ModelSpec, weights: str, engine: EngineConfig,
                    limit: float = PLANNING_LIMIT, cap: int = 1024, **reserves: int) -> int:
    """Largest parallelism at this context that stays :func:`acceptable`; 0 if none.

    Searched up to ``cap`` and the context itself.  NOTE: llama.cpp splits (or
    shares) ``-c`` over the slots, so the search also stops at one 256-token pad unit
    of ``-c`` per slot — beyond that, padding rather than ``-c`` decides the memory.
    A paged engine's memory fraction is first lowered to the line (:func:`share_within`).
    """
    at = _at_limit(gpu, model, weights, engine, limit, reserves)
    if at is None:
        return 0
    engine = at
    size = getattr(engine, "ctx_size", None)
    hi = min(cap, engine.context_tokens if size is None else size)
    if isinstance(engine, PagedEngineConfig):
        hi = min(hi, engine.max_num_seqs)
    elif size is not None:  # llama.cpp -c: all slots
        hi = min(hi, max(1, size // engine.context_pad_tokens))
    # NOTE: llama.cpp keeps -c (ctx_size) as the slots change, as this search always has
    keep = {} if size is None else {"ctx_size": size}

    def ok(p: int) -> bool:
        cfg = engine_with(engine, parallel=p, **keep) if isinstance(engine, SlotEngineConfig) \
            else engine
        return cfg is not None and acceptable(
            memory_budget(gpu, model, weights, cfg, parallel=p, **reserves), p, limit)

    if isinstance(engine, PagedEngineConfig):
        return max(0, largest_where(1, hi, ok))
    # NOTE: llama.cpp pads each slot's share of -c to 256, so memory is not monotone in
    # the slot count (-c 65536: 200 slots need 102400 cells, 256 slots 65536) — scan.
    return next((p for p in range(hi, 0, -1) if ok(p)), 0)
