"""Engine presets as objects: name → :class:`kvsim.engines.base.Engine`.

NOTE: the registry is fixed at import; a preset YAML under ``hardware_profiles/engines/``
names one of these engines in its ``preset`` key.
"""

from __future__ import annotations

from kvsim.engines import llama_cpp, ollama, sglang, vllm
from kvsim.engines.base import Engine
from kvsim.errors import InputError

ENGINES: dict[str, Engine] = {m.ENGINE.name: m.ENGINE for m in (llama_cpp, ollama, vllm, sglang)}


def engine_for(name: str) -> Engine:
    """The engine object of preset ``name`` (InputError naming the known ones)."""
    try:
        return ENGINES[name]
    except KeyError:
        raise InputError("engine.preset", name, "one of " + ", ".join(ENGINES)) from None


def registered_engines() -> tuple[str, ...]:
    """The engines kvsim models, in registration order."""
    return tuple(ENGINES)
