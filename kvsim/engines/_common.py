"""Field defaults shared by the engine objects (no engine behaviour of its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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

    def null_block(self, cfg: Any) -> bool:
        return False

    def unified_pool(self, cfg: Any) -> bool:
        return False
