"""vLLM: a paged block pool inside a memory share (docs/reference/engines.md §1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.engines._common import EngineTraits


@dataclass(frozen=True)
class Vllm(EngineTraits):
    """vLLM v1 reserves block 0; V0 (the swap preemption mode) does not."""

    def null_block(self, cfg: Any) -> bool:
        return cfg.preemption_mode != "swap"


# NOTE: with LMCache, save_unfull_chunk=false, save_decode_cache=false (docs/reference/engines.md
# §5)
ENGINE = Vllm(name="vllm", slot_family=False, host_kv_chunked=True, seqs_flag="--max-num-seqs",
              unset_parallel_words="parallel unset: --max-num-seqs {n} (vLLM's default)")
