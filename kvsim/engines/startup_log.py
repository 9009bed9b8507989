"""Startup-log readers: pin KV capacity exactly from what the engine itself printed.

Users can paste an engine's startup log and kvsim reads the numbers that decide
capacity (``docs/reference/engines.md`` §1, §3.1, §4.2); each engine module reads its own
lines (``Engine.read_startup_log``):

- vLLM: ``GPU KV cache size: N tokens``, ``Maximum concurrency for L tokens per
  request: X.XXx``, ``Available KV cache memory: X GiB`` and the older
  ``# GPU blocks: N, # CPU blocks: M`` (also ``# cuda blocks``);
- llama.cpp: ``llama_context: n_seq_max = …, n_ctx = …, n_ctx_seq = …`` (older
  ``n_ctx_per_seq``), ``<dev> KV buffer size = X MiB`` (per device and KV cache; summed),
  ``llama_kv_cache: size = X MiB (N cells, L layers, s/S seqs), K (t): … MiB, V (t): …
  MiB`` (older ``KV self size``), ``SWA KV cache, size = N cells``;
- Ollama: the ``offload to …`` line's ``memory.required.kv=…`` and friends, plus the
  llama.cpp lines its runner prints.

A log in which nothing is recognised is an :class:`InputError`, not an empty result.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvsim.engines import engine_for
from kvsim.errors import InputError

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class LogFacts(BaseModel):
    """Capacity facts read from one startup log (None = not printed)."""

    model_config = _FROZEN
    engine: Literal["vllm", "llama.cpp", "ollama"]  # the engines that print capacity lines
    # vLLM
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens: int | None = None
    available_kv_bytes: int | None = None
    gpu_blocks: int | None = None
    cpu_blocks: int | None = None
    # llama.cpp
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    n_seq_max: int | None = None
    kv_unified: bool | None = None
    kv_buffer_bytes: int | None = Field(None, description="sum of '<dev> KV buffer size'")
    kv_buffers: dict[str, int] = Field(default_factory=dict, description="per device")
    kv_size_bytes: int | None = None
    kv_cells: int | None = Field(None, description="cells per stream (per slot if not unified)")
    kv_streams: int | None = Field(None, description="the S of 's/S seqs': KV streams")
    kv_layers: int | None = None
    k_type: str | None = None
    v_type: str | None = None
    k_bytes: int | None = None
    v_bytes: int | None = None
    swa_cells: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    flash_attn_setting: str | None = Field(None, description="-fa as printed (auto, on, …)")
    flash_attn: bool | None = Field(None, description="whether flash attention ran")
    gpu_layers: int | None = Field(None, description="'offloaded N/M layers to GPU': N")
    layers_total: int | None = Field(None, description="… M")
    model_buffers: dict[str, int] = Field(default_factory=dict, description="weights per device")
    model_buffer_bytes: int | None = Field(None, description="weights on the GPU(s)")
    compute_buffers: dict[str, int] = Field(default_factory=dict, description="per device")
    compute_buffer_bytes: int | None = Field(None, description="compute buffers on the GPU(s)")
    # Ollama
    ollama_memory: dict[str, int] = Field(default_factory=dict, description="memory.* keys")
    layers_offload: int | None = None
    layers_model: int | None = None


def last_startup(text: str) -> str:
    """The last startup of a log that holds several (Ollama's server.log keeps every
    model load; a llama-server log may be appended to): from the last Ollama
    ``memory.required`` line, else the last llama.cpp ``build:`` line, else all."""
    for pat in (r"^.*memory\.required", r"^build: \d+"):
        starts = [m.start() for m in re.finditer(pat, text, flags=re.MULTILINE)]
        if starts:
            return text[starts[-1]:]
    return text


def read_log_text(text: str, name: str = "log") -> LogFacts:
    """Parse the last startup of a log (:func:`last_startup`); raises InputError if
    nothing is recognised.

    NOTE: Ollama's runner is llama.cpp, so an Ollama log holds llama.cpp's lines too:
    its facts are both readers'."""
    text = last_startup(text)
    ollama, llama, vllm = (engine_for(e).read_startup_log(text, name)
                           for e in ("ollama", "llama.cpp", "vllm"))
    if vllm and (ollama or llama):
        other = "Ollama" if ollama else "llama.cpp"
        raise InputError("log", name, f"holds both vLLM and {other} startup lines (vLLM: "
                         f"{', '.join(sorted(vllm))}); give one engine's log")
    if ollama:
        return LogFacts(engine="ollama", **ollama, **llama)
    if llama:
        return LogFacts(engine="llama.cpp", **llama)
    if vllm:
        return LogFacts(engine="vllm", **vllm)
    raise InputError("log", name, "no vLLM ('GPU KV cache size'), llama.cpp ('KV buffer size', "
                     "'n_ctx_seq') or Ollama ('memory.required.kv') startup lines found")


def scenario_keys(facts: LogFacts) -> dict[str, object]:
    """The scenario keys (``engine.KEY``) that make kvsim lay memory out as this startup
    did, from what it printed (``Engine.log_scenario_keys``; {} where nothing pins)."""
    return {f"engine.{k}": v for k, v in engine_for(facts.engine).log_scenario_keys(
        facts.model_dump(exclude_none=True)).items()}


def read_log(path: str | Path) -> LogFacts:
    """:func:`read_log_text` of the file at ``path`` (InputError if it cannot be read)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError("log", str(p), f"cannot read ({exc.strerror})") from None
    return read_log_text(text, str(p))
