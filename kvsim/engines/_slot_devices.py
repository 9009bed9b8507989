"""Which GPU holds which layer, and its KV, weights and compute buffer, when llama.cpp
(and Ollama's runners) spread a model over several GPUs (docs/reference/engines.md §3.8).

The rules, from ggml-org/llama.cpp ``src/llama-model.cpp`` ``load_tensors``:

- the split points are the devices' shares normalised and summed in float32:
  ``--tensor-split`` when given (not all 0), else each device's free memory;
- of the ``n_layer + 1`` slots (the repeating layers, then the output layer) the last
  ``-ngl`` are on the GPUs; GPU slot ``k`` of ``act`` goes to the first device whose
  split point exceeds ``k / act`` (``std::upper_bound``), so each device holds a
  contiguous run of layers and the output layer lands on the last device;
- the token embedding (the input layer) stays in host memory;
- each layer's KV cache is allocated on the device holding the layer
  (``src/llama-kv-cache.cpp``: ``model.dev_layer(il)``), so a device's KV buffer is its
  layers' cells; each device holding layers gets its own compute buffer, the logits of
  the output layer only on its device;
- ``--split-mode row``: every layer and the output layer keep the home device above (its
  KV, norms and compute) while each matrix is split by rows over all devices by
  ``--tensor-split``, or, unset, CUDA's default: each device's total memory
  (ggml-cuda ``default_tensor_split``); MoE expert matrices, which the split buffer
  cannot hold, stay on the home device;
- ``--split-mode none``: only ``--main-gpu`` is used.

NOTE: a layer group that names its layers (``layer_indices``: the windowed and full
layers of gpt-oss, Gemma) is counted per device exactly; one that does not is spread in
proportion to the layers a device holds (exact for models whose layers are alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsim.config.specs import ATTENTION_KINDS, GpuSpec, ModelSpec
from kvsim.model.dtypes import cache_type
from kvsim.model.geometry import KvGeometry


def split_points(shares: Sequence[float]) -> np.ndarray:
    """llama.cpp's split points: the shares summed and normalised in float32."""
    sums = np.cumsum(np.asarray(shares, dtype=np.float32), dtype=np.float32)
    return (sums / sums[-1]).astype(np.float32)


def slot_homes(points: np.ndarray, slots: int) -> list[int]:
    """The device of each of ``slots`` GPU slots: the first whose split point exceeds
    ``k / slots`` (float32, as llama.cpp computes it)."""
    x = np.arange(slots, dtype=np.float32) / np.float32(max(slots, 1))
    return [int(i) for i in np.searchsorted(points, x, side="right")]


def free_shares(gpus: Sequence[GpuSpec], driver: int, display: int) -> list[float]:
    """Each device's free memory when llama.cpp loads: what the driver reports, less the
    CUDA context and (device 0) the display."""
    return [float(g.reported_memory_bytes - driver - (display if i == 0 else 0))
            for i, g in enumerate(gpus)]


@dataclass(frozen=True)
class Placement:
    """Where each repeating layer and the output layer are: a device index, -1 = CPU."""

    layers: tuple[int, ...]
    output: int

    def held(self, device: int) -> list[int]:
        return [i for i, d in enumerate(self.layers) if d == device]

    @property
    def gpu_layers(self) -> int:
        return sum(d >= 0 for d in self.layers)


def place(points: np.ndarray, num_layers: int, gpu_layers: int, head_on_gpu: bool
          ) -> Placement:
    """The last ``gpu_layers`` repeating layers (and the output layer when
    ``head_on_gpu``) on the GPUs by the split points, the rest on the CPU."""
    n = max(0, min(gpu_layers, num_layers))
    slots = n + (1 if head_on_gpu else 0)
    homes = slot_homes(points, slots)
    layers = [-1] * (num_layers - n) + homes[:n]
    return Placement(tuple(layers), homes[n] if head_on_gpu else -1)


@dataclass(frozen=True)
class GroupKv:
    """One layer group's KV in llama.cpp's cache: its layers (indices when the profile
    names them) and its bytes over all of them."""

    indices: tuple[int, ...] | None
    layers: int
    total_bytes: int


def group_kv(model: ModelSpec, geo: KvGeometry, n_ctx: int, swa_cells: Sequence[int],
             parallel: int) -> list[GroupKv]:
    """The cache's bytes per layer group: full layers ``n_ctx`` cells, windowed ones their
    SWA cells (``swa_cells``, in ``geo.windowed`` order), recurrent ones an f32 state per
    sequence (kvsim.engines._slot_layout sums the same)."""
    out: list[GroupKv] = []
    attention = [g for g in model.layer_groups if g.kind in ATTENTION_KINDS]
    swa = iter(swa_cells)
    for gb, lg in zip(geo.groups, attention, strict=True):
        cells = n_ctx if gb.window_tokens is None else next(swa)
        out.append(GroupKv(lg.layer_indices, lg.layers, gb.bytes_per_token * cells))
    f32 = cache_type("f32")
    for lg in model.layer_groups:
        if lg.kind == "recurrent":
            out.append(GroupKv(lg.layer_indices, lg.layers,
                               f32.row_bytes(lg.state_elements) * lg.layers * parallel))
    return out


def layers_kv(groups: Sequence[GroupKv], held: Sequence[int], num_layers: int) -> int:
    """KV bytes of the layers ``held`` (module NOTE)."""
    total = 0
    for g in groups:
        if g.indices is not None:
            total += g.total_bytes // g.layers * len(set(held) & set(g.indices))
        else:
            total += g.total_bytes * len(held) // num_layers
    return total
