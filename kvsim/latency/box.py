"""A scenario's box of several GPUs as :class:`kvsim.latency.multi_gpu.MultiGpuLatency`:
each GPU's shares of the work, read from the memory budget's per-GPU parts.

- layer split (llama.cpp / Ollama) and ``none``: each GPU holding layers is a stage; its
  layers' share of the linear and attention work and of the weights, its KV buffer's
  share of the KV read, the head where the output layer is; f32 activations (ggml);
  llama.cpp pipelines a prompt's ubatches when every layer is on the GPUs and the
  backend can (:data:`PIPELINE_BACKENDS`);
- row: one stage of every GPU, each its row share of every matrix (and of the head), its
  home layers' KV and attention (in proportion to its KV buffer);
- vLLM / SGLang ranks: ``pipeline_parallel`` stages of ``tensor_parallel`` ranks, each
  ``1/tp`` of its stage's layers and head, its KV heads (``max(1, n_kv // tp)`` of
  ``n_kv``: kvsim.engines._paged_ranks.kv_head_fraction); 16-bit activations.

NOTE: the layers left on the CPU (a partial offload) run at the host's rates; the link is
the scenario's ``gpu_link`` (None: no copy is priced).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvsim.config.gpu_set import gpu_set_label
from kvsim.config.specs import GpuSpec
from kvsim.engines._paged_ranks import kv_head_fraction
from kvsim.latency.backend import resolve_backend
from kvsim.latency.multi_gpu import Link, MultiGpuLatency, Share
from kvsim.latency.roofline import GpuRates, RooflineLatency
from kvsim.model.weights import model_weights

RatesOf = Callable[[GpuSpec], GpuRates]

PIPELINE_BACKENDS = frozenset({"CUDA", "ROCm"})
"""Backends on which llama.cpp pipelines a batch's ubatches through a layer split: it
does so only when every device's backend reports async compute and events
(``llama_context``: ``pipeline_parallel``), which ggml-cuda (and its HIP build) has long
done. ggml-vulkan's events came late 2025 and only began to wait in llama.cpp PR #20518
(2026-03, "events were set, but the wait command was never submitted to the queue"), so
the published Vulkan boxes ran without it; kvsim leaves Vulkan and the other backends
unpipelined, the slower reading."""


def _layer_stages(b: Any, gpus: tuple[GpuSpec, ...], rates_of: RatesOf, kv_total: int
                  ) -> tuple[list[list[Share]], list[int]]:
    L = b.num_layers
    busy = [d for d in b.devices if d.layers or d.holds_output]
    stages = [[Share(rates_of(gpus[d.index]), d.layers / L, d.layers / L,
                     d.kv_bytes / kv_total if kv_total else 0.0, d.layers / L,
                     1.0 if d.holds_output else 0.0)] for d in busy]
    return stages, [d.layers for d in busy]


def _row_stage(b: Any, gpus: tuple[GpuSpec, ...], rates_of: RatesOf, kv_total: int
               ) -> tuple[list[list[Share]], list[int]]:
    on = b.gpu_layers / b.num_layers
    stage = []
    for d in b.devices:
        home = d.kv_bytes / kv_total if kv_total else 0.0
        stage.append(Share(rates_of(gpus[d.index]), d.weight_fraction * on, home, home,
                           home, d.weight_fraction if b.head_on_gpu else 0.0))
    return [stage], [b.gpu_layers]


def _rank_stages(b: Any, gpus: tuple[GpuSpec, ...], rates_of: RatesOf, model: Any
                 ) -> tuple[list[list[Share]], list[int]]:
    L, tp = b.num_layers, b.tensor_parallel
    heads = float(kv_head_fraction(model, tp))
    stages, layers = [], []
    for s in range(b.pipeline_parallel):
        ranks = b.devices[s * tp:(s + 1) * tp]
        stages.append([Share(rates_of(gpus[d.index]), d.layers / L / tp, d.layers / L / tp,
                             heads * d.layers / L, d.layers / L / tp,
                             1 / tp if d.holds_output else 0.0) for d in ranks])
        layers.append(ranks[0].layers)
    return stages, layers


def box_latency(scenario: Any, budget: Any, base: RooflineLatency, rates_of: RatesOf
                ) -> MultiGpuLatency:
    """The step-time model of ``scenario``'s box as ``budget`` lays it out (module
    docstring); ``base`` prices the work of a step, ``rates_of`` a GPU's rates."""
    gpus, model, b = scenario.gpus, scenario.model, budget
    kv_total = b.kv_reserved_bytes + b.kv_cpu_bytes
    if b.split in ("layer", "none"):
        stages, layers = _layer_stages(b, gpus, rates_of, kv_total)
    elif b.split == "row":
        stages, layers = _row_stage(b, gpus, rates_of, kv_total)
    else:
        stages, layers = _rank_stages(b, gpus, rates_of, model)
    slot = b.split in ("layer", "none", "row")
    L, host = b.num_layers, scenario.host
    cpu_layers = (L - b.gpu_layers) / L
    cpu = None
    if cpu_layers or not b.head_on_gpu:
        rates = GpuRates(host.cpu_flops, host.cpu_flops, host.memory_bandwidth_bytes_per_s,
                         host.memory_bandwidth_bytes_per_s, 0.0)
        cpu = Share(rates, cpu_layers, cpu_layers, b.kv_cpu_bytes / kv_total if kv_total
                    else 0.0, cpu_layers, 0.0 if b.head_on_gpu else 1.0)
    g = scenario.gpu_link
    link = None if g is None else Link(g.bytes_per_s, g.latency_s)
    pipelined = b.split == "layer" and not cpu and len(stages) > 1 \
        and resolve_backend(scenario.latency.backend, scenario.gpu) in PIPELINE_BACKENDS
    return MultiGpuLatency(
        base, model_weights(model, scenario.weights), stages, b.split, link,
        hidden=model.hidden_size, act_bytes=4 if slot else 2, vocab=model.vocab_size,
        layers=layers, ubatch=scenario.engine.n_ubatch if pipelined else None, cpu=cpu,
        label=f"{gpu_set_label([x.name for x in gpus])} ({b.split} split, "
              f"{g.name if g is not None else 'no GPU link'})")
