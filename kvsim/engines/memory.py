"""The static memory budget: how a real engine lays out device memory at load time.

Device memory = driver/context reserve + display/other processes + weights on the GPU
+ activation/compute buffers + engine overhead + KV reserved (docs/design/DESIGN.md §3.1).  How
each row is sized depends on the engine (``docs/reference/engines.md``):

- **llama.cpp** (§3): all ``n_ctx`` KV cells allocated at start, as one unified pool
  or one stream per slot; SWA layers get a smaller cache; compute buffers; with
  ``-ngl`` auto the ``--fit`` logic leaves 1 GiB free and spills layers to the CPU.
- **Ollama** (§4): the same true layout with ``num_ctx × parallel`` cells, but the
  layer placement follows Ollama's own era-A estimate, which under-counts q8_0/q4_0
  KV (1 and 0.5 bytes/element) — the estimate and the true figure are both kept.
- **vLLM** (§1.1): a ``gpu_memory_utilization`` share of the device holds weights,
  profiled activations, non-torch memory and the KV block pool; CUDA graphs come on
  top; startup fails if one ``max_model_len`` request does not fit the pool.
- **SGLang** (§2.1): ``mem_fraction_static`` of the device holds weights + KV pool.

Each engine object computes its own (``Engine.memory_budget``; the slot engines' layout
in :mod:`kvsim.engines._slot_layout`, the paged ones' in :mod:`kvsim.engines._paged_layout`),
reached through :func:`kvsim.engines.budget.memory_budget`.
The simulator sizes its pools from :class:`MemoryBudget`: ``kv_pool_tokens`` (cells /
pool tokens), ``num_gpu_blocks`` and ``block_tokens`` (paged), ``slot_tokens`` (per
sequence limit), ``kv_reserved_bytes``, ``gpu_layers`` and ``weights_cpu_bytes``.

NOTE: ``total_bytes`` is the sum of the GPU rows and nothing else; KV and weights on
the CPU are reported but never counted against the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

MIB = 2**20
GIB = 2**30
PLANNING_LIMIT = 0.85                    # docs/design/DESIGN.md §3.1: stay at or under 85 % at peak
DEFAULT_DRIVER_RESERVE_BYTES = 400 * MIB  # docs/reference/hardware-and-models.md §4: CUDA context
# 0.4 GiB


@dataclass(frozen=True)
class OllamaEstimate:
    """What Ollama believes it needs (docs/reference/engines.md §4.2-§4.3): its
    ``memory.required.*`` figures and where it placed the layers."""

    kv_bytes: int            # memory.required.kv: the whole model's KV, ctx*parallel*...
    graph_bytes: int         # per GPU holding layers: era A's full or partial graph, or measured
    reserve_bytes: int       # per GPU: OLLAMA_GPU_OVERHEAD + 457 MiB + graph
    total_bytes: int         # memory.required.partial: what the GPUs were charged
    gpu_layers: int          # repeating layers placed on the GPUs
    full_bytes: int = 0      # memory.required.full: partial + what overflowed
    allocations: tuple[int, ...] = ()   # memory.required.allocations, per GPU
    split: tuple[int, ...] = ()         # layers.split: layers per GPU (output included)
    graph_partial_bytes: int = 0        # memory.graph.partial (eras B/C: the measured one)
    graph_full_bytes: int = 0           # memory.graph.full
    projector_weights_bytes: int = 0    # projector.weights: a vision tower in the model's GGUF
    projector_graph_bytes: int = 0      # projector.graph
    output_on_gpu: bool = False         # the output layer found a GPU

    @property
    def layers_offload(self) -> int:
        """``layers.offload``: the repeating layers placed plus the output layer (Ollama's
        ``estimate.Layers``; a complete fit is the layer count + 1)."""
        return self.gpu_layers + self.output_on_gpu


@dataclass(frozen=True)
class DeviceShare:
    """One GPU's part of a several-GPU layout (all sizes in bytes, on that GPU).

    ``layers``: repeating layers whose weights (layer / pipeline split) or whose slice of
    every matrix (row / tensor split: then ``layers`` is all of them and ``weight_fraction``
    the slice) this GPU holds; ``kv_bytes``: the KV of the cells it holds.
    """

    index: int                    # CUDA device index, in the scenario's order
    gpu: str                      # GPU profile slug
    device_bytes: int             # the memory the engine may use on it
    layers: int
    weight_fraction: float        # share of each of its layers' matrices (1 = whole layers)
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int            # activation / compute buffers
    overhead_bytes: int           # driver reserve, per-rank engine overhead, CUDA graphs
    holds_output: bool = False    # the output head (and its logits) is here

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_bytes + self.compute_bytes
                + self.overhead_bytes)

    @property
    def fraction(self) -> float:
        return self.total_bytes / self.device_bytes


Split = Literal["single", "none", "layer", "row", "tensor", "pipeline", "tensor+pipeline"]
"""How the layout spreads over the GPUs: one GPU; llama.cpp ``--split-mode none`` (one GPU
of a box, ``--main-gpu``); llama.cpp / Ollama whole layers per GPU (``layer``) or rows of
every matrix (``row``); vLLM / SGLang tensor and/or pipeline parallel ranks."""


@dataclass(frozen=True)
class MemoryBudget:
    """One engine's load-time memory layout on one GPU (all sizes in bytes).

    Pool-sizing fields for the simulator:

    - ``kv_pool_tokens``: KV cells allocated on load — llama.cpp ``n_ctx`` (all slots),
      Ollama ``num_ctx × parallel``, vLLM ``num_gpu_blocks × block_tokens`` ("GPU KV
      cache size: N tokens"), SGLang ``max_total_tokens``.
    - ``slot_tokens``: most tokens one sequence may hold — llama.cpp ``n_ctx_seq``
      (= ``n_ctx`` when unified), Ollama ``num_ctx``, vLLM/SGLang ``max_model_len``.
    - ``num_gpu_blocks`` / ``block_tokens``: paged engines (None / 1 for slot engines).
    - ``kv_reserved_bytes``: KV bytes on the GPU (slot engines: all cells of the GPU
      layers; paged: the whole pool).  ``kv_cpu_bytes``: KV of layers left on the CPU.
    - ``gpu_layers`` of ``num_layers`` repeating layers on the GPU;
      ``weights_cpu_bytes`` stay in host memory (partial offload).  MoE under
      llama.cpp ``--fit``: the routed experts of ``cpu_expert_layers`` of the GPU
      layers stay in host memory too (their attention and KV on the GPU).
    - ``kv_needed_bytes``: what ``parallel`` sequences of ``slot_tokens`` need (paged:
      rounded up to blocks) — equal to ``kv_reserved_bytes`` for slot engines.
    - ``kv_groups`` / ``blocks_per_request``: vLLM's hybrid KV cache manager
      (kvsim.model.hybrid) — ``(kind, window_tokens)`` per KV cache group, and the most
      blocks one ``slot_tokens`` request holds across them; ``()`` / None otherwise.
    - Several GPUs (``split`` other than ``single``): the pool-sizing fields are the
      box's (the KV cells every GPU holds its layers' part of; vLLM's blocks per rank);
      the byte rows are summed over the GPUs, ``device_bytes`` too, and ``devices``
      holds each GPU's own part — judge the planning line per GPU (the fullest binds).
    """

    engine: str
    allocator: str
    device_bytes: int
    driver_reserve_bytes: int
    display_reserve_bytes: int
    weights_format: str
    weights_total_bytes: int
    weights_gpu_bytes: int
    weights_cpu_bytes: int
    gpu_layers: int
    num_layers: int
    activation_bytes: int
    engine_overhead_bytes: int
    cache_type_k: str
    cache_type_v: str
    kv_bytes_per_token: int
    kv_reserved_bytes: int
    kv_cpu_bytes: int
    kv_needed_bytes: int
    kv_pool_tokens: int
    slot_tokens: int
    parallel: int
    block_tokens: int = 1
    num_gpu_blocks: int | None = None
    max_concurrency: float | None = None
    fits: bool = True
    failure: str | None = None
    log_lines: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    estimate: OllamaEstimate | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    cpu_expert_layers: int = 0
    head_on_gpu: bool = True  # the output head's place (llama.cpp --fit: first)
    kv_groups: tuple[tuple[str, int], ...] = ()
    blocks_per_request: int | None = None
    split: Split = "single"
    devices: tuple[DeviceShare, ...] = ()   # one per GPU when split != "single"
    tensor_parallel: int = 1                # ranks each layer is split over (row / tensor)
    pipeline_parallel: int = 1              # stages the layers run in (layer / pipeline)

    @property
    def total_bytes(self) -> int:
        return (self.driver_reserve_bytes + self.display_reserve_bytes + self.weights_gpu_bytes
                + self.activation_bytes + self.engine_overhead_bytes + self.kv_reserved_bytes)

    @property
    def device_fraction(self) -> float:
        """The share of device memory used; with several GPUs, the fullest one's (the
        planning line holds per GPU)."""
        if self.devices:
            return max(d.fraction for d in self.devices)
        return self.total_bytes / self.device_bytes

    @property
    def headroom_to_85_bytes(self) -> int:
        """Bytes left below the 85 % planning line (negative: over it); with several
        GPUs, on the GPU with the least left."""
        if self.devices:
            return min(int(PLANNING_LIMIT * d.device_bytes) - d.total_bytes
                       for d in self.devices)
        return int(PLANNING_LIMIT * self.device_bytes) - self.total_bytes

    @property
    def needed_bytes(self) -> int:
        """Device bytes if the KV row were exactly what ``parallel`` sequences need."""
        return self.total_bytes - self.kv_reserved_bytes + self.kv_needed_bytes

    @property
    def needed_fraction(self) -> float:
        """:attr:`needed_bytes` as a share of the device; with several GPUs, the fullest
        one's, each GPU's KV scaled to what the sequences need."""
        if self.devices:
            ratio = self.kv_needed_bytes / self.kv_reserved_bytes if self.kv_reserved_bytes \
                else 1.0
            return max((d.total_bytes - d.kv_bytes + d.kv_bytes * ratio) / d.device_bytes
                       for d in self.devices)
        return self.needed_bytes / self.device_bytes

    @property
    def all_layers_on_gpu(self) -> bool:
        return self.gpu_layers == self.num_layers and not self.cpu_expert_layers

    def rows(self) -> list[tuple[str, int]]:
        """(label, bytes) rows of the device budget, in the order engines allocate."""
        return [
            ("driver / CUDA context reserve", self.driver_reserve_bytes),
            ("display / other processes", self.display_reserve_bytes),
            (f"weights on GPU ({self.gpu_layers}/{self.num_layers} layers"
             + (f"; experts of {self.cpu_expert_layers} in RAM)" if self.cpu_expert_layers
                else ")"), self.weights_gpu_bytes),
            ("activation & compute buffers", self.activation_bytes),
            ("engine overhead (non-torch, CUDA graphs)", self.engine_overhead_bytes),
            (f"KV reserved ({self.cache_type_k}/{self.cache_type_v})", self.kv_reserved_bytes),
        ]
