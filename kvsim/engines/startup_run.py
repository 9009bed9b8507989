"""What an engine's start-up log says it ran — the card, the model, the weights, the
release, the settings and the lines its figures are in — from each engine's own lines
(``Engine.startup_run``: llama.cpp's in kvsim.engines.llama_cpp, Ollama's in
kvsim.engines.ollama, vLLM's in kvsim.engines.vllm; the shared ggml pieces in
kvsim.engines._run_log).  kvsim.validate.startup_paste compares them with kvsim's layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsim.engines import engine_for
from kvsim.engines.startup_log import LogFacts, last_startup


@dataclass(frozen=True)
class StartupRun:
    """What the log says the engine ran ("" where it does not say)."""

    engine_version: str
    gpu: str
    vram_total: str                 # Ollama's ``memory.available=[…]``
    model: str
    weight_format: str
    date: str
    figure_text: str                # the lines the figures are read from
    settings: dict[str, object] = field(default_factory=dict)  # the engine's knob names


def startup_run(text: str, facts: LogFacts) -> StartupRun:
    """The run of the log's last start-up; ``facts``: its capacity lines
    (:func:`kvsim.engines.startup_log.read_log_text`)."""
    start = last_startup(text)
    d = engine_for(facts.engine).startup_run(text, start, facts.model_dump())
    return StartupRun(engine_version=d.get("version", ""), gpu=d.get("gpu", ""),
                      vram_total=d.get("vram_total", ""), model=d.get("model", ""),
                      weight_format=d.get("weights", ""), date=d.get("date", ""),
                      figure_text=d.get("figure_text", start),
                      settings=dict(d.get("settings", {})))
