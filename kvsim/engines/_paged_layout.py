"""The paged engines' load-time layout (vLLM §1.1, SGLang §2.1): a share of the device
holds weights and the KV block pool.

Shared by :mod:`kvsim.engines.vllm` and :mod:`kvsim.engines.sglang` (references are to
``docs/reference/engines.md``); the resulting fields are
:class:`kvsim.engines.memory.MemoryBudget`'s.  The peak activation is the one row no
reference pins exactly: ESTIMATE ≈ ``25 × hidden`` bytes per batched token + f32 logits of
``max_num_seqs`` sampled tokens; 25 × hidden reproduces the 2.07 GiB peak of vLLM issue
#10517 (Llama-3.1-8B, 20,480 batched tokens; §1.1) to within 0.3 %, and
``activation_bytes`` pins it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import format_bytes
from kvsim.engines.memory import MemoryBudget
from kvsim.model.geometry import KvGeometry, kv_geometry
from kvsim.model.hybrid import (
    hybrid_notes,
    hybrid_off_reason,
    pool_shape,
    too_long_refusal,
    vllm_kv_groups,
)
from kvsim.model.weights import model_weights

if TYPE_CHECKING:
    from kvsim.engines.config import PagedEngineConfig


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
                 driver: int, display: int, parallel: int, profiled_share: bool
                 ) -> MemoryBudget:
    """vLLM (§1.1) / SGLang (§2.1): a share of the device holds weights + pool.

    ``profiled_share``: vLLM's layout — the share also holds the profiled activations and
    non-torch memory, start-up refuses a share above the free memory, the hybrid KV cache
    manager groups sliding-window layers; False: SGLang's (weights + pool inside
    mem_fraction_static, activations and CUDA graphs outside).
    """
    geo = kv_geometry(model, engine.cache_type_k, engine.cache_type_v, state_dtype="f32")
    ws = model_weights(model, weights)
    act = paged_activation_bytes(model, engine)
    share = int(engine.gpu_memory_utilization * gpu.usable_memory_bytes)
    vllm = profiled_share
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
