"""Weight memory: bytes per weight format, and the per-layer split for partial offload.

Bits per weight come from the format's block layout where uniform and from llama.cpp's
published per-model measurements where a mix. AWQ/GPTQ/FP8 keep the token embedding and
output head at 16 bits (``embed_bits_per_weight``); a GGUF file type is sized tensor class
by tensor class as llama-quantize writes it (:func:`gguf_weights`, kvsim.model.gguf_mix),
its nominal bpw only naming it. Experts-only formats (``mxfp4``, ``mxfp4_moe``:
``other_bits_per_weight`` set) quantise routed MoE experts only. :class:`WeightSplit`
splits ``num_layers`` equal layers from the embedding and head for llama.cpp ``-ngl`` /
Ollama placement.

NOTE: a model without routed experts under an experts-only format is refused (InputError);
:func:`expert_params` is capped by what a layer holds after its Q/K/V/O projections.
NOTE: a tied head costs GPU bytes under llama.cpp and Ollama (loaded twice), not under vLLM
and SGLang (:meth:`WeightSplit.gpu_bytes`); a decode step reads it whole either way
(:attr:`WeightSplit.head_bytes`).
Design: docs/design/memory-layout.md (the bpw table and its sources).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvsim.config.specs import ModelSpec
from kvsim.errors import InputError, unknown_name
from kvsim.model.gguf_mix import (
    FILE_TYPES,
    TYPE_BITS,
    attention_classes,
    head_type,
    layer_rest_classes,
    stored_type,
)


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bits_per_weight: float
    source: str
    # experts-only formats: the width of every tensor that is not a routed expert
    other_bits_per_weight: float | None = None
    # token embedding and output head, where they stay wider than the layers (AWQ, ...)
    embed_bits_per_weight: float | None = None

    @property
    def experts_only(self) -> bool:
        return self.other_bits_per_weight is not None

    @property
    def embed_bits(self) -> float:
        """Width of the token embedding and the output head."""
        return self.embed_bits_per_weight or self.other_bits_per_weight or self.bits_per_weight


_FORMATS = {f.name: f for f in (
    WeightFormat("f32", 32.0, "4 bytes per weight"),
    WeightFormat("bf16", 16.0, "2 bytes per weight"),
    WeightFormat("f16", 16.0, "2 bytes per weight"),
    WeightFormat("fp8", 8.0, "1 byte per weight; embedding and head bf16; fp32 scales per "
                 "tensor, channel or 128 x 128 block (vLLM fp8.py weight_scale_inv) not counted: "
                 "at most 4 B per row of weights", embed_bits_per_weight=16.0),
    WeightFormat("q8_0", 8.5, "ggml block 34 B / 32 values"),
    WeightFormat("q6_k", 6.5625, "ggml block_q6_K 210 B / 256 values"),
    WeightFormat("q5_k_m", 5.68, "llama.cpp tools/quantize README (Llama-2-7B)"),
    WeightFormat("q4_k_m", 4.84, "llama.cpp tools/quantize README (Llama-2-7B)"),
    WeightFormat("q4_k_s", 4.58, "llama.cpp tools/quantize README (Llama-2-7B)"),
    WeightFormat("q4_0", 4.5, "ggml block 18 B / 32 values"),
    WeightFormat("iq4_nl", 4.5, "ggml block_iq4_nl 18 B / 32 values (ggml-common.h)"),
    WeightFormat("iq4_xs", 4.25, "ggml block_iq4_xs 136 B / 256 values"),
    WeightFormat("nvfp4", 4.5, "NVFP4 (ModelOpt): E2M1 4-bit values with one E4M3 scale per "
                 "16 = 9 B / 16 values (+ an FP32 scale per tensor); embedding and head "
                 "bf16", embed_bits_per_weight=16.0),
    WeightFormat("mxfp4", 4.25, "17 B / 32 values on the MoE experts; the rest bf16 (the "
                 "released gpt-oss checkpoints, docs/reference/models.csv notes)",
                 other_bits_per_weight=16.0),
    WeightFormat("mxfp4_moe", 4.25, "llama-quantize MXFP4_MOE: experts 17 B / 32 values, the "
                 "rest q8_0 34 B / 32 (llama.cpp src/llama-quant.cpp)",
                 other_bits_per_weight=8.5),
    WeightFormat("awq", 4.15625, "DERIVED: int4 + fp16 scale + int4 zero per 128; "
                 "embedding and head bf16", embed_bits_per_weight=16.0),
    WeightFormat("gptq", 4.15625, "DERIVED: int4 + fp16 scale + int4 zero per 128; "
                 "embedding and head bf16", embed_bits_per_weight=16.0),
)}
_ALIASES = {"fp32": "f32", "float32": "f32", "fp16": "f16", "float16": "f16", "bfloat16": "bf16", "int4_awq": "awq",
            "awq_int4": "awq", "int4_gptq": "gptq", "gptq_int4": "gptq", "int4": "awq",
            "fp8_e4m3": "fp8", "modelopt_fp4": "nvfp4"}


def weight_format_names() -> list[str]:
    return sorted(_FORMATS)


def weight_format(name: str, field: str = "weights") -> WeightFormat:
    key = name.lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in _FORMATS:
        raise unknown_name(field, name, weight_format_names() + sorted(_ALIASES))
    return _FORMATS[key]


@dataclass(frozen=True)
class WeightSplit:
    """Weight bytes of one model in one format, split for per-layer offload.

    ``total_bytes`` is the checkpoint: every tensor once, a tied embedding once.
    """

    format: str
    bits_per_weight: float
    total_bytes: int
    per_layer_bytes: int          # one repeating layer (attention + MLP / experts)
    non_repeating_bytes: int      # token embedding + output head (tied: the one tensor)
    embedding_bytes: int          # token embedding alone (part of non_repeating_bytes)
    num_layers: int
    expert_bytes_per_layer: int = 0  # MoE: one layer's routed experts (part of per_layer)
    tied: bool = False            # the output head is the token embedding's tensor
    output_extra_bytes: int = 0   # loaded wherever the output layer is (Ollama's engine:
    #                               a vision tower in the model's GGUF), read by no step
    # the routed experts' own width where it differs from ``bits_per_weight`` (a GGUF mix)
    expert_bits_per_weight: float | None = None

    @property
    def expert_bits(self) -> float:
        """Bits per routed-expert weight (expert bytes -> parameters)."""
        return self.expert_bits_per_weight or self.bits_per_weight

    def scaled_to(self, total_bytes: int) -> WeightSplit:
        """The same split with every part scaled so the checkpoint is ``total_bytes``: a
        file whose size is known (llama-bench prints it) keeps kvsim's proportions.
        NOTE: the parts' sum keeps its identity with ``total_bytes`` to within rounding."""
        f = total_bytes / self.total_bytes
        return replace(self, total_bytes=int(total_bytes),
                       bits_per_weight=self.bits_per_weight * f,
                       expert_bits_per_weight=(self.expert_bits_per_weight * f
                                               if self.expert_bits_per_weight else None),
                       per_layer_bytes=round(self.per_layer_bytes * f),
                       non_repeating_bytes=round(self.non_repeating_bytes * f),
                       embedding_bytes=round(self.embedding_bytes * f),
                       expert_bytes_per_layer=round(self.expert_bytes_per_layer * f))

    def gpu_bytes(self, gpu_layers: int, *, embedding_on_gpu: bool = False,
                  head_first: bool = False, head: bool | None = None) -> int:
        """Bytes on the GPU with ``gpu_layers`` repeating layers offloaded.

        The output head goes to the GPU with a full offload, and with any partial one
        when ``head_first``: llama.cpp's ``--fit`` fills layers from the back, output
        layer first (docs/reference/engines.md §3.6), while an explicit ``-ngl N`` below the
        layer count and Ollama's layer estimate (§4.2) place it last.  The token embedding stays in
        host memory in llama.cpp and Ollama (its input layer runs on the CPU), and a tied
        head is then llama.cpp's duplicate of it; paged engines keep everything on the
        GPU (``embedding_on_gpu=True``), a tied tensor once for both uses.  ``head``
        overrides the rule: a runner that placed every layer but not the output one
        (Ollama's ``-ngl`` equal to the layer count).
        """
        n = max(0, min(gpu_layers, self.num_layers))
        embed = embedding_on_gpu and n == self.num_layers
        with_head = self.head_on_gpu(n, head_first, head)
        on = with_head and not (self.tied and embed)
        return (n * self.per_layer_bytes + (self.head_bytes if on else 0)
                + (self.embedding_bytes if embed else 0)
                + (self.output_extra_bytes if with_head else 0))

    @property
    def head_bytes(self) -> int:
        """The output head: the non-repeating weights less the token embedding, or a tied
        model's embedding tensor (what a decode step reads as the head either way)."""
        return self.embedding_bytes if self.tied else \
            self.non_repeating_bytes - self.embedding_bytes

    def head_on_gpu(self, gpu_layers: int, head_first: bool = False,
                    head: bool | None = None) -> bool:
        """Is the output head on the GPU with ``gpu_layers`` layers there (see gpu_bytes;
        ``head``: the caller's own answer)?"""
        if head is not None:
            return head
        n = max(0, min(gpu_layers, self.num_layers))
        return n == self.num_layers or (head_first and n > 0)

    def cpu_bytes(self, gpu_layers: int, *, embedding_on_gpu: bool = False,
                  head_first: bool = False, head: bool | None = None) -> int:
        """Bytes in host memory: the layers left there, the token embedding unless it is
        on the GPU, and an untied head left there (a tied one is the embedding itself)."""
        n = max(0, min(gpu_layers, self.num_layers))
        embed = embedding_on_gpu and n == self.num_layers
        host_head = not self.head_on_gpu(n, head_first, head)
        off = not self.tied and host_head
        return ((self.num_layers - n) * self.per_layer_bytes
                + (0 if embed else self.embedding_bytes) + (self.head_bytes if off else 0)
                + (self.output_extra_bytes if host_head else 0))

    def loaded_bytes(self, gpu_layers: int, *, embedding_on_gpu: bool = False,
                     head_first: bool = False, head: bool | None = None) -> int:
        """GPU plus host bytes: ``total_bytes``, plus llama.cpp's GPU copy of a tied head."""
        kw = {"embedding_on_gpu": embedding_on_gpu, "head_first": head_first, "head": head}
        return self.gpu_bytes(gpu_layers, **kw) + self.cpu_bytes(gpu_layers, **kw)


def tied_embeddings(model: ModelSpec) -> bool:
    """Does ``model``'s output head share the token embedding's tensor?  The profile's
    ``tied_embeddings``; unset (a user profile), its notes saying "tied embeddings"."""
    if model.tied_embeddings is not None:
        return model.tied_embeddings
    return "tied embedding" in model.notes.lower()


def check_weights_for(model: ModelSpec, fmt: str, field: str = "weights") -> WeightFormat:
    """The format ``fmt``, refused (named as ``field``) when it cannot hold ``model``: an
    experts-only format on a model without MoE experts."""
    wf = weight_format(fmt, field)
    if wf.experts_only and not model.num_experts:
        raise InputError(field, fmt, f"quantises MoE experts only, and {model.name} "
                         "has none; use a whole-model format (bf16, q8_0, q4_k_m, ...)")
    return wf


def model_weights(model: ModelSpec, fmt: str) -> WeightSplit:
    """Bytes of ``model``'s weights in format ``fmt``: a GGUF file type as llama-quantize
    lays it out (:func:`gguf_weights`); else ``params_total * bpw / 8``, or for an
    experts-only format the routed experts at ``bpw`` and the rest at its other width."""
    wf = check_weights_for(model, fmt)
    if wf.name in FILE_TYPES:
        return gguf_weights(model, wf.name)
    tied = tied_embeddings(model)
    embed_params, non_rep = _edge_params(model, tied)
    per_layer = (model.params_total - non_rep) / model.num_layers
    experts = _layer_expert_params(model, per_layer)
    expert_bytes = wf.bits_per_weight / 8
    other_bytes = (wf.other_bits_per_weight or wf.bits_per_weight) / 8
    edge_bytes = wf.embed_bits / 8                     # token embedding and output head
    quantised = experts if wf.experts_only else 0.0     # params at expert_bytes
    per_layer_b = int(quantised * expert_bytes + (per_layer - quantised) * other_bytes)
    non_rep_b = int(non_rep * edge_bytes)
    return WeightSplit(
        format=wf.name, bits_per_weight=wf.bits_per_weight,
        total_bytes=per_layer_b * model.num_layers + non_rep_b,
        per_layer_bytes=per_layer_b, non_repeating_bytes=non_rep_b,
        embedding_bytes=int(embed_params * edge_bytes), num_layers=model.num_layers,
        expert_bytes_per_layer=int(experts * expert_bytes), tied=tied)


def gguf_weights(model: ModelSpec, ftype: str) -> WeightSplit:
    """``model`` in the GGUF file type ``ftype``, each class of tensor in the type
    llama-quantize gives it (kvsim.model.gguf_mix); ``bits_per_weight`` is the layers'
    average, ``expert_bits_per_weight`` the routed experts'."""
    tied = tied_embeddings(model)
    embed_params, non_rep = _edge_params(model, tied)
    h, n = model.hidden_size, model.num_layers
    layer_params = model.params_total - non_rep
    attn = attention_classes(model, ftype, layer_params)
    experts = _layer_expert_params(model, layer_params / n) * n
    rest = layer_rest_classes(model, ftype, layer_params - sum(c.params for c in attn),
                              experts)
    layers = attn + rest
    layer_bytes = sum(c.bytes for c in layers)
    expert_bytes = sum(c.bytes for c in layers if c.experts)
    head = head_type(ftype, h)
    embed_type = head if tied else stored_type(FILE_TYPES[ftype], h)
    embed_b = int(embed_params * TYPE_BITS[embed_type] / 8)
    non_rep_b = embed_b + int((non_rep - embed_params) * TYPE_BITS[head] / 8)
    per_layer_b = int(layer_bytes / n)
    return WeightSplit(
        format=ftype, bits_per_weight=layer_bytes * 8 / layer_params,
        total_bytes=per_layer_b * n + non_rep_b, per_layer_bytes=per_layer_b,
        non_repeating_bytes=non_rep_b, embedding_bytes=embed_b, num_layers=n,
        expert_bytes_per_layer=int(expert_bytes / n), tied=tied,
        expert_bits_per_weight=expert_bytes * 8 / experts if experts else None)


def _edge_params(model: ModelSpec, tied: bool) -> tuple[float, float]:
    """(token embedding, embedding + untied head) parameters, the two at most half the
    model (a toy profile's vocabulary may say more than it holds)."""
    embed = float(model.vocab_size * model.hidden_size)
    non_rep = min(embed + (0.0 if tied else embed), model.params_total * 0.5)
    return min(embed, non_rep), non_rep


def format_for_file(model: ModelSpec, fmt: str, file_bytes: int) -> str:
    """Of ``fmt`` and the formats that differ from it only in the width of the tensors
    that are not routed experts (``mxfp4``: the rest bf16; ``mxfp4_moe``: q8_0), the one
    whose size of ``model`` is closest to a file of ``file_bytes``.

    NOTE: llama.cpp names a GGUF's type by its experts ("MXFP4 MoE"), and a table that
    copies it says "MXFP4"; the file's printed size tells the rest apart: ggml-org's
    gpt-oss-20b is 11.27 GiB, 11.23 with q8_0 beside the experts, 12.80 with bf16."""
    wf = weight_format(fmt)
    if not wf.experts_only or not model.num_experts:
        return wf.name
    kin = [f.name for f in _FORMATS.values()
           if f.experts_only and f.bits_per_weight == wf.bits_per_weight]
    return min(kin, key=lambda f: (abs(model_weights(model, f).total_bytes - file_bytes),
                                   f != wf.name))


def _layer_expert_params(model: ModelSpec, per_layer: float) -> float:
    """One layer's routed experts: the count-based share, at most what the layer holds
    beyond its attention projections (0 for a dense model)."""
    return max(0.0, min(expert_params(model) / model.num_layers,
                        per_layer - _attention_params(model)))


def _attention_params(model: ModelSpec) -> float:
    """Q, K, V and O projections of one layer (what stays when its experts move)."""
    heads = 2 * model.num_attention_heads + 2 * model.num_kv_heads
    return float(model.hidden_size * model.head_dim * heads)


def expert_params(model: ModelSpec) -> float:
    """All routed experts' parameters of an MoE model (0 for a dense one).

    A token reads the always-active part ``N`` and ``k`` of the ``E`` experts:
    ``total = N + E·e`` and ``active = N + k·e``, so ``E·e = E (total − active) / (E − k)``.
    NOTE: spread evenly over the layers, though some models keep their first layers
    dense (DeepSeek) or route only every second layer (Jamba).
    """
    e, k = model.num_experts, model.num_experts_active
    if not e or not k or k >= e:
        return 0.0
    return e * (model.params_total - model.params_active) / (e - k)
