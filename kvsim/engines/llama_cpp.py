"""llama.cpp's llama-server: per-slot streams or one ``-kvu`` pool (docs/reference/engines.md
§3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.engines._common import EngineTraits


@dataclass(frozen=True)
class LlamaCpp(EngineTraits):
    """llama-server: ``-kvu`` shares one pool between the slots (§3.1)."""

    def unified_pool(self, cfg: Any) -> bool:
        return cfg.allocator == "unified"


ENGINE = LlamaCpp(name="llama.cpp", slot_family=True, caps_slot_at_training_context=True,
                  op_offload=True, context_scope="pool", context_knob="-c")
