"""SGLang: a paged radix-tree pool inside mem_fraction_static (docs/reference/engines.md §2)."""

from __future__ import annotations

from kvsim.engines._common import EngineTraits

# NOTE: SGLang retracts the decode request with the fewest outputs (§2.3); HiCache sizes
# its host pool as a ratio of the device pool (§2.4)
# NOTE: sglang.yaml: SGLang derives its running requests from the pool; the preset's 4096
# is kvsim's cap
ENGINE = EngineTraits(
    name="sglang", slot_family=False, retract_order="sglang", host_kv_from_pool_ratio=True,
    seqs_flag="--max-running-requests", unset_parallel_words=(
        "parallel unset: --max-running-requests from SGLang's pool (kvsim caps it at {n})"))
