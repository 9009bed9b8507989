"""llama.cpp's llama-server: per-slot streams or one ``-kvu`` pool (docs/reference/engines.md
§3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.engines._checkpoint import GGUF_LAYOUT, gguf_file
from kvsim.engines._common import EngineTraits
from kvsim.model.weights import weight_format

CACHE_RAM_DEFAULT_BYTES = 8192 * 2**20  # docs/reference/engines.md §3.4: --cache-ram default
# 8192 MiB


@dataclass(frozen=True)
class LlamaCpp(EngineTraits):
    """llama-server: ``-kvu`` shares one pool between the slots (§3.1)."""

    def unified_pool(self, cfg: Any) -> bool:
        return cfg.allocator == "unified"

    def launch_command(self, s: Any) -> str:
        """``llama-server``: ``-c`` is the whole pool over all slots (§3.1); ``-kvu`` for
        the unified allocator."""
        e = s.engine
        parts = [f"llama-server -m {gguf_file(s)}", f"-c {e.context_tokens}",
                 f"--parallel {e.parallel}", f"-ctk {e.cache_type_k}", f"-ctv {e.cache_type_v}",
                 f"-fa {'on' if e.flash_attn else 'off'}"]
        if e.allocator == "unified":
            parts.append("-kvu")
        if e.cache_ram_bytes != CACHE_RAM_DEFAULT_BYTES:
            ram = -1 if e.cache_ram_bytes is None else -(-e.cache_ram_bytes // 2**20)
            parts.append(f"--cache-ram {ram}")
        if not e.cache_idle_slots:
            parts.append("--no-cache-idle-slots")
        return " ".join(parts)

    def launch_notes(self, s: Any) -> list[str]:
        if weight_format(s.weights).name not in GGUF_LAYOUT:
            return []
        return [(f"replace {gguf_file(s)} by the path of a GGUF of {s.model.name} in that "
                 "layout (a file name such as ...-mxfp4.gguf does not say which; "
                 "llama-quantize MXFP4_MOE gives experts MXFP4, rest Q8_0)")]


# NOTE: llama-server allows -c above the training context (a warning only, §3.1)
ENGINE = LlamaCpp(name="llama.cpp", slot_family=True, caps_slot_at_training_context=True,
                  op_offload=True, context_scope="pool", context_knob="-c",
                  settings=frozenset({"flash_attn", "gpu_layers", "kv_unified"}),
                  quant_v_needs_flash_attn=True, context_above_model="allow",
                  fit_shrinks_context=True)
