"""vLLM: a paged block pool inside a memory share (docs/reference/engines.md §1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.config.engine import ONE_CACHE_TYPE
from kvsim.engines._checkpoint import checkpoint, kv_dtype_flag, paged_notes
from kvsim.engines._common import EngineTraits


@dataclass(frozen=True)
class Vllm(EngineTraits):
    """vLLM v1 reserves block 0; V0 (the swap preemption mode) does not."""

    def null_block(self, cfg: Any) -> bool:
        return cfg.preemption_mode != "swap"

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
                else ""]
        return (f"vllm serve {model}{extra} --max-model-len {e.context_tokens} "
                f"--max-num-seqs {e.max_num_seqs} "
                f"--gpu-memory-utilization {e.gpu_memory_utilization:g} "
                f"--kv-cache-dtype {kv_dtype_flag(e.cache_type_k)}" + "".join(pool))

    def launch_notes(self, s: Any) -> list[str]:
        return paged_notes(s, gguf_tokenizer=True)


# NOTE: with LMCache, save_unfull_chunk=false, save_decode_cache=false (docs/reference/engines.md
# §5)
ENGINE = Vllm(name="vllm", slot_family=False, host_kv_chunked=True, seqs_flag="--max-num-seqs",
              unset_parallel_words="parallel unset: --max-num-seqs {n} (vLLM's default)",
              settings=frozenset({"gpu_util", "hybrid_kv"}),
              one_cache_type_flag=ONE_CACHE_TYPE["vllm"][0])
