"""SGLang: a paged radix-tree pool inside mem_fraction_static (docs/reference/engines.md §2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvsim.engines._checkpoint import checkpoint, kv_dtype_flag, paged_notes
from kvsim.engines._common import EngineTraits
from kvsim.engines._paged_ranks import box_budget
from kvsim.engines.base import ForeignKnob

if TYPE_CHECKING:
    from kvsim.config.specs import GpuSpec, ModelSpec, VisionEncoder
    from kvsim.engines.memory import MemoryBudget

# The paged knobs SGLang lacks (vLLM's): any value but the unused one is refused
_SGLANG_CAP = "--max-total-tokens (max_total_tokens, §2.1)"
FOREIGN_KNOBS = (
    ForeignKnob("version", None, (
        "kvsim follows one SGLang release (late-2025 server_args.py, "
        "docs/reference/engines.md §2.1); engine.version names a vLLM release")),
    ForeignKnob("cuda_graphs_in_budget", False, (
        "SGLang keeps CUDA graphs outside mem_fraction_static (§2.1)")),
    ForeignKnob("preemption_mode", "recompute", (
        "SGLang retracts requests and recomputes them (docs/reference/engines.md §2.3); swap "
        "preemption "
        "is vLLM V0's (§1.4)")),
    ForeignKnob("swap_space_bytes", 0, (
        "vLLM V0's swap space (docs/reference/engines.md §1.4); SGLang retracts and recomputes "
        "(§2.3), "
        "and keeps KV in host memory only with HiCache (a host_kv_cache policy, §2.4)")),
    ForeignKnob("kv_cache_memory_bytes", None, (
        "vLLM's --kv-cache-memory (docs/reference/engines.md §1.1); SGLang sizes its pool by "
        f"mem_fraction_static (gpu_memory_utilization) and caps it with {_SGLANG_CAP}")),
    ForeignKnob("num_gpu_blocks_override", None, (
        "vLLM's --num-gpu-blocks-override (docs/reference/engines.md §1.1); SGLang caps its "
        "pool with "
        + _SGLANG_CAP)),
    ForeignKnob("disable_hybrid_kv_cache_manager", None, (
        "vLLM's hybrid KV cache manager (docs/reference/engines.md §1.7); SGLang has no such "
        "switch")),
    ForeignKnob("language_model_only", False, (
        "vLLM's --language-model-only (docs/reference/engines.md §1.11); kvsim loads a "
        "vision-language checkpoint whole on SGLang")),
    ForeignKnob("non_torch_bytes", 0, (
        "vLLM's profiled non-torch memory inside its budget (docs/reference/engines.md §1.1); "
        "SGLang "
        "keeps what is not weights or KV outside mem_fraction_static (§2.1): "
        "activation_bytes, cuda_graph_bytes")),
)


def _gpu_tier(gpu_memory_bytes: int, tp: int) -> tuple[int, int]:
    """SGLang's ``(chunked_prefill_size, cuda_graph_max_bs)`` for a GPU's memory and the
    box's tensor-parallel size (docs/reference/engines.md §2.1)."""
    gib = gpu_memory_bytes / 2**30
    tiers = ((20, 2048, 8), (35, 2048, 24), (60, 4096, 32), (90, 8192, 256), (160, 8192, 256))
    chunk, graph_bs = next(((c, b) for lim, c, b in tiers if gib < lim), (16384, 512))
    if tp >= 4:
        graph_bs = {8: 8, 24: 80, 32: 160, 256: 512}.get(graph_bs, graph_bs)
    return chunk, graph_bs


def sglang_gpu_defaults(gpu_memory_bytes: int, tp: int = 1,
                        pp: int = 1) -> tuple[float, int]:
    """SGLang's default ``(mem_fraction_static, chunked_prefill_size)`` for a GPU of a
    box of ``tp`` x ``pp`` ranks (docs/reference/engines.md §2.1: 1024 MiB x TP x PP
    / 8 more reserved, CUDA graphs to batch 80 below 35 GiB from TP 4; 24 GiB, TP 1 →
    0.847)."""
    gpu_mib = gpu_memory_bytes / 2**20
    gib = gpu_memory_bytes / 2**30
    chunk, graph_bs = _gpu_tier(gpu_memory_bytes, tp)
    reserved_mib = 512 + 1.5 * max(chunk, 2048) + 2 * graph_bs + 1024 * tp * pp / 8
    if gib > 60:
        reserved_mib = max(reserved_mib, 10 * 1024)
    return round((gpu_mib - reserved_mib) / gpu_mib, 3), chunk


VIT_BASELINE_SCORE = 24 * 1024**2
"""SGLang's baseline image encoder, ViT-L/14: 24 layers of width 1024."""


def vlm_fraction_factor(v: VisionEncoder | None) -> float:
    """What SGLang multiplies its default ``mem_fraction_static`` by for a vision-language
    checkpoint (docs/reference/engines.md §2.1; sgl-project/sglang server_args
    ``adjust_mem_fraction_for_vlm``): 0.95 × (1 − 0.1 × (L × H² / (24 × 1024²) − 1)),
    the second factor kept within [0.8, 1.05]; 1 for a text model.

    NOTE: SGLang reads the layer count as ``vision_config.num_hidden_layers``, default
    24: SigLIP configs (no merger) carry it, the Qwen-VL layouts call it ``depth``, so
    they count as 24 layers.
    """
    if v is None:
        return 1.0
    layers = v.depth if v.spatial_merge_size == 1 else 24
    ratio = layers * v.hidden_size**2 / VIT_BASELINE_SCORE
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


@dataclass(frozen=True)
class Sglang(EngineTraits):
    """``sglang.launch_server``: ``--context-length`` per request (§2.1)."""

    def graph_max_tokens(self, cfg: Any, gpu: GpuSpec) -> int:
        """Decode batches up to its default ``cuda_graph_max_bs`` run as CUDA graphs."""
        return _gpu_tier(gpu.memory_bytes, cfg.tensor_parallel_size)[1]

    def launch_command(self, s: Any) -> str:
        e = s.engine
        model, extra = checkpoint(s, gguf_tokenizer=False)
        cap = "" if e.max_total_tokens is None else f" --max-total-tokens {e.max_total_tokens}"
        cap += f" --tp-size {e.tensor_parallel_size}" if e.tensor_parallel_size > 1 else ""
        cap += f" --pp-size {e.pipeline_parallel_size}" if e.pipeline_parallel_size > 1 else ""
        return (f"python -m sglang.launch_server --model-path {model}{extra} "
                f"--context-length {e.context_tokens} --max-running-requests {e.max_num_seqs} "
                f"--mem-fraction-static {e.gpu_memory_utilization:g} "
                f"--kv-cache-dtype {kv_dtype_flag(e.cache_type_k)}" + cap)

    def launch_notes(self, s: Any) -> list[str]:
        return paged_notes(s, gguf_tokenizer=False)

    def gpu_defaults(self, gpu: GpuSpec, model: ModelSpec | None,
                     given: set[str], ranks: tuple[int, int] = (1, 1)) -> dict[str, Any]:
        """§2.1: ``mem_fraction_static`` and the chunked prefill size by the GPU's memory
        and the box's ranks (:func:`sglang_gpu_defaults`), lowered for a vision-language
        checkpoint (:func:`vlm_fraction_factor`); the context as every engine
        (EngineTraits)."""
        frac, chunk = sglang_gpu_defaults(gpu.memory_bytes, *ranks)
        frac *= vlm_fraction_factor(model.vision_encoder if model is not None else None)
        return {"gpu_memory_utilization": frac, "max_num_batched_tokens": chunk,
                **super().gpu_defaults(gpu, model, given)}

    def memory_budget(self, gpu: GpuSpec, model: ModelSpec, weights: str, cfg: Any,
                      driver: int, display: int, parallel: int,
                      more_gpus: tuple[GpuSpec, ...] = ()) -> MemoryBudget:
        return box_budget((gpu, *more_gpus), model, weights, cfg, driver, display, parallel,
                          profiled_share=False)


# NOTE: SGLang retracts the decode request with the fewest outputs (§2.3); HiCache sizes
# its host pool as a ratio of the device pool (§2.4)
# NOTE: sglang.yaml: SGLang derives its running requests from the pool; the preset's 4096
# is kvsim's cap
ENGINE = Sglang(
    name="sglang", slot_family=False, lays_out_gpus=True, retract_order="sglang", host_kv_from_pool_ratio=True,
    settings=frozenset({"gpu_util", "tensor_parallel_size", "pipeline_parallel_size"}), one_cache_type_flag="--kv-cache-dtype",
    one_cache_type_section="§2.1", foreign_knobs=FOREIGN_KNOBS,
    # NOTE: sgl-project/sglang srt/managers/tokenizer_manager.py _validate_one_request:
    # input + max_new_tokens >= context_len is "Requested token count exceeds ..."
    max_tokens_margin=1, seqs_flag="--max-running-requests", unset_parallel_words=(
        "parallel unset: --max-running-requests from SGLang's pool (kvsim caps it at {n})"))
