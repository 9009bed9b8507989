"""llama.cpp's *op offload*: large-batch matmuls on host-resident weights run on the GPU.

What the ggml backend scheduler does when some weights live in host memory (layers
beyond ``-ngl``, MoE experts that ``--fit`` or ``-ot exps=CPU`` leave in RAM), as read
in the llama.cpp sources — facts only, no code carried over:

- ``ggml_backend_sched_backend_id_from_cur`` (ggml-org/llama.cpp
  ``ggml/src/ggml-backend.cpp``): an op whose weight sits in a host buffer of the
  lowest-priority (CPU) backend is moved to a higher-priority backend when the
  scheduler's ``op_offload`` flag is set and that backend's ``offload_op`` says yes;
  the weight then becomes a split input, copied to the device before the split runs.
- ``ggml_backend_cuda_device_offload_op`` / ``get_op_batch_size`` (ggml-org/llama.cpp
  ``ggml/src/ggml-cuda/ggml-cuda.cu``): yes when the op's batch — ``ne[1]`` of a
  ``MUL_MAT``, ``ne[2]`` (the tokens) of a ``MUL_MAT_ID``, never a ``GET_ROWS`` — is at
  least ``op_offload_min_batch_size``, which is ``GGML_OP_OFFLOAD_MIN_BATCH`` from the
  environment or **32**.  The same file serves ROCm/HIP builds.
- ``ggml_backend_sched_compute_splits`` (same ``ggml-backend.cpp``): the copy into a
  split's input waits for the split's backend to finish with the buffer and is issued
  on that backend, so copy and compute do not overlap; for ``MUL_MAT_ID`` only the
  experts that the ubatch's router picked are copied.
- The scheduler's pass 2 spreads GPU assignments to neighbouring unassigned ops
  ("cpu will never be used unless weights are on cpu"), so the offloaded layers'
  attention runs on the GPU too and reads their KV (kept in host memory with the
  layer) as another split input.
- ``--no-op-offload`` (ggml-org/llama.cpp PR #13386, May 2025; ``common/arg.cpp``)
  turns it off; the default is on (``cparams.op_offload = !no_op_offload``); before that
  PR there was no switch.  Ollama's own ggml engine creates its scheduler with
  ``op_offload`` true (ollama/ollama ``ml/backend/ggml/ggml.go``,
  ``ggml_backend_sched_new_ext``), and from v0.30 it runs llama-server itself
  (docs/reference/engines.md §4.4).
- With mmap (llama.cpp's default) the loader does not put host weights in the GPU
  backend's pinned host buffer ("avoid using a host buffer when using mmap",
  ggml-org/llama.cpp ``src/llama-model.cpp`` / ``llama-model-loader.cpp``): the copies
  read pageable memory, at ``LinkSpec.pageable_factor`` of the pinned rate
  (docs/reference/hardware-and-models.md §3); ``--no-mmap`` loads them into pinned ``CUDA_Host``
  memory.
- A batch runs as micro-batches of ``n_ubatch`` tokens (docs/reference/engines.md §3.5), one graph —
  one decision, one copy of every host weight — each.

Unified-memory machines (no PCIe hop, docs/reference/hardware-and-models.md §3) and engines other
than llama.cpp / Ollama get no op offload: their layers on the CPU run there as before.
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


def experts_used_fraction(tokens: int, pick_fraction: float) -> float:
    """Expected share of an MoE layer's experts that ``tokens`` tokens route to, each
    token picking ``k`` of ``E`` (``pick_fraction = k/E``): ``1 − (1 − k/E)^tokens``.
    Uniform routing is the planning assumption; real routers are skewed, which lowers
    the share only for small ubatches."""
    if pick_fraction <= 0.0:
        return 0.0
    return 1.0 - (1.0 - pick_fraction) ** tokens


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
    if link is None or link.name == "unified" or getattr(host, "unified_with_gpu", False):
        return None
    pageable = eng.use_mmap
    rate = link.h2d_bytes_per_s * (link.pageable_factor if pageable else 1.0)
    return OpOffload(link_bytes_per_s=rate, ubatch_tokens=eng.n_ubatch,
                     min_batch_tokens=eng.op_offload_min_batch)
