"""Era A's compute-graph estimate: ``memory.graph.partial`` / ``memory.graph.full``
(docs/reference/engines.md §4.2).

Ollama's estimator sizes the graph per GGUF architecture (ollama/ollama ``GraphSize``:
``llm/ggml.go`` from PR #3463, 2024-04, then ``fs/ggml/ggml.go``), two figures: the
graph when every layer is on the GPUs (full) and when some are not (partial, which also
holds the output projection's dequantised copy).  An architecture without a case gets
``GQA x KV / 6`` for both (``llm/memory.go``).  The formulas are the GGUF keys'
integer arithmetic, evaluated left to right as Go does: ``e`` embedding_length,
``h`` head_count, ``hkv`` head_count_kv, ``hd`` the head width (key_length), ``v`` the
vocabulary, ``c`` the context of all slots (num_ctx x parallel), ``b`` min(c, num_batch).
Its KV (``kv_by_layer``) and the vision tower its engine loads with the output layer
(``projector_sizes``, ``VisionGraphSize``) are here too.

NOTE: the formulas are those of ``fs/ggml/ggml.go`` (the newest code); before PR #6260
(merged 2024-08-08) Llama's full graph lacked its ``4 b (e + v)`` floor, which binds
below ~3.5k tokens of context for Llama 3's vocabulary, and the 2024 code priced
``gemma`` without its context terms.  ``deepseek2`` keeps the fallback here: its case
reads the GGUF's MLA head layout, which differs between conversions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from kvsim.engines.ollama_releases import ollama_arch
from kvsim.model.vision import vision_bytes

if TYPE_CHECKING:
    from kvsim.config.specs import LayerGroup, ModelSpec, VisionEncoder
    from kvsim.engines.config import SlotEngineConfig
    from kvsim.model.weights import WeightSplit

MIB = 2**20
OLLAMA_EST_BYTES = {"f16": 2.0, "q8_0": 1.0, "q4_0": 0.5}   # §4.2 (real: 2 / 1.0625 / 0.5625)
GPT_OSS_SWA_CELLS = 4096
"""The cells ``GraphSize`` gives each gpt-oss sliding layer per sequence (its own
constant, not the model's 128-token window)."""


def _layer_kv(g: LayerGroup, engine: SlotEngineConfig, per_elem: float, arch: str) -> int:
    """One layer's era-A KV in group ``g`` (:func:`estimated_kv`)."""
    ctx = engine.context_tokens * engine.parallel
    batch = min(ctx, engine.n_batch)
    if g.kind == "ffn":
        return 0
    if g.kind == "recurrent":
        return g.state_elements * 4 * engine.parallel
    if g.kind == "mla":
        return int(ctx * g.latent_dim * per_elem)
    width = (g.head_dim_k + g.head_dim_v) * g.n_kv_heads
    if g.kind == "sliding" and arch == "gemma3":
        return int((engine.parallel * (g.window_tokens or 0) + batch) * width * per_elem)
    if g.kind == "sliding" and arch == "gptoss":
        return int(width * per_elem) * (engine.parallel * GPT_OSS_SWA_CELLS + batch)
    return int(ctx * width * per_elem)


def _group_kv(model: ModelSpec, engine: SlotEngineConfig, kv_type: str,
              windows: bool) -> list[tuple[LayerGroup, int]]:
    """Each layer group with one of its layers' era-A KV (:func:`kv_by_layer`)."""
    per_elem = OLLAMA_EST_BYTES.get(kv_type, 2.0)
    arch = ollama_arch(model) if windows else ""
    return [(g, _layer_kv(g, engine, per_elem, arch)) for g in model.layer_groups]


def kv_by_layer(model: ModelSpec, engine: SlotEngineConfig, kv_type: str,
                windows: bool = True) -> list[int]:
    """Era A's KV (``GraphSize``) of each layer in layer order: ``num_ctx x parallel x
    (hd_k + hd_v) x n_kv x {2, 1, 0.5}`` bytes as a whole number, recurrent layers their
    f32 state per sequence; with ``windows``, the cases that size sliding layers apart:
    gemma3's hold ``parallel x window + batch`` cells, gpt-oss's ``parallel x 4096 +
    batch`` (``batch``: min(context, num_batch)).
    NOTE: where a group does not say which layers it holds, every layer gets the mean."""
    groups = _group_kv(model, engine, kv_type, windows)
    if all(g.layer_indices is not None for g, _ in groups):
        out = [0] * model.num_layers
        for g, kv in groups:
            for i in g.layer_indices or ():
                out[i] = kv
        return out
    return [estimated_kv(model, engine, kv_type, windows) // model.num_layers] \
        * model.num_layers


def estimated_kv(model: ModelSpec, engine: SlotEngineConfig, kv_type: str,
                 windows: bool = True) -> int:
    """Era A's whole KV, ``memory.required.kv`` (:func:`kv_by_layer`'s layers summed)."""
    return sum(kv * g.layers for g, kv in _group_kv(model, engine, kv_type, windows))


class Dims(NamedTuple):
    """The GGUF keys ``GraphSize`` reads, for one model and start-up."""

    e: int
    h: int
    hkv: int
    hd: int
    v: int
    c: int
    b: int


def _llama(d: Dims) -> tuple[int, int]:
    e, h, hkv, hd, v, c, b = d
    full = max(4 * b * (1 + 4 * e + c * (1 + h)), 4 * b * (e + v))
    partial = 4 * b * e + max(
        4 * b * (1 + e + max(c, e)) + e * e * 9 // 16 + 4 * c * (b * h + hd * hkv),
        4 * b * (e + v) + e * v * 105 // 128)
    return partial, full


def _llama_experts(d: Dims, gate_bytes: int, ff: int) -> tuple[int, int]:
    """A Llama-architecture MoE (Mixtral) whose experts are one tensor per layer."""
    e, h, hkv, hd, _, c, b = d
    partial = max(3 * gate_bytes + 4 * b * (2 * ff + hkv + e + c + hd * hkv),
                  4 * (c * b * h + c * hd * hkv + b * 1024 + hd * hkv * b))
    return partial, _llama(d)[1]


def _gemma(d: Dims) -> tuple[int, int]:
    e, h, _, hd, v, c, b = d
    full = max(4 * b * (e + v), 4 * b * (2 + c + c * h + 2 * e + 2 * hd * h))
    partial = max(4 * e * b + e * v * 105 // 128 + 4 * v * b,
                  4 * b * (2 * e + 1 + 2 * hd * h + c + c * h) + 4 * hd * c * 8
                  + e * hd * h * 9 // 16)
    return partial, full


def _command_r(d: Dims) -> tuple[int, int]:
    e, h, _, _, v, c, b = d
    full = max(4 * b * (e + v), 4 * b * (2 + 4 * e + c * (1 + h)))
    partial = max(4 * b * (e + v) + e * v * 105 // 128,
                  4 * b * (1 + 2 * e + c * (1 + h)) + 4 * e * c + e * e * 9 // 16)
    return partial, full


def _qwen2(d: Dims) -> tuple[int, int]:
    e, h, _, _, v, c, b = d
    full = max(4 * b * (e + v), 4 * b * (1 + 2 * e + c + c * h))
    partial = max(4 * b * (e + v) + e * v * 105 // 128,
                  4 * (b * (1 + 2 * e + c * (1 + h)) + e * (1 + c)))
    return partial, full


_CASES = {"llama": _llama, "llama4": _llama, "gemma2": _gemma, "gemma3": _gemma,
          "command-r": _command_r, "qwen2": _qwen2}


OLLAMA_VISION_ARCHS = frozenset({"gemma3", "mistral3", "llama4", "qwen25vl"})
"""Architectures whose Ollama library models carry their vision tower in the model's own
GGUF, run by Ollama's engine (``VisionGraphSize``): its weights and graph are placed with
the output layer."""


def _tower_bytes(v: VisionEncoder) -> int:
    """The tower's tensors as Ollama's GGUF holds them (the ``v.`` ones): matrices in 16
    bits, biases and norm vectors in f32; the projector's ``mm.`` tensors are not among
    them (kvsim.model.vision counts the tower and projector at 16 bits)."""
    h, i = v.hidden_size, v.intermediate_size
    mats = v.depth * (4 * h * h + (3 if v.gated_mlp else 2) * h * i) \
        + v.in_channels * v.temporal_patch_size * v.patch_size ** 2 * h \
        + v.position_embeddings * h
    norm = 2 * h if v.norm_bias else h
    vecs = v.depth * (2 * norm + 4 * h + (2 * i if v.gated_mlp else i) + h) \
        + (h if v.patch_bias else 0) + (norm if v.post_norm else 0)
    return 2 * mats + 4 * vecs


def projector_sizes(model: ModelSpec, arch: str) -> tuple[int, int]:
    """(weights, graph) of the vision tower Ollama's estimate places with the output layer
    (``VisionGraphSize``): the tower's 16-bit tensors, and for gemma3 / mistral3 the graph
    ``4 x (image² x channels + hidden x patch + patches² x heads)`` of one image; (0, 0)
    for a text model (and the graph 0 where the heads are not recorded)."""
    v = model.vision_encoder
    if v is None or arch not in OLLAMA_VISION_ARCHS:
        return 0, 0
    weights = _tower_bytes(v) if v.spatial_merge_size == 1 else vision_bytes(model)
    side = math.isqrt(v.position_embeddings)  # SigLIP: 896 px / 14 px = 64 patches a side
    if arch not in ("gemma3", "mistral3") or not v.attention_heads or side * side != \
            v.position_embeddings:
        return weights, 0
    image, patches = side * v.patch_size, side * side
    return weights, 4 * (image * image * v.in_channels + v.hidden_size * v.patch_size
                         + patches * patches * v.attention_heads)


def graph_sizes(model: ModelSpec, arch: str, ws: WeightSplit, kv_bytes: int, context: int,
                num_batch: int, parallel: int, flash_attn: bool) -> tuple[int, int]:
    """(partial, full) graph bytes of the estimate for ``model`` (GGUF architecture
    ``arch``, :func:`kvsim.engines.ollama_releases.ollama_arch`) with ``context`` cells
    over all slots; ``kv_bytes``: the estimate's KV, whose ``GQA x KV / 6`` is the
    fallback."""
    hd = model.head_dim
    d = Dims(model.hidden_size, model.num_attention_heads, model.num_kv_heads, hd,
             model.vocab_size, context, min(context, num_batch))
    fallback = model.num_attention_heads // max(1, model.num_kv_heads) * kv_bytes // 6
    if arch in ("llama", "llama4") and model.num_experts and ws.expert_bytes_per_layer:
        ff = model.moe_intermediate_size or model.ffn_intermediate_size or 0
        return _llama_experts(d, ws.expert_bytes_per_layer // 3, ff)
    if arch == "gptoss":  # its own case: the fallback doubled, or a flat size with FA
        partial = (4 * parallel + (context >> 10) + 110) * MIB if flash_attn else \
            2 * model.num_attention_heads // max(1, model.num_kv_heads) * kv_bytes // 6
        return partial, partial
    case = _CASES.get(arch)
    return case(d) if case is not None else (fallback, fallback)
