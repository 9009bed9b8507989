"""Field defaults shared by the engine objects (no engine behaviour of its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class EngineTraits:
    """The plain :class:`kvsim.engines.base.Engine` fields; each engine module builds its
    own instance (or subclass, where a method depends on a knob)."""

    name: str
    slot_family: bool
    retract_order: str = "newest"
    truncates_prompt: bool = False
    caps_slot_at_training_context: bool = False
    op_offload: bool = False
    host_kv_from_pool_ratio: bool = False
    host_kv_chunked: bool = False
    context_scope: Literal["pool", "slot", "request"] = "request"
    context_knob: str = "max_model_len"
    seqs_flag: str = ""
    unset_parallel_words: str = ""
    settings: frozenset[str] = frozenset()
    one_cache_type_flag: str = ""
    quant_v_needs_flash_attn: bool = False
    context_above_model: Literal["refuse", "clamp", "allow"] = "refuse"
    fit_shrinks_context: bool = False
    unset_context_words: str = ""

    def null_block(self, cfg: Any) -> bool:
        return False

    def unified_pool(self, cfg: Any) -> bool:
        return False
