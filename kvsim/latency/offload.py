"""llama.cpp's *op offload*: large-batch matmuls on host-resident weights run on the GPU.

Weights in host memory (layers beyond ``-ngl``, MoE experts ``--fit`` or ``-ot exps=CPU``
leave in RAM) are copied to the GPU for every ubatch of ``op_offload_min_batch`` (32)
tokens or more, and the op runs there; smaller ubatches run on the CPU.  The facts, read
in the llama.cpp and Ollama sources, are in docs/design/op-offload.md.

NOTE: copy and compute do not overlap; with mmap (the default) the copies read pageable
memory (``LinkSpec.pageable_factor``).  Unified-memory machines and engines other than
llama.cpp / Ollama get no op offload: their CPU layers run on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.engines import engine_for

OP_OFFLOAD_MIN_BATCH = 32  # ggml-cuda.cu: GGML_OP_OFFLOAD_MIN_BATCH unset


@dataclass(frozen=True)
class OpOffload:
    """How a llama.cpp-family engine offloads host-weight ops of one ubatch to the GPU.

    ``link_bytes_per_s`` is the host→device rate of the weight copies (pageable under
    mmap); ``ubatch_tokens`` is ``n_ubatch``; a ubatch of at least ``min_batch_tokens``
    tokens is offloaded.
    """

    link_bytes_per_s: float
    ubatch_tokens: int = 512
    min_batch_tokens: int = OP_OFFLOAD_MIN_BATCH

    def offloads(self, ubatch_tokens: int) -> bool:
        return ubatch_tokens >= self.min_batch_tokens


def ubatch_split(tokens: int, ubatch_tokens: int) -> tuple[tuple[int, int], ...]:
    """The ubatches one step of ``tokens`` runs as: ``((size, how many), ...)``.

    llama.cpp's simple split takes the batch's tokens in order, ``n_ubatch`` at a time,
    so all ubatches are full but the last.
    """
    full, rest = divmod(int(tokens), ubatch_tokens)
    return tuple((size, n) for size, n in ((ubatch_tokens, full), (rest, 1)) if n and size)


def op_offload_for(scenario: Any) -> OpOffload | None:
    """The scenario's op offload, or None when its engine would not offload.

    The engine's knobs (kvsim.engines.config.SlotEngineConfig, llama.cpp's defaults):
    ``op_offload`` (``--no-op-offload`` = False; default True), ``use_mmap``
    (``--no-mmap`` = False; default True: pageable copies) and
    ``op_offload_min_batch`` (``GGML_OP_OFFLOAD_MIN_BATCH``; default 32).
    """
    eng, link, host = scenario.engine, scenario.link, scenario.host
    if not engine_for(eng.preset).op_offload or not eng.op_offload:
        return None
    if link is None or link.name == "unified" or (host is not None and host.unified_with_gpu):
        return None
    pageable = eng.use_mmap
    rate = link.h2d_bytes_per_s * (link.pageable_factor if pageable else 1.0)
    return OpOffload(link_bytes_per_s=rate, ubatch_tokens=eng.n_ubatch,
                     min_batch_tokens=eng.op_offload_min_batch)
