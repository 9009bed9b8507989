"""Per-engine memory layouts behind :func:`kvsim.model.budget.memory_budget`.

Each function reproduces what one engine allocates at load (references are to
``docs/reference/engines.md``); see budget.py for the resulting fields.

Compute/activation buffers are the one row no reference pins exactly; the
estimates are marked ESTIMATE and every preset lets the user paste the engine's own
figure (``compute_buffer_bytes`` / ``activation_bytes``):

- llama.cpp compute buffer: :mod:`kvsim.model.compute_buffer` (what grows with the
  context — the attention masks, and without flash attention the KQ scores — read from
  llama.cpp's source and measured; the fixed part an ESTIMATE).
- vLLM/SGLang peak activation ≈ ``25 × hidden`` bytes per batched token + f32 logits
  of ``max_num_seqs`` sampled tokens; 25 × hidden reproduces the 2.07 GiB peak of
  issue #10517 (Llama-3.1-8B, 20,480 batched tokens; §1.1) to within 0.3 %.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvsim.config.engine import PagedEngineConfig, SlotEngineConfig
from kvsim.config.ollama import ollama_llama_server, ollama_memory_mode
from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import format_bytes
from kvsim.errors import InputError
from kvsim.model.budget import MIB, MemoryBudget, OllamaEstimate
from kvsim.model.compute_buffer import llama_cpp_compute_bytes
from kvsim.model.dtypes import cache_type
from kvsim.model.geometry import KvGeometry, kv_geometry
from kvsim.model.hybrid import (
    hybrid_notes,
    hybrid_off_reason,
    pool_shape,
    too_long_refusal,
    vllm_kv_groups,
)
from kvsim.model.weights import WeightSplit, model_weights

LLAMA_FIT_TARGET_BYTES = 1024 * MIB      # §3.6: --fit-target default 1024 MiB per device
LLAMA_FIT_CTX_TOKENS = 4096              # §3.6: --fit-ctx default, the floor of the shrink
OLLAMA_EST_BYTES = {"f16": 2.0, "q8_0": 1.0, "q4_0": 0.5}   # §4.2 (real: 2 / 1.0625 / 0.5625)


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def _mib(n: float) -> str:
    return f"{n / MIB:.2f} MiB"


def _check_quant_k(model: ModelSpec, geo: KvGeometry) -> None:
    """§3.2: quantized K needs head_dim divisible by the block size (32)."""
    k = cache_type(geo.cache_type_k)
    for g in model.layer_groups:
        dims = [g.head_dim_k] if g.kind != "mla" else [g.latent_dim]
        if k.block_elems > 1 and any(d % k.block_elems for d in dims if d):
            raise InputError("cache_type_k", geo.cache_type_k,
                             f"head dim {dims[0]} is not a multiple of {k.block_elems}; "
                             "use f16 or bf16")


def _slot_kv_bytes(geo: KvGeometry, n_ctx: int, n_ctx_seq: int, parallel: int,
                   unified: bool, n_ubatch: int) -> tuple[int, list[int]]:
    """KV bytes of llama.cpp's cache (§3.1, §3.3) and the SWA cell counts."""
    total = geo.full_bytes_per_token * n_ctx
    swa_cells = []
    for w in geo.windowed:
        per_stream = _pad(min(n_ctx_seq, (w.window_tokens or 0) * (parallel if unified else 1)
                              + n_ubatch), 256)
        cells = per_stream if unified else per_stream * parallel
        swa_cells.append(cells)
        total += w.bytes_per_token * cells
    return total + geo.recurrent_bytes_per_seq * parallel, swa_cells


def _layout(gpu: GpuSpec, model: ModelSpec, ws: WeightSplit, geo: KvGeometry, engine:
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

    def gpu_total(n: int) -> int:
        return (driver + display + ws.gpu_bytes(n, head_first=head_first) + compute
                + kv_total * n // L)

    return {"kv_total": kv_total, "swa": swa, "compute": compute, "gpu_total": gpu_total,
            "head_first": head_first}


def _slot_budget(engine: SlotEngineConfig, gpu: GpuSpec, model: ModelSpec, ws: WeightSplit,
                 geo: KvGeometry, lay: dict, n_layers_gpu: int, n_ctx: int, n_ctx_seq: int,
                 driver: int, display: int, logs: list[str], notes: list[str],
                 estimate: OllamaEstimate | None = None,
                 failure: str | None = None, cpu_expert_layers: int = 0) -> MemoryBudget:
    L, first = model.num_layers, lay["head_first"]
    kv_gpu = lay["kv_total"] * n_layers_gpu // L
    experts_ram = cpu_expert_layers * ws.expert_bytes_per_layer
    rates = geo.rates()  # NOTE: the iSWA cache caps the windowed layers (§3.3)
    b = MemoryBudget(
        engine=engine.preset, allocator=engine.allocator, device_bytes=gpu.usable_memory_bytes,
        driver_reserve_bytes=driver, display_reserve_bytes=display, weights_format=ws.format,
        weights_total_bytes=ws.loaded_bytes(n_layers_gpu, head_first=first),
        weights_gpu_bytes=ws.gpu_bytes(n_layers_gpu, head_first=first) - experts_ram,
        weights_cpu_bytes=ws.cpu_bytes(n_layers_gpu, head_first=first) + experts_ram,
        cpu_expert_layers=cpu_expert_layers, head_on_gpu=ws.head_on_gpu(n_layers_gpu, first),
        gpu_layers=n_layers_gpu, num_layers=L, activation_bytes=lay["compute"],
        engine_overhead_bytes=0, cache_type_k=geo.cache_type_k, cache_type_v=geo.cache_type_v,
        kv_bytes_per_token=rates.pop("kv_bytes_per_token"), kv_reserved_bytes=kv_gpu,
        kv_cpu_bytes=lay["kv_total"] - kv_gpu, kv_needed_bytes=kv_gpu, kv_pool_tokens=n_ctx,
        slot_tokens=n_ctx_seq, parallel=engine.parallel, estimate=estimate,
        extra={"swa_cells": tuple(lay["swa"]), **rates})
    if failure is None and b.total_bytes > gpu.usable_memory_bytes:
        failure = (f"cudaMalloc failed: out of memory — needs {format_bytes(b.total_bytes)} of "
                   f"{format_bytes(gpu.usable_memory_bytes)}")
    logs.append(f"{engine.preset}: KV cache {n_ctx} cells, {_mib(lay['kv_total'])} in total, "
                f"{_mib(kv_gpu)} on GPU; compute buffer size = {_mib(lay['compute'])}")
    return replace(b, fits=failure is None, failure=failure, log_lines=tuple(logs),
                   notes=tuple(notes))


def _auto_placement(gpu: GpuSpec, L: int, gpu_total: Any, expert_bytes: int
                    ) -> tuple[int, int]:
    """--fit (§3.6): ``(layers on the GPU, of them with their experts in RAM)``.  An MoE
    model's routed experts go to system RAM first, a layer's at a time, keeping its
    attention and KV on the GPU; whole layers spill only when every expert is out."""
    room = gpu.usable_memory_bytes - LLAMA_FIT_TARGET_BYTES
    if not expert_bytes or gpu_total(L) <= room:
        return _auto_layers(gpu, L, gpu_total, LLAMA_FIT_TARGET_BYTES), 0
    moe = -(-(gpu_total(L) - room) // expert_bytes)
    if moe <= L:
        return L, moe
    n = _auto_layers(gpu, L, lambda k: gpu_total(k) - k * expert_bytes,
                     LLAMA_FIT_TARGET_BYTES)
    return n, n


def _auto_layers(gpu: GpuSpec, L: int, gpu_total, target: int) -> int:
    """--fit: most layers (filled from the back, after the output layer: ``gpu_total``
    counts the head) that leave ``target`` bytes free."""
    n = L
    while n > 0 and gpu_total(n) > gpu.usable_memory_bytes - target:
        n -= 1
    return n


def _fit_context(max_tokens: int, pad: int, fits: Any) -> int:
    """--fit with -c unset (§3.6): the training context if it ``fits`` with every layer
    on the GPU, else the largest multiple of ``pad`` that does, not below --fit-ctx."""
    if fits(max_tokens):
        return max_tokens
    lo, hi = max(LLAMA_FIT_CTX_TOKENS // pad, 1), max_tokens // pad
    while lo < hi:  # largest k with fits(k * pad); fits shrinks with the context
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * pad) else (lo, mid - 1)
    return lo * pad


def llama_cpp_budget(gpu: GpuSpec, model: ModelSpec, weights: str, engine: SlotEngineConfig,
                     driver: int, display: int) -> MemoryBudget:
    """llama-server (§3.1-§3.3, §3.6): -c padded to 256, unified pool or per-slot streams;
    with -c unset, --fit first shrinks the context, then places layers."""
    geo = kv_geometry(model, engine.cache_type_k, engine.cache_type_v, state_dtype="f32")
    _check_quant_k(model, geo)
    ws = model_weights(model, weights)
    unified, pad, L = engine.allocator == "unified", engine.context_pad_tokens, model.num_layers

    def layout(ctx: int) -> tuple[int, int, dict]:
        n_ctx = _pad(ctx, pad)
        n_ctx_seq = n_ctx if unified else _pad(n_ctx // engine.parallel, pad)
        n_ctx = n_ctx if unified else n_ctx_seq * engine.parallel
        # NOTE: --fit places the output layer first (§3.6); an explicit -ngl places it last
        return n_ctx, n_ctx_seq, _layout(gpu, model, ws, geo, engine, n_ctx, n_ctx_seq,
                                         unified, driver, display,
                                         head_first=engine.gpu_layers is None)

    ctx, notes = engine.context_tokens, []
    if engine.fit_context:
        room = gpu.usable_memory_bytes - LLAMA_FIT_TARGET_BYTES
        ctx = _fit_context(ctx, pad, lambda c: layout(c)[2]["gpu_total"](L) <= room)
        if ctx < engine.context_tokens:
            notes.append(f"-c unset: --fit shrank the context from the model's "
                         f"{engine.context_tokens} to {ctx} tokens")
    n_ctx, n_ctx_seq, lay = layout(ctx)
    moe = 0
    if engine.gpu_layers is None:
        n_gpu, moe = _auto_placement(gpu, L, lay["gpu_total"], ws.expert_bytes_per_layer)
        if moe:
            notes.append(f"--fit: the experts of {moe}/{L} layers in system RAM (as "
                         f"--n-cpu-moe {moe}); attention and KV stay on the GPU")
        if n_gpu < L:
            notes.append(f"--fit: only {n_gpu}/{L} layers leave 1 GiB free; the rest run on "
                         "the CPU (much slower decode)")
    else:
        n_gpu = min(engine.gpu_layers, L)
    kv_gpu = lay["kv_total"] * n_gpu // L
    logs = [(f"llama_context: n_seq_max = {engine.parallel}, n_ctx = {n_ctx}, n_ctx_seq = "
             f"{n_ctx_seq}, n_batch = {engine.n_batch}, n_ubatch = {engine.n_ubatch}, "
             f"flash_attn = {int(engine.flash_attn)}, kv_unified = {str(unified).lower()}"),
            f"load_tensors: offloaded {n_gpu}/{L} layers to GPU",
            f"llama_kv_cache: CUDA0 KV buffer size = {_mib(kv_gpu)}"]
    if geo.recurrent_bytes_per_seq:
        notes.append(f"recurrent state f32: {_mib(geo.recurrent_bytes_per_seq)} per sequence")
    return _slot_budget(engine, gpu, model, ws, geo, lay, n_gpu, n_ctx, n_ctx_seq,
                        driver, display, logs, notes, cpu_expert_layers=moe)


def _ollama_estimate(model: ModelSpec, engine: SlotEngineConfig, ws: WeightSplit,
                     kv_type: str, free_bytes: int,
                     measured: tuple[int, int] | None = None) -> OllamaEstimate:
    """§4.2 era-A estimator: under-counted KV, graph fallback, layers from the back;
    eras B/C (§4.3) place the same way with the ``measured`` (KV, graph) bytes."""
    per_elem = OLLAMA_EST_BYTES.get(kv_type, 2.0)
    ctx, kv_total = engine.context_tokens * engine.parallel, 0.0
    for g in model.layer_groups:
        if g.kind == "recurrent":
            kv_total += g.state_elements * 4 * g.layers * engine.parallel
        elif g.kind == "mla":
            kv_total += ctx * g.latent_dim * per_elem * g.layers
        else:
            kv_total += ctx * (g.head_dim_k + g.head_dim_v) * g.n_kv_heads * per_elem * g.layers
    ratio = model.num_attention_heads / model.num_kv_heads if model.num_kv_heads else 1.0
    graph = int(ratio * kv_total / 6)
    kv_total, graph = measured or (kv_total, graph)
    reserve = engine.gpu_overhead_bytes + engine.minimum_reserve_bytes + graph
    L = model.num_layers
    per_layer = ws.per_layer_bytes + kv_total / L
    head = ws.head_bytes
    if engine.gpu_layers is not None:
        n = min(engine.gpu_layers, L)
    elif reserve + L * per_layer + head <= free_bytes:
        n = L
    else:
        n = max(0, min(L - 1, int((free_bytes - reserve) // per_layer)))
    total = reserve + int(n * per_layer) + (head if n == L else 0)
    return OllamaEstimate(kv_bytes=int(kv_total * n / L), graph_bytes=graph,
                          reserve_bytes=reserve, total_bytes=total, gpu_layers=n)


def ollama_budget(gpu: GpuSpec, model: ModelSpec, weights: str, engine: SlotEngineConfig,
                  driver: int, display: int) -> MemoryBudget:
    """Ollama (§4.1-§4.4): the true layout is llama.cpp's with ``num_ctx × parallel`` cells
    in ``parallel`` slots; its release places the layers (``ollama_memory_mode``)."""
    notes, mode = [], ollama_memory_mode(engine, model)
    k, v = engine.cache_type_k, engine.cache_type_v
    if engine.ignored_cache_type:  # NOTE: the engine config already made the cache f16
        notes.append(f"OLLAMA_KV_CACHE_TYPE={engine.ignored_cache_type} ignored: flash "
                     "attention is off, so the cache is f16 (docs/reference/engines.md §4.1)")
    if mode == "llama-server":  # era D (§4.4): llama-server's --fit places the layers
        b = llama_cpp_budget(gpu, model, weights, ollama_llama_server(engine), driver, display)
        return replace(b, notes=tuple(notes) + b.notes)
    geo = kv_geometry(model, k, v, state_dtype="f32")
    _check_quant_k(model, geo)
    ws = model_weights(model, weights)
    num_ctx = _pad(engine.context_tokens, engine.context_pad_tokens)
    n_ctx, free, back = num_ctx * engine.parallel, gpu.usable_memory_bytes - display, 0
    lay = _layout(gpu, model, ws, geo, engine, n_ctx, num_ctx, False, driver, display)
    exact = (lay["kv_total"], lay["compute"]) if mode == "measured" else None
    est = _ollama_estimate(model, engine, ws, v, free, exact)
    while exact and back < 10 and lay["gpu_total"](est.gpu_layers) > gpu.usable_memory_bytes:
        back += 1  # §4.3: a failed allocation backs off: 10 %, 20 %, … of free VRAM unused
        est = _ollama_estimate(model, engine, ws, v, free * (10 - back) // 10, exact)
    L = model.num_layers
    offload = est.gpu_layers + (est.gpu_layers == L)      # + output layer on full offload
    logs = [(f"offload to cuda layers.model={L + 1} layers.offload={offload} "
             f"memory.required.full={format_bytes(est.total_bytes)} "
             f"memory.required.kv={format_bytes(est.kv_bytes)} "
             f"memory.graph.full={format_bytes(est.graph_bytes)}"),
            f"llama_kv_cache: CUDA0 KV buffer size = {_mib(lay['kv_total'] * est.gpu_layers // L)}"]
    if est.gpu_layers < L:
        notes.append(f"Ollama spills {L - est.gpu_layers}/{L} layers to CPU RAM "
                     "(partial offload: works, much slower)")
    if est.kv_bytes < lay["kv_total"] * est.gpu_layers // L:
        notes.append("Ollama's estimate under-counts this KV cache type (q8_0 as 1, q4_0 as "
                     "0.5 bytes/element; real 1.0625 / 0.5625)")
    failure = None
    if lay["gpu_total"](est.gpu_layers) > gpu.usable_memory_bytes:
        failure = ("cudaMalloc failed: out of memory — Ollama estimated "
                   f"{format_bytes(est.total_bytes)} but the runner needs "
                   f"{format_bytes(lay['gpu_total'](est.gpu_layers))}")
    return _slot_budget(engine, gpu, model, ws, geo, lay, est.gpu_layers, n_ctx, num_ctx,
                        driver, display, logs, notes, estimate=est, failure=failure)


def paged_activation_bytes(model: ModelSpec, engine: PagedEngineConfig) -> int:
    """ESTIMATE of the profiled peak activation (see module docstring)."""
    if engine.activation_bytes is not None:
        return engine.activation_bytes
    sampled = min(engine.max_num_seqs, engine.max_num_batched_tokens)
    return engine.max_num_batched_tokens * 25 * model.hidden_size + sampled * model.vocab_size * 4


def _paged_failure(gpu: GpuSpec, engine: PagedEngineConfig, short: bool, free: int,
                   share: int, pool: int, blocks: int, too_long: str | None) -> str | None:
    """The engine's own start-up refusal (§1.1), if any: too little free memory for the
    requested share (vLLM), no room for KV blocks, or a max seq len over the pool."""
    if short:
        return (f"Free memory on device ({format_bytes(free)}/"
                f"{format_bytes(gpu.usable_memory_bytes)}) on startup is less than desired "
                f"GPU memory utilization ({engine.gpu_memory_utilization}, "
                f"{format_bytes(share)})")
    if pool <= 0 or blocks <= 0:
        return ("No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine.")
    return too_long


def _paged_blocks(geo: KvGeometry, engine: PagedEngineConfig, pool: int, per_block: int
                  ) -> int:
    """Blocks the pool holds (``--num-gpu-blocks-override`` wins; SGLang's
    ``--max-total-tokens`` caps it in whole pages, §2.1); a pure recurrent model's pool
    holds states only, each counted as a max_model_len of blocks."""
    if engine.num_gpu_blocks_override is not None:
        return engine.num_gpu_blocks_override
    cap = engine.max_total_tokens
    n = max(0, pool - geo.fixed_bytes) // per_block if per_block else max(0, pool) // max(
        1, geo.recurrent_bytes_per_seq) * -(-engine.context_tokens // engine.block_tokens)
    return n if cap is None else min(n, cap // engine.block_tokens)


def _paged_kv_bytes(geo: KvGeometry, blocks: int, per_block: int, blocks_per_state: int
                    ) -> int:
    """The KV tensors the engine allocates: whole blocks (vLLM ``num_gpu_blocks =
    available // page_size``, §1.1), never the pool's remainder below one block.

    NOTE: fp8's per-tensor scales (``fixed_bytes``) are attention-layer parameters, not
    KV tensors: they come off the pool before it is divided (``paged_budget``).  A pure
    recurrent model holds one state per ``blocks_per_state`` blocks.
    """
    if per_block:
        return blocks * per_block
    return blocks // max(1, blocks_per_state) * geo.recurrent_bytes_per_seq


def paged_budget(gpu: GpuSpec, model: ModelSpec, weights: str, engine: PagedEngineConfig,
                 driver: int, display: int, parallel: int) -> MemoryBudget:
    """vLLM (§1.1) / SGLang (§2.1): a share of the device holds weights + pool."""
    geo = kv_geometry(model, engine.cache_type_k, engine.cache_type_v, state_dtype="f32")
    ws = model_weights(model, weights)
    act = paged_activation_bytes(model, engine)
    share = int(engine.gpu_memory_utilization * gpu.usable_memory_bytes)
    vllm = engine.preset == "vllm"
    inside = ws.total_bytes + (act + engine.non_torch_bytes if vllm else 0)
    pool = engine.kv_cache_memory_bytes if engine.kv_cache_memory_bytes is not None \
        else share - inside
    block = engine.block_tokens
    groups, off = vllm_kv_groups(model, geo, block, hybrid_off_reason(engine)) if vllm \
        else (None, None)
    per_block = groups.block_bytes if groups else block * geo.kv_bytes_per_token
    L, ctx = model.num_layers, engine.context_tokens
    blocks = _paged_blocks(geo, engine, pool, per_block)
    per_req, tokens, kv_needed, conc, fit_len = pool_shape(
        geo, groups, blocks, block, ctx, parallel, engine.max_num_batched_tokens)
    reserved = _paged_kv_bytes(geo, blocks, per_block, -(-ctx // block))
    overhead = engine.non_torch_bytes + engine.cuda_graph_bytes
    free = gpu.usable_memory_bytes - driver - display
    failure = _paged_failure(gpu, engine, vllm and engine.kv_cache_memory_bytes is None
                             and free < share, free, share, pool, blocks,
                             too_long_refusal(ctx, tokens, groups, per_req, blocks, fit_len))
    logs = [f"GPU KV cache size: {tokens:,} tokens",
            f"Maximum concurrency for {ctx:,} tokens per request: {conc:.2f}x"]
    if not vllm:
        logs.insert(0, f"mem_fraction_static={engine.gpu_memory_utilization}, "
                       f"max_total_tokens={tokens}, page_size={block}")
    notes = hybrid_notes(geo, groups, off, per_req, vllm)
    rates = geo.rates(windows_capped=groups is not None)
    b = MemoryBudget(
        engine=engine.preset, allocator="paged", device_bytes=gpu.usable_memory_bytes,
        driver_reserve_bytes=driver, display_reserve_bytes=display, weights_format=ws.format,
        weights_total_bytes=ws.total_bytes, weights_gpu_bytes=ws.total_bytes,
        weights_cpu_bytes=0, gpu_layers=L, num_layers=L, activation_bytes=act,
        engine_overhead_bytes=overhead if vllm else engine.cuda_graph_bytes,
        cache_type_k=geo.cache_type_k, cache_type_v=geo.cache_type_v,
        kv_bytes_per_token=rates.pop("kv_bytes_per_token"), kv_reserved_bytes=reserved,
        kv_cpu_bytes=0, kv_needed_bytes=kv_needed, kv_pool_tokens=tokens, slot_tokens=ctx, parallel=parallel,
        block_tokens=block, num_gpu_blocks=blocks, max_concurrency=conc, log_lines=tuple(logs),
        notes=tuple(notes), extra={"max_num_seqs": engine.max_num_seqs, "share_bytes": share,
                                   "max_model_len_fit": fit_len, "kv_pool_bytes": pool,
                                   **rates},
        kv_groups=groups.kinds if groups else (), blocks_per_request=per_req or None)
    if failure is None and b.total_bytes > gpu.usable_memory_bytes:
        failure = (f"CUDA out of memory: {format_bytes(b.total_bytes)} needed of "
                   f"{format_bytes(gpu.usable_memory_bytes)}")
    return replace(b, fits=failure is None, failure=failure)
