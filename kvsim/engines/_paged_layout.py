"""The paged engines' load-time layout (vLLM §1.1, SGLang §2.1): a share of the device
holds weights and the KV block pool.

Shared by :mod:`kvsim.engines.vllm` and :mod:`kvsim.engines.sglang` (references are to
``docs/reference/engines.md``); the resulting fields are
:class:`kvsim.engines.memory.MemoryBudget`'s.

The share is of the total the driver reports (``GpuSpec.reported_memory_bytes``: vLLM's
``total_gpu_memory``), not the marketed size.  The profiled peak activation
(:func:`paged_activation_bytes`) is the profiling pass's largest live tensors: per batched
token, the MLP's gate/up output, its activated product and the residual stream in 16-bit,
``2 × (3 × I + k × H)`` bytes (``I`` the MLP width a token runs through, all its experts' for
a MoE model; ``k`` = 3 hidden-sized tensors, a MoE layer's per-expert outputs instead: its
active experts), or, when larger, the dummy sampler's top-k / top-p temporaries over
``max_num_seqs`` rows of logits (:func:`sampler_bytes_per_logit`) beside the hidden
states.  It reproduces vLLM issue #10517 (V0, RTX 3090, Llama-3.1-8B: 2.07 GiB at
max_model_len 20000 and 2.99 GiB at 29000, §1.1) to within 0.6 %; ``activation_bytes``
pins it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import format_bytes
from kvsim.engines.memory import MemoryBudget
from kvsim.engines.vllm_encoder import (
    EncoderPass,
    encoder_pass,
    encoder_peak_bytes,
    loaded_vision_bytes,
    with_encoder_pass,
)
from kvsim.engines.vllm_releases import vllm_release
from kvsim.model.geometry import KvGeometry, kv_geometry
from kvsim.model.hybrid import (
    KVCacheGroups,
    hybrid_notes,
    hybrid_off_reason,
    mamba_blocks_per_group,
    pool_shape,
    too_long_refusal,
    vllm_kv_groups,
)
from kvsim.model.vision import vision_bytes, vision_params
from kvsim.model.weights import model_weights, tied_embeddings

if TYPE_CHECKING:
    from kvsim.engines.config import PagedEngineConfig


ACTIVATION_BYTES = 2
"""The profiling pass runs in the model's 16-bit dtype, whatever the weights' format."""
SAMPLER_BYTES_PER_LOGIT = 8
"""ESTIMATE for SGLang, which runs no profiling pass: f32 logits and f32 probabilities of
each sampled row (its activations sit outside ``mem_fraction_static``)."""
VLLM_SAMPLER_BYTES_PER_LOGIT = 38
"""What vLLM's profiling pass's dummy sampler holds per logit at its peak: the 16-bit and
f32 logits, then the sort-based top-k / top-p filter's sorted values, int64 sort indices,
masks, softmax and re-ordered logits (the dummy requests ask for both filters).  Measured,
not derived: vLLM PR #21429's debug line (Qwen3-235B-A22B-FP8, TP 4, H200, V1's defaults
of 1,024 sequences and 8,192 batched tokens) prints a torch peak of 5.62 GiB, which less
the 8,192 hidden states is 38.4 B for each of the 1,024 × 151,936 logits (kept as 38:
5.57 GiB).  Held out, in ../shared/measurements/engine-memory-logs.csv: vllm-020's
printed V0 peak (1.26 GiB; 1.22 GiB here) and vllm-009's pool (0.19, Gemma 4: +0.2 %;
+8.9 % at 8 B)."""


def mlp_width(model: ModelSpec) -> int:
    """The MLP width one token runs through (a MoE model: its active experts' together),
    from the active parameters less the embeddings and attention projections (Llama-3.1-8B
    gives 14336, Qwen2.5-7B 18939 of 18944); at least ``hidden_size``."""
    h, heads = model.hidden_size, model.num_attention_heads or 1
    hd = model.head_dim or h // heads
    embed = model.vocab_size * h * (1 if tied_embeddings(model) else 2)
    attn = 2 * h * heads * hd + 2 * h * model.num_kv_heads * hd
    per_layer = (model.params_active - embed) / model.num_layers - attn
    return max(h, int(per_layer / (3 * h)))


def sampler_bytes_per_logit(vllm: bool) -> int:
    """Bytes a sampled row holds per vocabulary entry at the activation peak: vLLM's
    profiling pass (``vllm``) or SGLang's estimate."""
    return VLLM_SAMPLER_BYTES_PER_LOGIT if vllm else SAMPLER_BYTES_PER_LOGIT


def sampler_peak_bytes(model: ModelSpec, engine: PagedEngineConfig, vllm: bool) -> int:
    """The sampling step's peak over ``max_num_seqs`` rows beside the batch's hidden
    states (:func:`sampler_bytes_per_logit`): one rank's when it holds the sampler."""
    tokens = engine.max_num_batched_tokens
    rows = min(engine.max_num_seqs, tokens)
    return tokens * ACTIVATION_BYTES * model.hidden_size \
        + rows * model.vocab_size * sampler_bytes_per_logit(vllm)


def paged_activation_bytes(model: ModelSpec, engine: PagedEngineConfig,
                           vllm: bool = True) -> int:
    """ESTIMATE of the profiled peak activation over ``max_num_batched_tokens`` dummy
    tokens and ``max_num_seqs`` sampled rows (see module docstring; ``vllm``: vLLM's
    dummy sampler, else SGLang's)."""
    if engine.activation_bytes is not None:
        return engine.activation_bytes
    tokens, h = engine.max_num_batched_tokens, model.hidden_size
    k = model.num_experts_active or 3
    forward = tokens * ACTIVATION_BYTES * (3 * mlp_width(model) + k * h)
    return max(forward, sampler_peak_bytes(model, engine, vllm))


def _profiled_activation(model: ModelSpec, engine: PagedEngineConfig,
                         p: EncoderPass | None, vllm: bool) -> tuple[int, list[str]]:
    """The activation peak the share holds, and what vLLM prints of its encoder pass
    ``p`` (kvsim.engines.vllm_encoder: vLLM's profiling pass runs a vision-language
    checkpoint's image encoder too); a given ``activation_bytes`` wins."""
    act = paged_activation_bytes(model, engine, vllm)
    if p is None or engine.activation_bytes is not None:
        return act, []
    return with_encoder_pass(act, model, p), [p.log_line()]


def vision_notes(model: ModelSpec, engine: PagedEngineConfig, vllm: bool,
                 p: EncoderPass | None) -> list[str]:
    """What the weights row holds of a vision-language checkpoint's image encoder (and,
    on vLLM, what its profiling pass ``p`` over the encoder takes,
    kvsim.engines.vllm_encoder)."""
    v = model.vision_encoder
    if v is None:
        return []
    if engine.language_model_only:
        return [(f"{model.name} is a vision-language checkpoint: with --language-model-only "
                 f"vLLM builds no image encoder ({format_bytes(vision_bytes(model))} not "
                 "loaded) and profiles none; requests with images are refused")]
    if p is not None:
        tp = engine.tensor_parallel_size
        each = f" on each of {tp} tensor ranks" if tp > 1 else ""
        profiled = (f"; its profiling pass encodes {p.items} dummy image(s) of "
                    f"{p.tokens_per_item:,} tokens, an activation peak of "
                    f"{format_bytes(encoder_peak_bytes(model, p, tp))}{each} the KV pool "
                    "gives up unless the language model's dummy batch needs more (ESTIMATE)")
    elif vllm and v.video_largest:
        profiled = ("; vLLM's profiling pass also encodes a dummy video as long as "
                    "max_model_len allows, which kvsim does not size (many GiB at a long "
                    "context: vLLM PR #25631; --limit-mm-per-prompt '{\"video\": 0}' avoids "
                    "it): the KV pool here is too large")
    elif vllm:
        profiled = ("; vLLM's profiling pass also runs the encoder on dummy images, which "
                    "kvsim does not size here (the largest image is not known, or V0)")
    else:
        profiled = ""
    return [(f"{model.name} is a vision-language checkpoint: {engine.preset} loads its image "
             f"encoder ({vision_params(v) / 1e6:,.0f} M parameters, "
             f"{format_bytes(vision_bytes(model))} in 16-bit) with the weights{profiled}")]


def _paged_failure(gpu: GpuSpec, engine: PagedEngineConfig, short: bool, free: int,
                   share: int, pool: int, blocks: int, too_long: str | None) -> str | None:
    """The engine's own start-up refusal (§1.1), if any: too little free memory for the
    requested share (vLLM), no room for KV blocks, or a max seq len over the pool."""
    if short:
        return (f"Free memory on device ({format_bytes(free)}/"
                f"{format_bytes(gpu.reported_memory_bytes)}) on startup is less than desired "
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


def _vllm_profile_lines(engine: PagedEngineConfig, total: int, weights: int, act: int,
                        pool: int, blocks: int) -> list[str]:
    """What vLLM prints of its profiling pass (§1.1, docs/reference/engines.md §1.9): the
    budget and its parts, and V0's block count or V1's KV memory."""
    gib = 2**30
    graphs = (f"; CUDA graph memory {engine.cuda_graph_bytes / gib:.2f}GiB"
              if engine.cuda_graphs_in_budget else "")
    budget = (f"vLLM {engine.version}: total_gpu_memory ({total / gib:.2f}GiB) x "
              f"gpu_memory_utilization ({engine.gpu_memory_utilization:.2f}) = "
              f"{engine.gpu_memory_utilization * total / gib:.2f}GiB; model weights take "
              f"{weights / gib:.2f}GiB; non_torch_memory takes "
              f"{engine.non_torch_bytes / gib:.2f}GiB; PyTorch activation peak memory takes "
              f"{act / gib:.2f}GiB{graphs}")
    lines = [budget]
    if vllm_release(engine.version).engine == "V0":
        return [*lines, f"# GPU blocks: {blocks}"]
    return [*lines, f"Available KV cache memory: {pool / gib:.2f} GiB"]


def _sglang_pool_line(engine: PagedEngineConfig, tokens: int, page: int) -> str:
    """What SGLang prints of its pool (§2.1)."""
    return (f"mem_fraction_static={engine.gpu_memory_utilization}, max_total_tokens={tokens}, "
            f"page_size={page}")


def kv_groups_of(model: ModelSpec, geo: KvGeometry, engine: PagedEngineConfig
                 ) -> tuple[KVCacheGroups | None, str | None]:
    """vLLM's KV cache groups for this engine's release and settings
    (kvsim.model.hybrid.vllm_kv_groups)."""
    return vllm_kv_groups(model, geo, engine.block_tokens, hybrid_off(engine),
                          mamba_blocks_per_group(engine.enable_prefix_caching))


def sim_groups(groups: KVCacheGroups | None) -> tuple[tuple[str, int], ...]:
    """The groups the simulator's hybrid manager takes: a sliding-window model's.  NOTE:
    a Mamba hybrid's pool is simulated as blocks of its raised block size, without the
    per-request Mamba blocks (kvsim.core knows no Mamba group)."""
    return groups.kinds if groups and not groups.mamba else ()


def hybrid_off(engine: PagedEngineConfig) -> str | None:
    """Why vLLM's hybrid KV cache manager is off (None: on): the settings'
    (kvsim.model.hybrid.hybrid_off_reason) or the release's — V0 has none."""
    if vllm_release(engine.version).engine == "V0":
        return f"vLLM {engine.version} is the V0 engine, which has no hybrid KV cache manager"
    return hybrid_off_reason(engine)


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
    weights_b = ws.total_bytes + loaded_vision_bytes(model, engine)  # NOTE: its encoder
    vllm = profiled_share
    encoder = encoder_pass(model, engine) if vllm else None
    act, encoder_lines = _profiled_activation(model, engine, encoder, vllm)
    total = gpu.reported_memory_bytes
    share = int(engine.gpu_memory_utilization * total)
    graphs_in = vllm and engine.cuda_graphs_in_budget
    inside = weights_b + (act + engine.non_torch_bytes if vllm else 0) \
        + (engine.cuda_graph_bytes if graphs_in else 0)
    pool = engine.kv_cache_memory_bytes if engine.kv_cache_memory_bytes is not None \
        else share - inside
    groups, off = kv_groups_of(model, geo, engine) if vllm else (None, None)
    block = groups.block_tokens if groups else engine.block_tokens
    per_block = groups.block_bytes if groups else block * geo.kv_bytes_per_token
    L, ctx = model.num_layers, engine.context_tokens
    blocks = _paged_blocks(geo, engine, pool, per_block)
    per_req, tokens, kv_needed, conc, fit_len = pool_shape(
        geo, groups, blocks, block, ctx, parallel, engine.max_num_batched_tokens)
    reserved = _paged_kv_bytes(geo, blocks, per_block, -(-ctx // block))
    # NOTE: vLLM's non-torch memory includes the CUDA context, which the driver row holds
    overhead = max(0, engine.non_torch_bytes - driver) + engine.cuda_graph_bytes
    free = total - driver - display
    failure = _paged_failure(gpu, engine, vllm and engine.kv_cache_memory_bytes is None
                             and free < share, free, share, pool, blocks,
                             too_long_refusal(ctx, tokens, groups, per_req, blocks, fit_len))
    logs = [*encoder_lines,
            *(_vllm_profile_lines(engine, total, weights_b, act, pool, blocks) if vllm
              else [_sglang_pool_line(engine, tokens, block)]),
            f"GPU KV cache size: {tokens:,} tokens",
            f"Maximum concurrency for {ctx:,} tokens per request: {conc:.2f}x"]
    notes = [*hybrid_notes(geo, groups, off, per_req, vllm),
             *vision_notes(model, engine, vllm, encoder)]
    rates = geo.rates(windows_capped=groups is not None)
    b = MemoryBudget(
        engine=engine.preset, allocator="paged", device_bytes=total,
        driver_reserve_bytes=driver, display_reserve_bytes=display, weights_format=ws.format,
        weights_total_bytes=weights_b, weights_gpu_bytes=weights_b,
        weights_cpu_bytes=0, gpu_layers=L, num_layers=L, activation_bytes=act,
        engine_overhead_bytes=overhead if vllm else engine.cuda_graph_bytes,
        cache_type_k=geo.cache_type_k, cache_type_v=geo.cache_type_v,
        kv_bytes_per_token=rates.pop("kv_bytes_per_token"), kv_reserved_bytes=reserved,
        kv_cpu_bytes=0, kv_needed_bytes=kv_needed, kv_pool_tokens=tokens, slot_tokens=ctx,
        parallel=parallel, block_tokens=block, num_gpu_blocks=blocks, max_concurrency=conc,
        log_lines=tuple(logs),
        notes=tuple(notes), extra={"max_num_seqs": engine.max_num_seqs, "share_bytes": share,
                                   "max_model_len_fit": fit_len, "kv_pool_bytes": pool,
                                   **rates},
        kv_groups=sim_groups(groups), blocks_per_request=per_req or None)
    return _settled(b, failure)


def _settled(b: MemoryBudget, failure: str | None) -> MemoryBudget:
    """``b`` with its start-up outcome: ``failure``, else out of memory where its bytes
    are above the device's."""
    if failure is None and b.total_bytes > b.device_bytes:
        failure = (f"CUDA out of memory: {format_bytes(b.total_bytes)} needed of "
                   f"{format_bytes(b.device_bytes)}")
    return replace(b, fits=failure is None, failure=failure)
