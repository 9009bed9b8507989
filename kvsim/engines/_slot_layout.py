"""The slot engines' load-time layout (llama.cpp §3.1-§3.3, Ollama's runners §4): KV cells
per slot or one unified pool, SWA caches, compute buffers, layers on the GPU.

Shared by :mod:`kvsim.engines.llama_cpp` and :mod:`kvsim.engines.ollama` (references are
to ``docs/reference/engines.md``); the resulting fields are
:class:`kvsim.engines.memory.MemoryBudget`'s.  The llama.cpp compute buffer is
:mod:`kvsim.model.compute_buffer` (what grows with the context read from llama.cpp's
source and measured; the fixed part an ESTIMATE; ``compute_buffer_bytes`` pins it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import format_bytes
from kvsim.engines.memory import MIB, MemoryBudget, OllamaEstimate
from kvsim.errors import InputError
from kvsim.model.compute_buffer import llama_cpp_compute_bytes
from kvsim.model.dtypes import cache_type
from kvsim.model.geometry import KvGeometry
from kvsim.model.weights import WeightSplit

if TYPE_CHECKING:
    from kvsim.engines.config import SlotEngineConfig


def pad_to(n: int, to: int) -> int:
    return -(-n // to) * to


def mib(n: float) -> str:
    return f"{n / MIB:.2f} MiB"


def check_quant_k(model: ModelSpec, geo: KvGeometry) -> None:
    """§3.2: quantized K needs head_dim divisible by the block size (32)."""
    k = cache_type(geo.cache_type_k)
    for g in model.layer_groups:
        dims = [g.head_dim_k] if g.kind != "mla" else [g.latent_dim]
        if k.block_elems > 1 and any(d % k.block_elems for d in dims if d):
            raise InputError("cache_type_k", geo.cache_type_k,
                             f"head dim {dims[0]} is not a multiple of {k.block_elems}; "
                             "use f16 or bf16")


def swa_ring_cells(window_tokens: int, n_ubatch: int, seqs: int = 1,
                   stream_cells: int | None = None) -> int:
    """Cells of one stream of llama.cpp's SWA cache (§3.3): the window of each of the
    ``seqs`` sequences sharing the stream, plus a ubatch, at most the stream's
    ``stream_cells``, padded to 256 (llama_kv_cache_iswa's ``size_swa``)."""
    want = window_tokens * seqs + n_ubatch
    return pad_to(want if stream_cells is None else min(stream_cells, want), 256)


def _slot_kv_bytes(geo: KvGeometry, n_ctx: int, n_ctx_seq: int, parallel: int,
                   unified: bool, n_ubatch: int) -> tuple[int, list[int]]:
    """KV bytes of llama.cpp's cache (§3.1, §3.3) and the SWA cell counts."""
    total = geo.full_bytes_per_token * n_ctx
    swa_cells = []
    for w in geo.windowed:
        per_stream = swa_ring_cells(w.window_tokens or 0, n_ubatch,
                                    parallel if unified else 1, n_ctx_seq)
        cells = per_stream if unified else per_stream * parallel
        swa_cells.append(cells)
        total += w.bytes_per_token * cells
    return total + geo.recurrent_bytes_per_seq * parallel, swa_cells


def slot_layout(gpu: GpuSpec, model: ModelSpec, ws: WeightSplit, geo: KvGeometry, engine:
            SlotEngineConfig, n_ctx: int, n_ctx_seq: int, unified: bool, driver: int,
            display: int, head_first: bool = False) -> dict:
    kv_total, swa = _slot_kv_bytes(geo, n_ctx, n_ctx_seq, engine.parallel, unified,
                                   engine.n_ubatch)
    compute = engine.compute_buffer_bytes
    if compute is None:  # the masks span one stream's cells: the pool, or one slot's
        streams = 1 if unified else engine.parallel
        compute = llama_cpp_compute_bytes(model, engine.n_ubatch,
                                          n_ctx if unified else n_ctx_seq, engine.flash_attn,
                                          swa_cells=max(swa, default=0) // streams)
    L = model.num_layers

    def gpu_total(n: int, head: bool | None = None) -> int:
        return (driver + display + ws.gpu_bytes(n, head_first=head_first, head=head) + compute
                + kv_total * n // L)

    return {"kv_total": kv_total, "swa": swa, "compute": compute, "gpu_total": gpu_total,
            "head_first": head_first}


def slot_budget(engine: SlotEngineConfig, gpu: GpuSpec, model: ModelSpec, ws: WeightSplit,
                 geo: KvGeometry, lay: dict, n_layers_gpu: int, n_ctx: int, n_ctx_seq: int,
                 driver: int, display: int, logs: list[str], notes: list[str],
                 estimate: OllamaEstimate | None = None,
                 failure: str | None = None, cpu_expert_layers: int = 0,
                 head: bool | None = None) -> MemoryBudget:
    """The one-GPU budget of ``n_layers_gpu`` layers on the GPU (``head``: where the
    output layer is, where the runner decided it apart from the layer count)."""
    L, first = model.num_layers, lay["head_first"]
    kv_gpu = lay["kv_total"] * n_layers_gpu // L
    experts_ram = cpu_expert_layers * ws.expert_bytes_per_layer
    rates = geo.rates()  # NOTE: the iSWA cache caps the windowed layers (§3.3)
    b = MemoryBudget(
        engine=engine.preset, allocator=engine.allocator, device_bytes=gpu.usable_memory_bytes,
        driver_reserve_bytes=driver, display_reserve_bytes=display, weights_format=ws.format,
        weights_total_bytes=ws.loaded_bytes(n_layers_gpu, head_first=first, head=head),
        weights_gpu_bytes=ws.gpu_bytes(n_layers_gpu, head_first=first, head=head) - experts_ram,
        weights_cpu_bytes=ws.cpu_bytes(n_layers_gpu, head_first=first, head=head) + experts_ram,
        cpu_expert_layers=cpu_expert_layers,
        head_on_gpu=ws.head_on_gpu(n_layers_gpu, first, head),
        gpu_layers=n_layers_gpu, num_layers=L, activation_bytes=lay["compute"],
        engine_overhead_bytes=0, cache_type_k=geo.cache_type_k, cache_type_v=geo.cache_type_v,
        kv_bytes_per_token=rates.pop("kv_bytes_per_token"), kv_reserved_bytes=kv_gpu,
        kv_cpu_bytes=lay["kv_total"] - kv_gpu, kv_needed_bytes=kv_gpu, kv_pool_tokens=n_ctx,
        slot_tokens=n_ctx_seq, parallel=engine.parallel, estimate=estimate,
        extra={"swa_cells": tuple(lay["swa"]), **rates})
    if failure is None and b.total_bytes > gpu.usable_memory_bytes:
        failure = (f"cudaMalloc failed: out of memory — needs {format_bytes(b.total_bytes)} of "
                   f"{format_bytes(gpu.usable_memory_bytes)}")
    logs.append(f"{engine.preset}: KV cache {n_ctx} cells, {mib(lay['kv_total'])} in total, "
                f"{mib(kv_gpu)} on GPU; compute buffer size = {mib(lay['compute'])}")
    return replace(b, fits=failure is None, failure=failure, log_lines=tuple(logs),
                   notes=tuple(notes))
