"""Startup-log readers: pin KV capacity exactly from what the engine itself printed.

Users can paste an engine's startup log and kvsim reads the numbers that decide
capacity (``docs/reference/engines.md`` §1, §3.1, §4.2):

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

from kvsim.config.units import parse_bytes
from kvsim.errors import InputError

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_NUM = r"([0-9]+(?:,[0-9]{3})*)"
_FLOAT = r"([0-9]+(?:\.[0-9]+)?)"


class LogFacts(BaseModel):
    """Capacity facts read from one startup log (None = not printed)."""

    model_config = _FROZEN
    engine: Literal["vllm", "llama.cpp", "ollama"]
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
    # Ollama
    ollama_memory: dict[str, int] = Field(default_factory=dict, description="memory.* keys")
    layers_offload: int | None = None
    layers_model: int | None = None


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def _mib(s: str) -> int:
    return round(float(s) * 2**20)


def _vllm(text: str) -> dict[str, object]:
    out: dict[str, object] = {}
    if m := re.search(r"GPU KV cache size:\s*" + _NUM + r"\s*tokens", text):
        out["kv_cache_tokens"] = _int(m.group(1))
    if m := re.search(r"Maximum concurrency for\s*" + _NUM + r"\s*tokens per request:\s*"
                      + _FLOAT + "x", text):
        out["max_concurrency_tokens"] = _int(m.group(1))
        out["max_concurrency"] = float(m.group(2))
    if m := re.search(r"Available KV cache memory:\s*" + _FLOAT + r"\s*([KMGT]i?B)", text):
        out["available_kv_bytes"] = parse_bytes(f"{m.group(1)} {m.group(2)}")
    if m := re.search(r"# (?:GPU|gpu|cuda|CUDA) blocks:\s*" + _NUM
                      + r"(?:,\s*# CPU blocks:\s*" + _NUM + ")?", text):
        out["gpu_blocks"] = _int(m.group(1))
        if m.group(2):
            out["cpu_blocks"] = _int(m.group(2))
    return out


def _llama(text: str, name: str = "log") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, pat in (("n_seq_max", r"n_seq_max\s*=\s*(\d+)"), ("n_ctx", r"\bn_ctx\s*=\s*(\d+)"),
                     ("n_ctx_seq", r"n_ctx_(?:seq|per_seq)\s*=\s*(\d+)")):
        prefix = r"llama_(?:context|new_context_with_model|init_from_model):.*?"
        if m := re.search(prefix + pat, text):
            out[key] = int(m.group(1))
    if m := re.search(r"kv_unified\s*=\s*(true|false)", text):
        out["kv_unified"] = m.group(1) == "true"
    buffers = _kv_buffers(text, name)
    if buffers:
        out["kv_buffers"] = buffers
        out["kv_buffer_bytes"] = sum(buffers.values())
    size = re.search(r"llama_kv_cache\w*: size\s*=\s*" + _FLOAT + r" MiB \(\s*(\d+) cells,\s*"
                     r"(\d+) layers,\s*\d+/(\d+) seqs\), K \((\w+)\):\s*" + _FLOAT
                     + r" MiB, V \((\w+)\):\s*" + _FLOAT + " MiB", text)
    self_size = re.search(r"KV self size\s*=\s*" + _FLOAT + r" MiB, K \((\w+)\):\s*" + _FLOAT
                          + r" MiB, V \((\w+)\):\s*" + _FLOAT + " MiB", text)
    if size:
        out.update(kv_size_bytes=_mib(size.group(1)), kv_cells=int(size.group(2)),
                   kv_layers=int(size.group(3)), kv_streams=int(size.group(4)),
                   k_type=size.group(5), k_bytes=_mib(size.group(6)), v_type=size.group(7),
                   v_bytes=_mib(size.group(8)))
    elif self_size:
        out.update(kv_size_bytes=_mib(self_size.group(1)), k_type=self_size.group(2),
                   k_bytes=_mib(self_size.group(3)), v_type=self_size.group(4),
                   v_bytes=_mib(self_size.group(5)))
    if m := re.search(r"SWA KV cache, size\s*=\s*(\d+) cells", text):
        out["swa_cells"] = int(m.group(1))
    return out


def _kv_buffers(text: str, name: str) -> dict[str, int]:
    """``<dev> KV buffer size`` per device, summed over the KV caches of one startup.

    NOTE: llama.cpp prints one line per device per KV cache (K and V together), so a
    device appears once — twice for an SWA model (its non-SWA and SWA caches,
    ``docs/reference/engines.md`` §3.1); later lines of the same startup belong to another
    context (a draft model's), so the first ones are the served model's.
    """
    caches = 2 if re.search(r"SWA KV cache", text) else 1
    lines: dict[str, list[int]] = {}
    for m in re.finditer(r"llama_kv_cache\w*:\s+(\S+) KV buffer size\s*=\s*" + _FLOAT
                         + r" MiB", text):
        lines.setdefault(m.group(1), []).append(_mib(m.group(2)))
    return {dev: sum(sizes[:caches]) for dev, sizes in lines.items()}


def last_startup(text: str) -> str:
    """The last startup of a log that holds several (Ollama's server.log keeps every
    model load; a llama-server log may be appended to): from the last Ollama
    ``memory.required`` line, else the last llama.cpp ``build:`` line, else all."""
    for pat in (r"^.*memory\.required", r"^build: \d+"):
        starts = [m.start() for m in re.finditer(pat, text, flags=re.MULTILINE)]
        if starts:
            return text[starts[-1]:]
    return text


def _ollama(text: str) -> dict[str, object]:
    out: dict[str, object] = {}
    line = next((ln for ln in text.splitlines() if "memory.required" in ln), None)
    if line is None:
        return out
    memory: dict[str, int] = {}
    for m in re.finditer(r'(memory\.[\w.]+)="?([0-9.]+ ?[KMGT]?i?B)"?', line):
        memory[m.group(1).removeprefix("memory.")] = parse_bytes(m.group(2), m.group(1))
    out["ollama_memory"] = memory
    if m := re.search(r"layers\.offload=(\d+)", line):
        out["layers_offload"] = int(m.group(1))
    if m := re.search(r"layers\.model=(\d+)", line):
        out["layers_model"] = int(m.group(1))
    return out


def read_log_text(text: str, name: str = "log") -> LogFacts:
    """Parse the last startup of a log (:func:`last_startup`); raises InputError if
    nothing is recognised."""
    text = last_startup(text)
    ollama, llama, vllm = _ollama(text), _llama(text, name), _vllm(text)
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


def read_log(path: str | Path) -> LogFacts:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError("log", str(p), f"cannot read ({exc.strerror})") from None
    return read_log_text(text, str(p))
