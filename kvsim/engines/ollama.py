"""Ollama: llama.cpp's slots under its own runners and release defaults (docs/reference/engines.md
§4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.config.engine import ONE_CACHE_TYPE
from kvsim.config.ollama import OLLAMA_NUM_CTX_TIERS
from kvsim.engines._common import EngineTraits


@dataclass(frozen=True)
class Ollama(EngineTraits):
    """``ollama serve``, configured through its environment (§4)."""

    def launch_command(self, s: Any) -> str:
        """``OLLAMA_CONTEXT_LENGTH`` is per slot (the runner gets ``num_ctx × parallel``,
        §4); ``OLLAMA_KV_CACHE_TYPE`` only applies with flash attention."""
        e = s.engine
        env = [f"OLLAMA_NUM_PARALLEL={e.parallel}", f"OLLAMA_CONTEXT_LENGTH={e.context_tokens}",
               f"OLLAMA_KV_CACHE_TYPE={e.cache_type_k}",
               f"OLLAMA_FLASH_ATTENTION={1 if e.flash_attn else 0}"]
        return " ".join(env) + " ollama serve"

    def launch_notes(self, s: Any) -> list[str]:
        return []


_TIERS = ", ".join(f"{n} from {b // 2**30} GiB" for b, n in OLLAMA_NUM_CTX_TIERS)

# NOTE: Ollama truncates a prompt longer than num_ctx instead of refusing it (§4.5) and
# clamps num_ctx to the training length (§4.1); its unset num_ctx depends on the card's
# memory (kvsim.config.ollama, its newest release)
ENGINE = Ollama(name="ollama", slot_family=True, truncates_prompt=True, op_offload=True,
                context_scope="slot", context_knob="num_ctx",
                settings=frozenset({"flash_attn", "gpu_layers", "ollama_version"}),
                one_cache_type_flag=ONE_CACHE_TYPE["ollama"][0], context_above_model="clamp",
                unset_context_words=f"4096 ({_TIERS})")
