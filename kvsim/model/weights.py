"""Weight memory: bytes per weight format, and the per-layer split for partial offload.

Bits per weight (bpw) are taken from the format's block layout where it is uniform
and from llama.cpp's published per-model measurements where the format is a mix:

============  =======  ==========================================================
format        bpw      source
============  =======  ==========================================================
bf16 / f16    16       2 bytes per weight
fp8           8        1 byte per weight (per-tensor scales negligible)
q8_0          8.5      ggml block: f16 scale + 32 int8 = 34 B / 32 (docs/reference/engines.md §0)
q6_k          6.5625   ggml block_q6_K: 210 B / 256 values (quantize README: 6.56)
q5_k_m        5.68     llama.cpp tools/quantize README, Llama-2-7B table (mix of
                       q5_K and q6_K tensors)
q4_k_m        4.84     llama.cpp tools/quantize README, Llama-2-7B table; matches
                       docs/reference/hardware-and-models.md §2 "real Q4_K_M files 4.8-4.9 bpw"
q4_0          4.5      ggml block: f16 scale + 16 B nibbles = 18 B / 32
iq4_xs        4.25     ggml block_iq4_xs: 136 B / 256 values
mxfp4         4.25     32 4-bit values + 1 shared 8-bit exponent = 17 B / 32
(mxfp4_moe)            (gpt-oss experts; docs/reference/hardware-and-models.md §2 "~4.25 bpw");
                       experts only, see below
awq / gptq    4.15625  DERIVED: 4-bit + fp16 scale and packed 4-bit zero per
(int4)                 group of 128 = 4 + 16/128 + 4/128 (the decoder layers)
============  =======  ==========================================================

Token embedding and output head (``embed_bits_per_weight``):
docs/reference/hardware-and-models.md §2
"Embeddings and the output layer often stay at higher precision".  AWQ, GPTQ and FP8
checkpoints (AutoAWQ, GPTQ, llm-compressor; vLLM's online ``--quantization fp8``)
quantise the decoder layers' linear projections only: ``embed_tokens`` (an embedding,
not a linear layer) and ``lm_head`` (left out by default) stay bf16, so those two
tensors are sized at 16 bits.  Llama-3.1-8B AWQ: 6,979,326,848 layer parameters at
4.15625 bits + 2 × 525,336,576 at 16 = 5.73 GB, not 8.03e9 × 4.15625 / 8 = 4.17 GB.
GGUF formats size every tensor at the format's bpw: the q*_k_m figures are measured over
whole files, their q6_K output layer included.

Experts-only formats (``other_bits_per_weight`` set) quantise the routed MoE experts
and store every other tensor — attention, router, norms, token embedding, output head —
at another width:

- ``mxfp4``: the released gpt-oss checkpoints.  docs/reference/models.csv (gpt-oss notes) and
  docs/reference/hardware-and-models.md §2: "MXFP4 for MoE experts (~4.25 bpw)"; the rest as
  released, bf16.  gpt-oss-20b 13.74 GB, gpt-oss-120b 65.15 GB (tests/model/test_expert_formats.py;
  the reference: checkpoints "about 13 GB" and "about 61-65 GB").
- ``mxfp4_moe``: llama.cpp's own ``llama-quantize`` type MXFP4_MOE (src/llama-quant.cpp,
  llama.cpp vendored in llama-cpp-python 0.3.36): 3-D expert tensors MXFP4, every other
  tensor, the output layer included, Q8_0 (8.5 bpw).  gpt-oss-20b 12.06 GB, -120b 63.17 GB.

A model without routed experts has nothing such a format quantises: refused (InputError).
Expert parameters come from :func:`expert_params`, capped by the model's geometry: a
layer's experts are at most what is left of it after its Q/K/V/O projections.  The cap
binds for gpt-oss (20b: 823.8 M expert parameters per layer from the counts, 796.0 M left
after attention), whose counts alone would put more in the experts than the layers hold.

Split for partial GPU offload (llama.cpp ``-ngl``, Ollama layer placement): the
model is ``num_layers`` equal repeating layers plus the non-repeating tensors —
token embedding (``vocab * hidden``) and output head (another ``vocab * hidden``).

Tied embeddings (:attr:`ModelSpec.tied_embeddings`; unset, a profile whose notes say
"tied embeddings"): the checkpoint holds one ``vocab * hidden`` tensor, counted once in
``params_total``.  vLLM and SGLang keep that one tensor on the GPU for both uses.
llama.cpp loads it a second time as the output layer (llama-model.cpp: ``output =
create_tensor(tn(LLM_TENSOR_TOKEN_EMBD, ...), TENSOR_DUPLICATED)``, "duplicated to allow
offloading") while the input embedding stays in host memory, so under llama.cpp and
Ollama (whose layouts here are llama.cpp's) a tied head costs its bytes on the GPU like an
untied one (:meth:`WeightSplit.gpu_bytes`).  Either way a decode step reads it whole as
the head (:attr:`WeightSplit.head_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.config.specs import ModelSpec
from kvsim.errors import InputError, unknown_name


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
    WeightFormat("fp8", 8.0, "1 byte per weight; embedding and head bf16",
                 embed_bits_per_weight=16.0),
    WeightFormat("q8_0", 8.5, "ggml block 34 B / 32 values"),
    WeightFormat("q6_k", 6.5625, "ggml block_q6_K 210 B / 256 values"),
    WeightFormat("q5_k_m", 5.68, "llama.cpp tools/quantize README (Llama-2-7B)"),
    WeightFormat("q4_k_m", 4.84, "llama.cpp tools/quantize README (Llama-2-7B)"),
    WeightFormat("q4_0", 4.5, "ggml block 18 B / 32 values"),
    WeightFormat("iq4_xs", 4.25, "ggml block_iq4_xs 136 B / 256 values"),
    WeightFormat("mxfp4", 4.25, "17 B / 32 values on the MoE experts; the rest bf16 (the "
                 "released gpt-oss checkpoints, models.csv notes)", other_bits_per_weight=16.0),
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
            "fp8_e4m3": "fp8"}


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

    def gpu_bytes(self, gpu_layers: int, *, embedding_on_gpu: bool = False,
                  head_first: bool = False) -> int:
        """Bytes on the GPU with ``gpu_layers`` repeating layers offloaded.

        The output head goes to the GPU with a full offload, and with any partial one
        when ``head_first``: llama.cpp's ``--fit`` fills layers from the back, output
        layer first (docs/reference/engines.md §3.6), while an explicit ``-ngl N`` below the
        layer count and Ollama's layer estimate (§4.2) place it last.  The token embedding stays in
        host memory in llama.cpp and Ollama (its input layer runs on the CPU), and a tied
        head is then llama.cpp's duplicate of it; paged engines keep everything on the
        GPU (``embedding_on_gpu=True``), a tied tensor once for both uses.
        """
        n = max(0, min(gpu_layers, self.num_layers))
        embed = embedding_on_gpu and n == self.num_layers
        head = self.head_on_gpu(n, head_first) and not (self.tied and embed)
        return (n * self.per_layer_bytes + (self.head_bytes if head else 0)
                + (self.embedding_bytes if embed else 0))

    @property
    def head_bytes(self) -> int:
        """The output head: the non-repeating weights less the token embedding, or a tied
        model's embedding tensor (what a decode step reads as the head either way)."""
        return self.embedding_bytes if self.tied else \
            self.non_repeating_bytes - self.embedding_bytes

    def head_on_gpu(self, gpu_layers: int, head_first: bool = False) -> bool:
        """Is the output head on the GPU with ``gpu_layers`` layers there (see gpu_bytes)?"""
        n = max(0, min(gpu_layers, self.num_layers))
        return n == self.num_layers or (head_first and n > 0)

    def cpu_bytes(self, gpu_layers: int, *, embedding_on_gpu: bool = False,
                  head_first: bool = False) -> int:
        """Bytes in host memory: the layers left there, the token embedding unless it is
        on the GPU, and an untied head left there (a tied one is the embedding itself)."""
        n = max(0, min(gpu_layers, self.num_layers))
        embed = embedding_on_gpu and n == self.num_layers
        head = not self.tied and not self.head_on_gpu(n, head_first)
        return ((self.num_layers - n) * self.per_layer_bytes
                + (0 if embed else self.embedding_bytes) + (self.head_bytes if head else 0))

    def loaded_bytes(self, gpu_layers: int, *, embedding_on_gpu: bool = False,
                     head_first: bool = False) -> int:
        """GPU plus host bytes: ``total_bytes``, plus llama.cpp's GPU copy of a tied head."""
        kw = {"embedding_on_gpu": embedding_on_gpu, "head_first": head_first}
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
    """Bytes of ``model``'s weights in format ``fmt``: ``params_total * bpw / 8``, or for an
    experts-only format the routed experts at ``bpw`` and the rest at its other width."""
    wf = check_weights_for(model, fmt)
    tied = tied_embeddings(model)
    embed = float(model.vocab_size * model.hidden_size)
    head = 0.0 if tied else embed
    non_rep = min(embed + head, model.params_total * 0.5)
    embed_params = min(embed, non_rep)
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
