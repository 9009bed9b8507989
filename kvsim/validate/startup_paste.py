"""An engine's own start-up log as a user pastes it (llama-server, Ollama's server.log,
vLLM) as one start-up memory measurement (:class:`~kvsim.validate.memlogs.MemoryMeasurement`),
compared with kvsim's layout as a row of ``engine-memory-logs.csv`` is.

The capacity lines are :func:`kvsim.engines.startup_log.read_log_text`'s (the last start-up
of the paste); what the engine ran (card, model, weights, release, settings) is
:func:`kvsim.engines.startup_run.startup_run`'s, read as a CSV row's cells are (a printed
``flash_attn = auto`` is :data:`kvsim.validate.records.FA_AUTO`, kvsim.validate.memlog_text).

NOTE: the figures compared are the engine's own lines (kvsim.validate.memlog_lines),
whatever else the paste holds; a paste with no capacity line is not a start-up log, and
what it does not show is said, not guessed (the row's skip reason).
"""

from __future__ import annotations

from kvsim.engines.startup_log import read_log_text
from kvsim.engines.startup_run import startup_run
from kvsim.errors import InputError
from kvsim.validate.memlogs import MemoryMeasurement, read_memory_row

_SHOWN_AS = "{} (startup log)"


def read_startup_paste(text: str, origin: str) -> list[MemoryMeasurement] | None:
    """The start-up of an engine log (module docstring); None when ``text`` holds no
    engine's capacity lines."""
    try:
        facts = read_log_text(text, origin)
    except InputError:
        return None
    run = startup_run(text, facts)
    row = {"id": origin, "engine": _SHOWN_AS.format(facts.engine),
           "engine_version": run.engine_version or "not shown",
           "gpu": run.gpu or "not shown", "vram_total": run.vram_total,
           "model": run.model or "not shown", "weight_format": run.weight_format or "not shown",
           "settings": "; ".join(f"{k}={v}" for k, v in run.settings.items()),
           "printed_figures": run.figure_text, "source": origin, "date": run.date}
    return [read_memory_row(row, origin)]
