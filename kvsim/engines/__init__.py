"""Engine presets as objects: name → :class:`kvsim.engines.base.Engine`.

The engine config models are :mod:`kvsim.engines.config`, presets resolve to them in
:mod:`kvsim.engines.resolve`, and :mod:`kvsim.engines.budget` gives an engine's load-time
memory budget.

NOTE: the registry is fixed at import; a preset YAML under ``hardware_profiles/engines/``
names one of these engines in its ``preset`` key.  The engine modules import no module
that imports this registry (config, resolve, budget), so the package has no import cycle.
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


def find_engine(name: object) -> Engine | None:
    """The engine of preset ``name``; None when no engine has that name (a catalogue
    preset file may be named otherwise, or the name is no string at all)."""
    return ENGINES.get(name) if isinstance(name, str) else None


def registered_engines() -> tuple[str, ...]:
    """The engines kvsim models, in registration order."""
    return tuple(ENGINES)
