"""The device memory the driver reports, below the marketed capacity.

A GPU's marketed "24 GB" is 24 GiB of DRAM, but the driver keeps part of it (page tables,
firmware, reserved regions) and reports a smaller total: ``cudaMemGetInfo``'s total, the
``total_gpu_memory`` vLLM prints and multiplies by ``gpu_memory_utilization``, the
``total`` of llama.cpp's memory breakdown.  Measured totals (start-up logs in
``../shared/measurements/engine-memory-logs.csv``):

========================  ===========  ==========  ================================
card                      marketed     reported    log
========================  ===========  ==========  ================================
GeForce RTX 3090          24576 MiB    23.58 GiB   vllm-001, vllm-018 (vLLM); 24124 MiB
                                                   in ollama-005 (llama.cpp breakdown)
GeForce RTX 4090          24576 MiB    24080 MiB   llamacpp-004
GeForce GTX 1080          8192 MiB     8107 MiB    llamacpp-002
80 GB data-centre card    81920 MiB    79.22 GiB   vllm-020 (H100 or A100, not named)
========================  ===========  ==========  ================================

A card with a measured total carries it (``GpuSpec.cuda_total_bytes``); every other
NVIDIA card gets :func:`reported_total_bytes`' rule, by memory generation: GDDR6 / GDDR6X /
GDDR7 cards keep 2.0 % (RTX 3090 1.8 %, RTX 4090 2.0 %), older GDDR5(X) cards and HBM
data-centre parts 1.0 % (GTX 1080 1.04 %, the 80 GB card 0.98 %).  Unified-memory
machines report what the GPU may use (``gpu_memory_limit_bytes``), unchanged.  AMD's ROCm
reports the whole memory (ollama-007: ``memory.available=[24.0 GiB]`` on an idle 24 GiB
card, where the rule would leave 23.5 GiB); other vendors, with no log to go by, are
taken at their marketed size too.

This total is what every engine may allocate (:attr:`GpuSpec.usable_memory_bytes`): vLLM
and SGLang take their share of it, llama.cpp's ``--fit`` and Ollama's estimate place
layers in what is free of it.

NOTE: the rule is per memory generation, fitted to the four totals above (within 0.3 % of
each); a card's own log line is better, and ``kvsim calibrate from-log`` reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.config.specs import GpuSpec

KEPT_FRACTION_GDDR6_ON = 0.020
"""Share of the marketed memory the driver keeps on GDDR6 / GDDR6X / GDDR7 cards."""
KEPT_FRACTION_OTHER = 0.010
"""Share kept on GDDR5(X) and HBM parts (and any other discrete memory)."""
MEASURED_WITHIN = 0.9
"""A measured total is the card's only within this share of its memory: a profile whose
``memory_bytes`` was changed (``--set gpu.memory_bytes=8GiB``, a sweep) is another card,
and gets the rule."""


def kept_fraction(memory_type: str) -> float:
    """The share of the marketed memory the driver keeps, by memory generation."""
    t = memory_type.upper().replace(" ", "")
    return KEPT_FRACTION_GDDR6_ON if t.startswith(("GDDR6", "GDDR7")) else KEPT_FRACTION_OTHER


def reported_total_bytes(gpu: GpuSpec) -> int:
    """The device total the driver reports: measured where known (and consistent with
    ``memory_bytes``, :data:`MEASURED_WITHIN`), else the rule above on NVIDIA cards, the
    marketed size on others (unified memory: the GPU's default limit)."""
    measured = gpu.cuda_total_bytes
    if measured is not None and MEASURED_WITHIN * gpu.memory_bytes < measured <= gpu.memory_bytes:
        return measured
    if gpu.unified_memory or gpu.gpu_memory_limit_bytes:
        return gpu.gpu_memory_limit_bytes or gpu.memory_bytes
    if gpu.vendor != "NVIDIA":
        return gpu.memory_bytes
    return int(gpu.memory_bytes * (1 - kept_fraction(gpu.memory_type)))
