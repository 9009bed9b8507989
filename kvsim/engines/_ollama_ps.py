"""What ``ollama ps`` shows for a loaded model: SIZE, PROCESSOR and CONTEXT.

Read in ollama/ollama (facts only):

- ``llm/server.go``: the runner's ``EstimatedTotal`` / ``EstimatedVRAM`` (later
  ``TotalSize`` / ``VRAMSize``).  A runner placed by the era-A estimator (§4.2) reports
  the estimate itself: SIZE is ``memory.required.full`` (``TotalSize``: what the GPUs
  were charged plus what overflowed to the CPU) and the GPU part ``memory.required.partial``
  (``VRAMSize``).  A runner placed by measured sizes (§4.3) sums what it allocated:
  SIZE is the input weights (the token embedding, always in host memory) plus every
  CPU and GPU allocation (weights, cache, graph); the GPU part is the GPUs' allocations,
  plus the input weights and the CPU graph when no layer's weights or cache sit on the CPU
  ("to represent complete offloading").
- ``cmd/cmd.go`` (the ``ps`` table) and ``format/bytes.go`` ``HumanBytes``: SIZE in
  decimal units, a whole number from 10 up (47.9 GB prints "47 GB"), else one decimal;
  PROCESSOR "100% GPU", "100% CPU" or "c%/g% CPU/GPU" with c the CPU share of SIZE
  rounded half away from zero.  (Proposals to print binary units, ollama PRs #13457 and
  #13583, were open when read.)

NOTE: kvsim's layout has no host compute buffer, so a measured runner's SIZE misses its
CPU graph (tens of MiB for the input batch); era D (llama-server, §4.4) reports what
Ollama predicted for eviction, which kvsim does not describe: no figures there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvsim.engines.memory import MemoryBudget

_DECIMAL_UNITS = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))


def human_bytes(b: int) -> str:
    """A size as Ollama's ``HumanBytes`` prints it (module docstring)."""
    for unit, scale in _DECIMAL_UNITS:
        if b >= scale:
            value = b / scale
            if value >= 10 or value == math.trunc(value):
                return f"{math.trunc(value)} {unit}"
            return f"{value:.1f} {unit}"
    return f"{b} B"


def _gpu_share(size_bytes: int, vram_bytes: int) -> int | None:
    """PROCESSOR's GPU percent: 100 less the CPU share rounded half away from zero (None:
    "Unknown", a GPU part above the size)."""
    if vram_bytes == 0:
        return 0
    if vram_bytes == size_bytes:
        return 100
    if vram_bytes > size_bytes or size_bytes == 0:
        return None
    return 100 - math.floor((size_bytes - vram_bytes) / size_bytes * 100 + 0.5)


def processor(size_bytes: int, vram_bytes: int) -> str:
    """The PROCESSOR column for a runner of ``size_bytes`` with ``vram_bytes`` on GPUs."""
    if vram_bytes == 0:
        return "100% CPU"
    if vram_bytes == size_bytes:
        return "100% GPU"
    gpu = _gpu_share(size_bytes, vram_bytes)
    return "Unknown" if gpu is None else f"{100 - gpu}%/{gpu}% CPU/GPU"


@dataclass(frozen=True)
class OllamaPs:
    """One ``ollama ps`` row: ``size_bytes`` (SIZE), ``vram_bytes`` (its GPU part, the
    API's ``size_vram``) and ``context_tokens`` (CONTEXT: num_ctx)."""

    size_bytes: int
    vram_bytes: int
    context_tokens: int

    @property
    def processor(self) -> str:
        return processor(self.size_bytes, self.vram_bytes)

    @property
    def gpu_percent(self) -> int:
        """PROCESSOR's GPU share, in percent (0 for "Unknown")."""
        return _gpu_share(self.size_bytes, self.vram_bytes) or 0

    def line(self) -> str:
        return (f"ollama ps: SIZE {human_bytes(self.size_bytes)}  PROCESSOR {self.processor}"
                f"  CONTEXT {self.context_tokens}")


def ollama_ps(b: MemoryBudget, mode: str, context_tokens: int) -> OllamaPs | None:
    """The ``ollama ps`` row of layout ``b`` placed the ``mode`` way (``estimate``,
    ``measured`` or ``llama-server``: :func:`kvsim.engines.ollama_releases.ollama_memory_mode`);
    None for ``llama-server`` (module NOTE)."""
    if mode == "estimate" and b.estimate is not None:
        return OllamaPs(b.estimate.full_bytes, b.estimate.total_bytes, context_tokens)
    if mode != "measured":
        return None
    gpu = b.weights_gpu_bytes + b.kv_reserved_bytes + b.activation_bytes
    size = gpu + b.weights_cpu_bytes + b.kv_cpu_bytes
    complete = (b.gpu_layers == b.num_layers and b.head_on_gpu and not b.cpu_expert_layers
                and not b.kv_cpu_bytes)
    return OllamaPs(size, size if complete else gpu, context_tokens)


def with_ollama_ps(b: MemoryBudget, mode: str, context_tokens: int) -> MemoryBudget:
    """``b`` with its ``ollama ps`` row as a log line and as ``extra``
    (``ollama_ps_size_bytes``, ``ollama_ps_vram_bytes``, ``ollama_ps_gpu_percent``), where
    kvsim knows it."""
    ps = ollama_ps(b, mode, context_tokens)
    if ps is None:
        return b
    return replace(b, log_lines=(*b.log_lines, ps.line()),
                   extra={**b.extra, "ollama_ps_size_bytes": ps.size_bytes,
                          "ollama_ps_vram_bytes": ps.vram_bytes,
                          "ollama_ps_gpu_percent": ps.gpu_percent})
