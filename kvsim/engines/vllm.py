"""vLLM: a paged block pool inside a memory share (docs/reference/engines.md §1)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvsim.config.units import parse_bytes
from kvsim.engines._checkpoint import checkpoint, kv_dtype_flag, paged_notes
from kvsim.engines._common import EngineTraits
from kvsim.engines._log_patterns import FLOAT, NUM, to_int
from kvsim.engines._paged_ranks import box_budget
from kvsim.engines._run_log import match
from kvsim.engines.base import BudgetOf, DeviceRule, ForeignKnob
from kvsim.engines.vllm_releases import (
    VLLM_LATEST,
    known_vllm_release,
    vllm_defaults,
    vllm_release,
)

if TYPE_CHECKING:
    from kvsim.config.specs import GpuSpec, ModelSpec
    from kvsim.engines.memory import MemoryBudget

FOREIGN_KNOBS = (ForeignKnob("max_total_tokens", None, (
    "SGLang's --max-total-tokens (docs/reference/engines.md §2.1); vLLM has "
    "num_gpu_blocks_override "
    "(--num-gpu-blocks-override) and kv_cache_memory_bytes (--kv-cache-memory, "
    "§1.1)")),)


_LOG_KNOBS = {"max_seq_len": "max_model_len", "tensor_parallel_size": "tensor_parallel_size",
              "pipeline_parallel_size": "pipeline_parallel_size",
              "kv_cache_dtype": "kv_cache_dtype", "enforce_eager": "enforce_eager",
              "gpu_memory_utilization": "gpu_memory_utilization",
              "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens"}
"""Start-up log knobs (its config line / non-default args) → the settings' names."""


@dataclass(frozen=True)
class Vllm(EngineTraits):
    """vLLM, by release (kvsim.engines.vllm_releases): V1 reserves block 0, V0 (and the
    swap preemption mode, V0's) does not."""

    def null_block(self, cfg: Any) -> bool:
        return cfg.preemption_mode != "swap" and vllm_release(cfg.version).engine == "V1"

    def graph_max_tokens(self, cfg: Any, gpu: GpuSpec) -> int:
        """V1 captures piecewise CUDA graphs for steps of up to 512 tokens, decode and
        mixed alike (its default ``max_capture_size``)."""
        return 512

    def check_release(self, version: str | None) -> None:
        if version is not None:
            known_vllm_release(version)

    def release_defaults(self, merged: dict[str, Any], given: set[str],
                         gpu: GpuSpec | None, model: ModelSpec | None, weights: str | None,
                         budget_of: BudgetOf, more_gpus: tuple[GpuSpec, ...] = ()
                         ) -> dict[str, Any]:
        """The release ``version`` (default :data:`VLLM_LATEST`) and what it derives for
        the knobs not ``given``: the memory share, the batch budget and sequence cap (§1.4,
        by the card), whether CUDA graphs come out of the share."""
        version = merged.get("version") or VLLM_LATEST
        return {"version": version, **vllm_defaults({**merged, "version": version}, given, gpu)}

    def memory_budget(self, gpu: GpuSpec, model: ModelSpec, weights: str, cfg: Any,
                      driver: int, display: int, parallel: int,
                      more_gpus: tuple[GpuSpec, ...] = ()) -> MemoryBudget:
        return box_budget((gpu, *more_gpus), model, weights, cfg, driver, display, parallel,
                          profiled_share=True)

    def launch_command(self, s: Any) -> str:
        """``vllm serve``: ``--max-model-len`` per request (§1.1); a GGUF file is served
        with the repo's tokenizer."""
        e = s.engine
        model, extra = checkpoint(s, gguf_tokenizer=True)
        pool = [f" --kv-cache-memory {e.kv_cache_memory_bytes}"
                if e.kv_cache_memory_bytes is not None else "",
                f" --num-gpu-blocks-override {e.num_gpu_blocks_override}"
                if e.num_gpu_blocks_override is not None else "",
                " --disable-hybrid-kv-cache-manager" if e.disable_hybrid_kv_cache_manager is True
                else "",
                " --language-model-only" if e.language_model_only else "",
                f" --tensor-parallel-size {e.tensor_parallel_size}"
                if e.tensor_parallel_size > 1 else "",
                f" --pipeline-parallel-size {e.pipeline_parallel_size}"
                if e.pipeline_parallel_size > 1 else ""]
        return (f"vllm serve {model}{extra} --max-model-len {e.context_tokens} "
                f"--max-num-seqs {e.max_num_seqs} "
                f"--gpu-memory-utilization {e.gpu_memory_utilization:g} "
                f"--kv-cache-dtype {kv_dtype_flag(e.cache_type_k)}" + "".join(pool))

    def read_startup_log(self, text: str, name: str = "log") -> dict[str, object]:
        return read_vllm_log(text, name)

    def startup_run(self, text: str, start: str, facts: dict[str, Any]) -> dict[str, Any]:
        """``LLM engine (vX) with config: model='…', … quantization=…`` (none: its
        ``dtype``) and the knobs of that line and of ``non-default args`` (no card)."""
        quant = match(r"\bquantization=(\w+)", text)
        knobs = {knob: match(rf"['\"]?\b{key}['\"]?\s*[=:]\s*([\w.]+)", text)
                 for key, knob in _LOG_KNOBS.items()}
        return {"version": match(r"LLM engine \(v([^)\s]+)\)", text),
                "model": match(r"\bmodel='([^']+)'", text),
                "weights": quant if quant not in ("", "None") else
                match(r"\bdtype=(?:torch\.)?(\w+)", text),
                "settings": {k: {"True": "on", "False": "off"}.get(v, v)
                             for k, v in knobs.items() if v not in ("", "None")},
                "figure_text": start}

    def log_scenario_keys(self, facts: dict[str, Any]) -> dict[str, Any]:
        """The printed block count pins the pool (--num-gpu-blocks-override)."""
        blocks = facts.get("gpu_blocks")
        return {} if blocks is None else {"num_gpu_blocks_override": blocks}

    def launch_notes(self, s: Any) -> list[str]:
        return paged_notes(s, gguf_tokenizer=True)


PRE_VOLTA = DeviceRule(
    "nvidia", frozenset({"pascal", "maxwell", "kepler"}),
    "vLLM needs an NVIDIA GPU of compute capability 7.0 or newer (docs.vllm.ai, "
    "installation: 'GPU: compute capability 7.0 or higher', 7.5 in its newest docs; "
    "docs/reference/engines.md §1); llama.cpp and Ollama run on it")
"""vLLM's CUDA requirement; its every release's installation page states at least 7.0."""


# NOTE: with LMCache, save_unfull_chunk=false, save_decode_cache=false (docs/reference/engines.md
# §5)
ENGINE = Vllm(name="vllm", slot_family=False, lays_out_gpus=True, host_kv_chunked=True, seqs_flag="--max-num-seqs",
              unset_parallel_words="parallel unset: --max-num-seqs {n} (vLLM's default)",
              settings=frozenset({"gpu_util", "hybrid_kv", "vllm_version", "language_model_only",
                                  "tensor_parallel_size", "pipeline_parallel_size"}),
              one_cache_type_flag="--kv-cache-dtype", one_cache_type_section="§1.5",
              foreign_knobs=FOREIGN_KNOBS, hybrid_off_with_kv_connector=True,
              refuses_devices=(PRE_VOLTA,),
              # NOTE: vllm-project/vllm entrypoints/openai serving: "'max_tokens' ... is too
              # large: M. This model's maximum context length is C tokens and your request
              # has N input tokens (M > C - N)"
              max_tokens_margin=0)


def read_vllm_log(text: str, name: str = "log") -> dict[str, object]:
    """vLLM's capacity lines (docs/reference/engines.md §1): ``GPU KV cache size``,
    ``Maximum concurrency``, ``Available KV cache memory``, older ``# GPU blocks``."""
    out: dict[str, object] = {}
    if m := re.search(r"GPU KV cache size:\s*" + NUM + r"\s*tokens", text):
        out["kv_cache_tokens"] = to_int(m.group(1))
    if m := re.search(r"Maximum concurrency for\s*" + NUM + r"\s*tokens per request:\s*"
                      + FLOAT + "x", text):
        out["max_concurrency_tokens"] = to_int(m.group(1))
        out["max_concurrency"] = float(m.group(2))
    if m := re.search(r"Available KV cache memory:\s*" + FLOAT + r"\s*([KMGT]i?B)", text):
        out["available_kv_bytes"] = parse_bytes(f"{m.group(1)} {m.group(2)}")
    if m := re.search(r"# (?:GPU|gpu|cuda|CUDA) blocks:\s*" + NUM
                      + r"(?:,\s*# CPU blocks:\s*" + NUM + ")?", text):
        out["gpu_blocks"] = to_int(m.group(1))
        if m.group(2):
            out["cpu_blocks"] = to_int(m.group(2))
    return out
