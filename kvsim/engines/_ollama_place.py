"""How an Ollama release decides how many layers go to which GPU (docs/reference/engines.md
§4.2-§4.3): its era-A estimate and its eras-B/C packing, for one GPU or several.

- **Era A** (ollama/ollama ``llm/memory.go`` ``estimateGPULayers``, v0.11.4 and
  before): a GPU takes part when its free memory holds OLLAMA_GPU_OVERHEAD, the graph,
  the minimum (457 MiB) and two layers; each such GPU is charged the minimum and one
  layer "as a buffer"; the repeating layers, last first, go round-robin
  (``gpus[i % j]``), a GPU that cannot take a layer dropping out; then the output
  layer; every GPU holding layers is charged the graph (several GPUs: the partial-offload
  graph).  ``memory.required.partial`` is the GPUs' allocations, ``.full`` that plus
  what overflowed, ``.kv`` the whole model's KV; the runner is started with
  ``--tensor-split`` = the layer counts.
- **Eras B/C** (``llm/server.go`` ``assignLayers``/``fit``): GPUs by free memory
  (largest first), each less the minimum, OLLAMA_GPU_OVERHEAD and the graph the runner
  measured; the fewest GPUs that hold every layer (the output layer last in the list,
  placed first), filling from the back with the smallest capacity factor that keeps the
  most layers (a binary search); if not all fit, again without the output layer.

NOTE: a layer costs its weights plus ``1/L`` of the KV (the estimator's per-layer KV);
the graph is era A's per-architecture estimate (kvsim.engines._ollama_graph) or the
measured compute buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.engines._ollama_graph import (
    estimated_kv,
    graph_sizes,
    kv_by_layer,
    projector_sizes,
)
from kvsim.engines.memory import OllamaEstimate
from kvsim.engines.ollama_releases import ollama_arch

if TYPE_CHECKING:
    from kvsim.config.specs import ModelSpec
    from kvsim.engines.config import SlotEngineConfig
    from kvsim.model.weights import WeightSplit


@dataclass(frozen=True)
class Assignment:
    """Layers per GPU (repeating layers, then whether the output layer is on it) and what
    the estimate charged each GPU."""

    counts: tuple[int, ...]          # repeating layers per GPU
    output: int                      # GPU of the output layer, -1: CPU
    allocations: tuple[int, ...]     # era A: bytes charged per GPU (0 for B/C)
    overflow_bytes: int = 0          # era A: what did not fit
    fully_loaded: bool = False       # era A: every layer (and the output) on the GPUs

    @property
    def gpu_layers(self) -> int:
        return sum(self.counts)

    @property
    def split(self) -> tuple[int, ...]:
        """The runner's ``--tensor-split``: layers per GPU, the output layer included."""
        return tuple(c + (i == self.output) for i, c in enumerate(self.counts))


def estimate_layers(free: Sequence[int], layers: int | Sequence[int], head_bytes: int,
                    graphs: tuple[int, int], minimum_bytes: int, overhead_bytes: int,
                    num_layers: int, requested: int | None = None) -> Assignment:
    """Era A's estimate over GPUs with ``free`` bytes each (module docstring);
    ``layers``: each repeating layer's weights and KV (one size for all, or one a layer:
    the first is also the buffer); ``head_bytes``: the last layer placed (the output
    layer, with a vision tower Ollama's engine loads beside it); ``graphs``: the
    (partial, full) graph — the larger one is kept free while placing, each GPU holding
    layers is charged the full one when every layer and the last one found a GPU, else
    the partial one; ``requested``: num_gpu, the most layers to place (None = all that
    fit)."""
    sizes = [layers] * num_layers if isinstance(layers, int) else list(layers)
    n, graph_bytes = len(free), max(graphs)
    space = [i for i in range(n) if free[i] >= overhead_bytes + graph_bytes + minimum_bytes
             + 2 * sizes[0]]
    alloc, counts = [0] * n, [0] * n
    for i in space:
        alloc[i] += minimum_bytes + sizes[0]
    placed, overflow = 0, 0
    for i in reversed(range(num_layers)):
        layer_bytes = sizes[i]
        if requested is not None and placed >= requested:
            overflow += layer_bytes
            continue
        while space:
            g = space[i % len(space)]
            if free[g] > overhead_bytes + alloc[g] + graph_bytes + layer_bytes:
                alloc[g] += layer_bytes
                counts[g] += 1
                placed += 1
                break
            space.remove(g)
        if not space:
            overflow += layer_bytes
    output = -1
    if head_bytes and (requested is None or placed < requested):
        for j in range(len(space), 0, -1):  # NOTE: no GPU drops out here (llm/memory.go)
            g = space[placed % j]
            if free[g] > overhead_bytes + alloc[g] + graph_bytes + head_bytes:
                alloc[g] += head_bytes
                output = g
                break
    if head_bytes and output < 0:  # not placed, num_gpu's limit included: overflow
        overflow += head_bytes
    loaded = placed >= num_layers and (output >= 0 or not head_bytes)
    for i in range(n):
        if counts[i] or output == i:
            alloc[i] += graphs[loaded]
    return Assignment(tuple(counts), output, tuple(alloc), overflow, loaded)


def _fit(layers: Sequence[int], room: Sequence[float], capacity: float) -> list[int]:
    """``llm/server.go`` ``fit``: layers from the back onto the last GPU while they fit
    ``capacity`` of its room, then the one before it; the GPU of each layer placed."""
    device = len(room) - 1
    space = int(room[device] * capacity)
    at: list[int] = []
    for size in reversed(layers):
        while size > space:
            device -= 1
            if device < 0:
                return at
            space = int(room[device] * capacity)
        at.append(device)
        space -= size
    return at


def _best_fit(layers: Sequence[int], room: Sequence[float], high: float = 1.0) -> list[int]:
    """The smallest capacity factor (binary search, as ``distributeGPU``) that places as
    many layers as capacity ``high`` does: the layers spread over the GPUs given."""
    best = _fit(layers, room, high)
    if not best:
        return best
    low = 0.0
    while high - low > 1e-6:
        mid = (low + high) / 2
        got = _fit(layers, room, mid)
        if len(got) == len(best):
            high, best = mid, got
        else:
            low = mid
    return best


def pack_layers(free: Sequence[int], reserve: Sequence[int], layer_bytes: int,
                head_bytes: int, num_layers: int, requested: int | None = None) -> Assignment:
    """Eras B/C (module docstring): ``free`` and the per-GPU ``reserve`` (minimum +
    OLLAMA_GPU_OVERHEAD + graph) in device order; GPUs are tried largest free first.
    ``requested`` (num_gpu): that many repeating layers, the output layer too when it is
    all of them, placed even past the room on the last try (capacity up to 1000)."""
    order = sorted(range(len(free)), key=lambda i: -free[i])
    room = [max(0, free[i] - reserve[i]) for i in order]
    n = num_layers if requested is None else min(requested, num_layers)
    sizes = [layer_bytes] * n + ([head_bytes] if n == num_layers else [])
    at: list[int] = []
    for k in range(len(order)):
        force = requested is not None and k == len(order) - 1
        at = _best_fit(sizes, room[:k + 1], 1000.0 if force else 1.0)
        if len(at) == len(sizes):
            break
    with_head = n == num_layers and len(at) == len(sizes)
    if not with_head and n == num_layers:
        at = _best_fit(sizes[:-1], room, 1.0 if requested is None else 1000.0)
    counts = [0] * len(free)
    output = order[at[0]] if with_head else -1
    for device in at[1:] if with_head else at:
        counts[order[device]] += 1
    return Assignment(tuple(counts), output, (0,) * len(free))


CUDA_MINIMUM_BYTES, METAL_MINIMUM_BYTES = 457 * 2**20, 512 * 2**20
"""§4.2: the "minimum memory" Ollama keeps free per GPU, CUDA/ROCm (the preset's
``minimum_reserve_bytes``) and Metal (ollama/ollama ``discover``: ``metalMinimumMemory``);
:func:`ollama_estimate` takes Metal's on Apple GPUs where the preset's is left as it is."""


def ollama_estimate(model: ModelSpec, engine: SlotEngineConfig, ws: WeightSplit,
                    kv_type: str, free: Sequence[int],
                    measured: tuple[int, int] | None = None,
                    metal: bool = False) -> tuple[OllamaEstimate, Assignment]:
    """Where the release puts the layers over GPUs with ``free`` bytes, and its figures:
    era A (``measured`` None) with its own KV and graphs (:func:`era_a_graphs`; ``metal``:
    the GPUs are Apple's, with Metal's minimum), eras B/C with the ``measured`` (KV,
    compute)."""
    L = model.num_layers
    if metal and engine.minimum_reserve_bytes == CUDA_MINIMUM_BYTES:
        engine = engine.model_copy(update={"minimum_reserve_bytes": METAL_MINIMUM_BYTES})
    if measured is None:
        by_layer = kv_by_layer(model, engine, kv_type)
        kv = sum(by_layer)
        graphs = era_a_graphs(model, engine, ws, estimated_kv(model, engine, kv_type, False),
                              len(free), metal)
        graph = max(graphs)
    else:
        kv, graph = measured
        graphs = (graph, graph)
    reserve = engine.gpu_overhead_bytes + engine.minimum_reserve_bytes + graph
    layer = ws.per_layer_bytes + kv // L
    requested = None if engine.gpu_layers is None else \
        (engine.gpu_layers if engine.gpu_layers < L else L + 1)
    tower = projector_sizes(model, ollama_arch(model)) if measured is None else (0, 0)
    if measured is None:
        a = estimate_layers(free, [ws.per_layer_bytes + k for k in by_layer],
                            ws.head_bytes + sum(tower), graphs,
                            engine.minimum_reserve_bytes, engine.gpu_overhead_bytes, L,
                            requested)
        partial, full = sum(a.allocations), sum(a.allocations) + a.overflow_bytes
        graph = graphs[a.fully_loaded]
    else:
        head = ws.head_bytes + ws.output_extra_bytes  # the tower is on the output's device
        a = pack_layers(free, [reserve] * len(free), layer, head, L,
                        None if requested is None else min(requested, L))
        used = [i for i, c in enumerate(a.counts) if c or a.output == i]
        partial = len(used) * reserve + a.gpu_layers * layer + \
            (head if a.output >= 0 else 0)
        full = partial + (L - a.gpu_layers) * layer + (0 if a.output >= 0 else head)
    est = OllamaEstimate(kv_bytes=kv, graph_bytes=graph, reserve_bytes=reserve,
                         total_bytes=partial, gpu_layers=a.gpu_layers, full_bytes=full,
                         allocations=a.allocations, split=a.split,
                         graph_partial_bytes=graphs[0], graph_full_bytes=graphs[1],
                         projector_weights_bytes=tower[0], projector_graph_bytes=tower[1],
                         output_on_gpu=a.output >= 0)
    return est, a


def era_a_graphs(model: ModelSpec, engine: SlotEngineConfig, ws: WeightSplit, kv: int,
                 gpus: int, metal: bool) -> tuple[int, int]:
    """Era A's (partial, full) graph (kvsim.engines._ollama_graph; ``kv``: the KV of every
    attention layer at the whole context, as ``GraphSize`` sums it before its own cases):
    on Metal both are the full one, over several GPUs both the partial one
    (``llm/memory.go``)."""
    ctx = engine.context_tokens * engine.parallel
    partial, full = graph_sizes(model, ollama_arch(model), ws, kv, ctx, engine.n_batch,
                                engine.parallel, bool(engine.flash_attn))
    return (full, full) if metal else (partial, partial) if gpus > 1 else (partial, full)
