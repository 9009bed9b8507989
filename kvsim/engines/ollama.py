"""Ollama: llama.cpp's slots under its own runners and release defaults (docs/reference/engines.md
§4)."""

from __future__ import annotations

from kvsim.engines._common import EngineTraits

# NOTE: Ollama truncates a prompt longer than num_ctx instead of refusing it (§4.5)
ENGINE = EngineTraits(name="ollama", slot_family=True, truncates_prompt=True, op_offload=True,
                      context_scope="slot", context_knob="num_ctx")
