"""SGLang: a paged radix-tree pool inside mem_fraction_static (docs/reference/engines.md §2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.config.engine import ONE_CACHE_TYPE
from kvsim.engines._checkpoint import checkpoint, kv_dtype_flag, paged_notes
from kvsim.engines._common import EngineTraits


@dataclass(frozen=True)
class Sglang(EngineTraits):
    """``sglang.launch_server``: ``--context-length`` per request (§2.1)."""

    def launch_command(self, s: Any) -> str:
        e = s.engine
        model, extra = checkpoint(s, gguf_tokenizer=False)
        cap = "" if e.max_total_tokens is None else f" --max-total-tokens {e.max_total_tokens}"
        return (f"python -m sglang.launch_server --model-path {model}{extra} "
                f"--context-length {e.context_tokens} --max-running-requests {e.max_num_seqs} "
                f"--mem-fraction-static {e.gpu_memory_utilization:g} "
                f"--kv-cache-dtype {kv_dtype_flag(e.cache_type_k)}" + cap)

    def launch_notes(self, s: Any) -> list[str]:
        return paged_notes(s, gguf_tokenizer=False)


# NOTE: SGLang retracts the decode request with the fewest outputs (§2.3); HiCache sizes
# its host pool as a ratio of the device pool (§2.4)
# NOTE: sglang.yaml: SGLang derives its running requests from the pool; the preset's 4096
# is kvsim's cap
ENGINE = Sglang(
    name="sglang", slot_family=False, retract_order="sglang", host_kv_from_pool_ratio=True,
    settings=frozenset({"gpu_util"}), one_cache_type_flag=ONE_CACHE_TYPE["sglang"][0],
    seqs_flag="--max-running-requests", unset_parallel_words=(
        "parallel unset: --max-running-requests from SGLang's pool (kvsim caps it at {n})"))
