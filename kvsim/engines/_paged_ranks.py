"""The paged engines' layout over several GPUs: ``tensor_parallel_size`` ×
``pipeline_parallel_size`` ranks, one per GPU (vLLM, SGLang).

Each rank sizes its own share exactly as one GPU does (kvsim.engines._paged_layout): its
memory share of the total its driver reports, less its weights, profiled activations,
non-torch memory and (from vLLM 0.21) CUDA graphs; the rest holds KV blocks of its part of
every token.  What a rank holds (docs/reference/engines.md §1.10):

- **pipeline stage** ``s`` of ``pp``: the repeating layers vLLM's ``get_pp_indices`` gives it
  (``L // pp`` each, the remainder one more each from the second-to-last stage backwards,
  so the first and last stages, which also hold the embedding and the head, get none);
  the token embedding on the first stage, the output head on the last (a tied head on
  both when ``pp > 1``), the sampler's logits on the last;
- **tensor rank** of ``tp``: ``1/tp`` of every matrix (column / row parallel linears, the
  vocabulary-parallel embedding and head, MoE experts' widths), except the K/V
  projections when a layer has fewer KV heads than ranks: each rank then holds one whole
  KV head (``max(1, n_kv // tp)`` heads, replicated); its KV cache holds those heads of
  its stage's layers.  An MLA layer's latent is not split: every rank holds all of it.
  The profiling pass's MLP activations are ``1/tp`` wide, the hidden states whole;
- the **image encoder** of a vision-language checkpoint (kvsim.model.vision) on the first
  stage, ``1/tp`` of it per rank (vLLM's default ``mm_encoder_tp_mode`` ``weights`` splits
  its layers over the tensor ranks, as the language model's).

The engine then takes the **smallest** block count over the ranks for all of them
(vLLM ``get_kv_cache_configs``; SGLang's ``max_total_num_tokens`` is the minimum over its
TP ranks too), so the fullest GPU sizes the pool: ``GPU KV cache size`` is that many
blocks of whole tokens.

NOTE: the share, the failure "Free memory on device ... is less than desired" and "No
available memory for the cache blocks" are per rank: one short GPU refuses the start-up.
The stage of a sliding-window or recurrent layer is taken as uniform over the layers
(``layers / L`` of each group per stage), exact for models whose layers are alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING

from kvsim.config.specs import ATTENTION_KINDS
from kvsim.config.units import format_bytes
from kvsim.engines._gpu_checks import check_parallel_sizes
from kvsim.engines._paged_layout import (
    ACTIVATION_BYTES,
    kv_groups_of,
    mlp_width,
    paged_budget,
    sampler_peak_bytes,
)
from kvsim.engines.memory import DeviceShare, MemoryBudget, Split
from kvsim.engines.vllm_encoder import encoder_pass, loaded_vision_bytes, with_encoder_pass
from kvsim.errors import InputError
from kvsim.model.geometry import kv_geometry
from kvsim.model.hybrid import pool_shape, too_long_refusal
from kvsim.model.weights import WeightSplit, model_weights

if TYPE_CHECKING:
    from kvsim.config.specs import GpuSpec, ModelSpec
    from kvsim.engines.config import PagedEngineConfig


def pp_partitions(num_layers: int, pp: int) -> list[int]:
    """Repeating layers per pipeline stage, vLLM's default ``get_pp_indices`` rule: equal
    parts, the remainder one more each from the second-to-last stage backwards."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def kv_head_fraction(model: ModelSpec, tp: int) -> Fraction:
    """The share of each token's KV one tensor rank holds: ``max(1, n_kv // tp) / n_kv``
    of an attention layer's heads (replicated below one head per rank), an MLA latent
    whole; weighted by the groups' bytes per token."""
    geo = kv_geometry(model)
    total, held = 0, Fraction(0)
    attention = [g for g in model.layer_groups if g.kind in ATTENTION_KINDS]
    for gb, lg in zip(geo.groups, attention, strict=True):
        n_kv = lg.n_kv_heads or model.num_kv_heads
        frac = Fraction(1) if gb.kind == "mla" or n_kv == 0 else \
            Fraction(max(1, n_kv // tp), n_kv)
        total += gb.bytes_per_token
        held += frac * gb.bytes_per_token
    return held / total if total else Fraction(1, tp)


@dataclass(frozen=True)
class RankPart:
    """What one rank holds of the model (bytes on its GPU)."""

    index: int          # CUDA device: stage * tp + tensor rank (vLLM's rank order)
    gpu: GpuSpec
    stage: int
    layers: int
    kv_fraction: Fraction   # of each token's whole-model KV
    weights_bytes: int
    activation_bytes: int
    last_stage: bool


def _rank_weights(ws: WeightSplit, model: ModelSpec, tp: int, layers: int, first: bool,
                  last: bool, pp: int) -> int:
    """A rank's weights: ``1/tp`` of its stage's layers (K/V projections of a layer with
    fewer KV heads than ranks whole per head), of the embedding (first stage) and of
    the head (last stage; a tied head there too when the stages differ)."""
    kv_proj = 2 * model.hidden_size * model.num_kv_heads * model.head_dim
    kv_proj_bytes = int(kv_proj * ws.bits_per_weight / 8)
    kv_rank = max(1, model.num_kv_heads // tp) if model.num_kv_heads else 0
    replicated = (kv_proj_bytes * kv_rank // model.num_kv_heads - kv_proj_bytes // tp
                  if model.num_kv_heads else 0)
    per_layer = ws.per_layer_bytes // tp + max(0, replicated)
    edge = (ws.embedding_bytes if first else 0) + \
        (ws.head_bytes if last and (not ws.tied or pp > 1 or not first) else 0)
    return layers * per_layer + edge // tp


def _rank_activation(model: ModelSpec, engine: PagedEngineConfig, tp: int, first: bool,
                     last: bool, vllm: bool) -> int:
    """The profiling pass's peak on one rank (kvsim.engines._paged_layout's estimate with
    the MLP ``1/tp`` wide; the sampler's full-vocabulary logits on the last stage; vLLM's
    pass over the image encoder on the first, kvsim.engines.vllm_encoder)."""
    if engine.activation_bytes is not None:
        return engine.activation_bytes
    tokens, h = engine.max_num_batched_tokens, model.hidden_size
    k = model.num_experts_active or 3
    act = tokens * ACTIVATION_BYTES * (3 * mlp_width(model) // tp + k * h)
    if last:
        act = max(act, sampler_peak_bytes(model, engine, vllm))
    return with_encoder_pass(act, model, encoder_pass(model, engine), tp) if vllm and first \
        else act


def rank_parts(gpus: tuple[GpuSpec, ...], model: ModelSpec, weights: str,
               engine: PagedEngineConfig, vllm: bool = True) -> list[RankPart]:
    """Each rank's part, in CUDA device order (``gpus[stage * tp + t]``); ``vllm``: its
    profiling pass (the encoder's included) sizes the activations."""
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    ws, heads = model_weights(model, weights), kv_head_fraction(model, tp)
    parts = []
    for s, layers in enumerate(pp_partitions(model.num_layers, pp)):
        first, last = s == 0, s == pp - 1
        w = _rank_weights(ws, model, tp, layers, first, last, pp) \
            + (loaded_vision_bytes(model, engine) // tp if first else 0)  # NOTE: stage 0
        act = _rank_activation(model, engine, tp, first, last, vllm)
        frac = heads * Fraction(layers, model.num_layers)
        parts += [RankPart(s * tp + t, gpus[s * tp + t], s, layers, frac, w, act, last)
                  for t in range(tp)]
    return parts


@dataclass(frozen=True)
class _RankPool:
    part: RankPart
    share_bytes: int
    pool_bytes: int
    per_block_bytes: int
    blocks: int
    overhead_bytes: int
    short: bool


def _rank_pool(p: RankPart, engine: PagedEngineConfig, whole_per_block: int,
               fixed_bytes: int, driver: int, display: int, vllm: bool) -> _RankPool:
    """One rank's share, pool and blocks (the one-GPU arithmetic on its part)."""
    total = p.gpu.reported_memory_bytes
    share = int(engine.gpu_memory_utilization * total)
    graphs = engine.cuda_graph_bytes if vllm and engine.cuda_graphs_in_budget else 0
    inside = p.weights_bytes + (p.activation_bytes + engine.non_torch_bytes if vllm else 0) \
        + graphs
    pool = engine.kv_cache_memory_bytes if engine.kv_cache_memory_bytes is not None \
        else share - inside
    per_block = int(whole_per_block * p.kv_fraction)
    fixed = int(fixed_bytes * p.kv_fraction)
    blocks = max(0, pool - fixed) // per_block if per_block else 0
    overhead = (max(0, engine.non_torch_bytes - driver) if vllm else 0) + engine.cuda_graph_bytes
    free = total - driver - (display if p.index == 0 else 0)
    short = vllm and engine.kv_cache_memory_bytes is None and free < share
    return _RankPool(p, share, pool, per_block, blocks, overhead, short)


def _box_blocks(pools: list[_RankPool], engine: PagedEngineConfig) -> int:
    """The block count every rank takes: the smallest rank's, or the override / cap."""
    if engine.num_gpu_blocks_override is not None:
        return engine.num_gpu_blocks_override
    n = min(r.blocks for r in pools)
    cap = engine.max_total_tokens
    return n if cap is None else min(n, cap // engine.block_tokens)


def _split(tp: int, pp: int) -> Split:
    return "tensor" if pp == 1 else "pipeline" if tp == 1 else "tensor+pipeline"


def _rank_failure(pools: list[_RankPool], blocks: int, engine: PagedEngineConfig
                  ) -> str | None:
    """The first rank's start-up refusal: too little free memory for its share, or no
    room for a block on the fullest rank."""
    for r in pools:
        if r.short:
            return (f"(rank {r.part.index}, {r.part.gpu.name}) Free memory on device is "
                    f"less than desired GPU memory utilization "
                    f"({engine.gpu_memory_utilization}, {format_bytes(r.share_bytes)})")
    if blocks <= 0:
        worst = min(pools, key=lambda r: r.blocks)
        return (f"(rank {worst.part.index}, {worst.part.gpu.name}) No available memory for "
                "the cache blocks. Try increasing `gpu_memory_utilization` when "
                "initializing the engine.")
    return None


def _device_share(r: _RankPool, blocks: int, driver: int, display: int, tp: int
                  ) -> DeviceShare:
    p = r.part
    return DeviceShare(
        index=p.index, gpu=p.gpu.name, device_bytes=p.gpu.reported_memory_bytes,
        layers=p.layers, weight_fraction=1 / tp, weights_bytes=p.weights_bytes,
        kv_bytes=blocks * r.per_block_bytes, compute_bytes=p.activation_bytes,
        overhead_bytes=driver + (display if p.index == 0 else 0) + r.overhead_bytes,
        holds_output=p.last_stage)


def box_budget(gpus: tuple[GpuSpec, ...], model: ModelSpec, weights: str,
               engine: PagedEngineConfig, driver: int, display: int, parallel: int,
               profiled_share: bool) -> MemoryBudget:
    """The layout of ``tp x pp`` ranks over ``gpus`` (module docstring): the box's pool
    (the fewest blocks any rank holds), byte rows summed over the GPUs, ``devices`` per
    GPU.  One GPU is :func:`kvsim.engines._paged_layout.paged_budget` itself."""
    if len(gpus) == 1:
        return paged_budget(gpus[0], model, weights, engine, driver, display, parallel,
                            profiled_share)
    check_parallel_sizes(engine, len(gpus))
    geo = kv_geometry(model, engine.cache_type_k, engine.cache_type_v, state_dtype="f32")
    groups = kv_groups_of(model, geo, engine)[0] if profiled_share else None
    per_block = groups.block_bytes if groups else engine.block_tokens * geo.kv_bytes_per_token
    if not per_block:
        raise InputError("engine.tensor_parallel_size", engine.tensor_parallel_size,
                         f"1 GPU for {model.name}: kvsim lays out a model with attention "
                         "layers over several GPUs, not a pure recurrent one")
    pools = [_rank_pool(p, engine, per_block, geo.fixed_bytes, driver, display,
                        profiled_share)
             for p in rank_parts(gpus, model, weights, engine, profiled_share)]
    blocks = _box_blocks(pools, engine)
    one = paged_budget(gpus[0], model, weights,
                       engine.model_copy(update={"num_gpu_blocks_override": max(1, blocks)}), driver,
                       display, parallel, profiled_share)
    ctx = engine.context_tokens
    per_req, tokens, _, _, fit_len = pool_shape(geo, groups, max(0, blocks),
                                                groups.block_tokens if groups
                                                else engine.block_tokens, ctx, parallel,
                                                engine.max_num_batched_tokens)
    too_long = too_long_refusal(ctx, tokens, groups, per_req, max(0, blocks), fit_len)
    return _assemble(one, pools, blocks, engine, driver, display, profiled_share, too_long)


def _assemble(one: MemoryBudget, pools: list[_RankPool], blocks: int,
              engine: PagedEngineConfig, driver: int, display: int, vllm: bool,
              too_long: str | None) -> MemoryBudget:
    """The box's MemoryBudget from the one-GPU figures of the pool's shape (``one``: the
    whole model with ``blocks`` blocks, its bytes and failure those of one GPU holding
    everything, replaced here) and each rank's bytes."""
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    devices = tuple(_device_share(r, blocks, driver, display, tp) for r in pools)
    box_per_token = sum(int(one.kv_bytes_per_token * r.part.kv_fraction) for r in pools)
    ratio = Fraction(sum(r.per_block_bytes for r in pools), max(1, one.kv_reserved_bytes
                                                                // max(1, blocks)))
    failure = _rank_failure(pools, blocks, engine) or too_long
    over = [d for d in devices if d.total_bytes > d.device_bytes]
    if failure is None and over:
        failure = (f"(rank {over[0].index}, {over[0].gpu}) CUDA out of memory: "
                   f"{format_bytes(over[0].total_bytes)} needed of "
                   f"{format_bytes(over[0].device_bytes)}")
    logs = [line for line in one.log_lines
            if not line.startswith(("vLLM ", "mem_fraction", "Available KV cache memory"))]
    logs[:0] = [f"(rank {r.part.index}, {r.part.gpu.name}) "
                + (f"Available KV cache memory: {r.pool_bytes / 2**30:.2f} GiB" if vllm
                   else f"max_total_num_tokens={r.blocks * engine.block_tokens}")
                for r in pools]
    return replace(
        one, device_bytes=sum(d.device_bytes for d in devices),
        driver_reserve_bytes=driver * len(pools),
        weights_gpu_bytes=sum(r.part.weights_bytes for r in pools),
        activation_bytes=sum(r.part.activation_bytes for r in pools),
        engine_overhead_bytes=sum(r.overhead_bytes for r in pools),
        kv_bytes_per_token=box_per_token,
        kv_reserved_bytes=sum(d.kv_bytes for d in devices),
        kv_needed_bytes=int(one.kv_needed_bytes * ratio), num_gpu_blocks=max(0, blocks),
        fits=failure is None, failure=failure, log_lines=tuple(logs),
        extra={**one.extra, "share_bytes": [r.share_bytes for r in pools],
               "kv_pool_bytes": [r.pool_bytes for r in pools]},
        split=_split(tp, pp), devices=devices, tensor_parallel=tp, pipeline_parallel=pp)
