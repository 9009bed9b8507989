"""The tensor types llama-quantize writes into a GGUF file of a given file type.

A GGUF "Q4_K_M" is not 4.5 bits everywhere: llama.cpp's quantizer (src/llama-quant.cpp,
``llama_tensor_get_type_impl`` and ``tensor_type_fallback``) gives the output head, some
layers' V projections and FFN down projections more bits, and stores a tensor whose rows
are not a whole number of the type's blocks in a wider type. kvsim has a profile's shapes,
not a tensor list, so it prices classes of tensors (:class:`TensorClass`): the token
embedding, the output head, each attention layer's Q, K, V and O projections, and the rest
of the layers — routed experts and the dense part (FFN, shared experts, recurrent mixers)
— of which a third are down projections (rows as wide as the FFN) and the rest read the
hidden state (rows as wide as ``hidden_size``).

The rules kept (for the file types kvsim names):

- output head, or a tied token embedding: Q6_K; Q8_0 in a Q8_0 file or where the hidden
  width is not a multiple of the base type's block;
- attn_v: Q6_K in the "more bits" layers of Q4_K_M and Q5_K_M (the first and last eighth
  of the layers and every third between); Q5_K in the first four of Q4_K_S; Q5_K in
  IQ4_XS / IQ4_NL when a KV head serves four or more query heads; Q8_0 in a model of
  8 routed experts, as attn_k there;
- ffn_down: Q6_K in the more-bits layers of Q4_K_M and Q5_K_M; Q5_K in the first eighth
  of Q4_K_S; attn_output Q5_K in 4-bit files of an 8-expert model;
- a tensor whose rows are not a whole number of blocks of its type: Q4_K -> Q5_0,
  Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL, then F16 if still not whole.

NOTE: the published files are quantised with an importance matrix, so the IQ4 files'
first-eighth ffn_down bump (without one) is not applied; nor is the Llama-70B attn_v
bump (0.03 % of its bytes). Routed experts a checkpoint ships in MXFP4 (gpt-oss:
``ModelSpec.released_expert_format``) stay MXFP4: llama-quantize refuses to requantize a
quantized tensor without ``--allow-requantize``, and the published k-quant files keep them.
Design: docs/design/memory-layout.md ("GGUF files: llama-quantize's mix").
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.config.specs import ATTENTION_KINDS, ModelSpec

# ggml block layouts: bits per weight and values per block (ggml-common.h)
TYPE_BITS = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q6_k": 6.5625,
             "q5_1": 6.0, "q5_0": 5.5, "q5_k": 5.5, "q4_1": 5.0, "q4_0": 4.5,
             "q4_k": 4.5, "iq4_nl": 4.5, "iq4_xs": 4.25, "mxfp4": 4.25}
_SUPER_BLOCK = frozenset({"q6_k", "q5_k", "q4_k", "iq4_xs"})
_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0", "iq4_xs": "iq4_nl"}

# kvsim's GGUF file types -> llama-quantize's default tensor type for each
FILE_TYPES = {"q8_0": "q8_0", "q6_k": "q6_k", "q5_k_m": "q5_k", "q4_k_m": "q4_k",
              "q4_k_s": "q4_k", "q4_0": "q4_0", "iq4_nl": "iq4_nl", "iq4_xs": "iq4_xs"}
_FOUR_BIT = frozenset({"q4_k_m", "q4_k_s", "iq4_nl", "iq4_xs"})


def block_values(ggml_type: str) -> int:
    """Values in one block of ``ggml_type`` (1 for the float types)."""
    if ggml_type in _SUPER_BLOCK:
        return 256
    return 1 if ggml_type.startswith(("f", "bf")) else 32


def stored_type(ggml_type: str, row_values: int) -> str:
    """The type a tensor of rows of ``row_values`` is written in when ``ggml_type`` is
    asked for: its fallback when a row is not a whole number of its blocks."""
    if row_values % block_values(ggml_type) == 0:
        return ggml_type
    wider = _FALLBACK.get(ggml_type, "f16")
    return wider if row_values % block_values(wider) == 0 else "f16"


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant's "more bits" layers: the first and last eighth, every third between."""
    eighth = n_layers // 8
    return i_layer < eighth or i_layer >= 7 * n_layers // 8 or (i_layer - eighth) % 3 == 2


@dataclass(frozen=True)
class TensorClass:
    """Parameters of one kind of tensor, the width of their rows, and their type."""

    role: str            # token_embd, output, attn_q/k/v/output, ffn_in, ffn_down
    params: float
    row_values: int
    ggml_type: str
    experts: bool = False

    @property
    def bytes(self) -> float:
        return self.params * TYPE_BITS[self.ggml_type] / 8


def _more_bits_or(base: str, n: int) -> list[tuple[float, str]]:
    """Q6_K in the :func:`use_more_bits` layers of ``n``, ``base`` in the rest."""
    more = sum(use_more_bits(i, n) for i in range(n))
    return _shares([(more, "q6_k"), (n - more, base)])


def _shares(types: list[tuple[int, str]]) -> list[tuple[float, str]]:
    """Counts of tensors per type -> fractions."""
    n = sum(c for c, _ in types) or 1
    return [(c / n, t) for c, t in types if c]


def _attn_v_types(ftype: str, base: str, n_v: int, model: ModelSpec) -> list[tuple[float, str]]:
    if model.num_experts == 8:
        return [(1.0, "q8_0")]
    if ftype in ("q4_k_m", "q5_k_m"):
        return _more_bits_or(base, n_v)
    if ftype == "q4_k_s":
        return _shares([(min(4, n_v), "q5_k"), (n_v - min(4, n_v), base)])
    gqa = model.num_attention_heads // max(1, model.num_kv_heads)
    if ftype in ("iq4_nl", "iq4_xs") and gqa >= 4:
        return [(1.0, "q5_k")]
    return [(1.0, base)]


def _ffn_down_types(ftype: str, base: str, n: int) -> list[tuple[float, str]]:
    if ftype in ("q4_k_m", "q5_k_m"):
        return _more_bits_or(base, n)
    if ftype == "q4_k_s":
        return _shares([(n // 8, "q5_k"), (n - n // 8, base)])
    return [(1.0, base)]


def _classes(role: str, params: float, rows: int, types: list[tuple[float, str]],
             experts: bool = False) -> list[TensorClass]:
    return [TensorClass(role, params * f, rows, stored_type(t, rows), experts)
            for f, t in types if params * f > 0]


def head_type(ftype: str, hidden: int) -> str:
    """The output head's (or a tied embedding's) type in a file of ``ftype``."""
    base = FILE_TYPES[ftype]
    if hidden % block_values(base) or base == "q8_0":
        return "q8_0"
    return stored_type("q6_k", hidden)


def attention_classes(model: ModelSpec, ftype: str, cap: float) -> list[TensorClass]:
    """Q, K, V, O of every attention layer (MLA layers counted with the layers' rest),
    scaled down to ``cap`` parameters where the heads say more than the model holds."""
    base, h = FILE_TYPES[ftype], model.hidden_size
    nq = model.num_attention_heads
    groups = [g for g in model.layer_groups if g.kind in ATTENTION_KINDS and g.kind != "mla"]
    n_v = sum(g.layers for g in groups)
    total = sum(g.layers * h * (nq * g.head_dim_k + g.n_kv_heads * (g.head_dim_k + g.head_dim_v)
                                + nq * g.head_dim_v) for g in groups)
    f = min(1.0, cap / total) if total else 0.0
    eight = model.num_experts == 8
    out: list[TensorClass] = []
    for g in groups:
        n = g.layers * f
        kv_k, kv_v = h * g.n_kv_heads * g.head_dim_k, h * g.n_kv_heads * g.head_dim_v
        o_type = "q5_k" if eight and ftype in _FOUR_BIT else base
        out += _classes("attn_q", n * h * nq * g.head_dim_k, h, [(1.0, base)])
        out += _classes("attn_k", n * kv_k, h, [(1.0, "q8_0" if eight else base)])
        out += _classes("attn_v", n * kv_v, h, _attn_v_types(ftype, base, n_v, model))
        out += _classes("attn_output", n * nq * g.head_dim_v * h, nq * g.head_dim_v,
                        [(1.0, o_type)])
    return out


def layer_rest_classes(model: ModelSpec, ftype: str, rest: float, experts: float
                       ) -> list[TensorClass]:
    """The layers' parameters beyond Q/K/V/O: ``experts`` routed-expert ones, the rest
    dense; a third of each are down projections. A recurrent-only model has no FFN."""
    base, h, n = FILE_TYPES[ftype], model.hidden_size, model.num_layers
    down = _ffn_down_types(ftype, base, n)
    ff = model.ffn_intermediate_size or h
    moe_ff = model.moe_intermediate_size or ff
    has_ffn = any(g.kind != "recurrent" for g in model.layer_groups) or bool(experts)
    out: list[TensorClass] = []
    if experts and model.released_expert_format == "mxfp4":
        out.append(TensorClass("ffn_experts", experts, h, "mxfp4", True))
    elif experts:
        out += _classes("ffn_in", experts * 2 / 3, h, [(1.0, base)], True)
        out += _classes("ffn_down", experts / 3, moe_ff, down, True)
    dense = max(0.0, rest - experts)
    if has_ffn:
        out += _classes("ffn_in", dense * 2 / 3, h, [(1.0, base)])
        out += _classes("ffn_down", dense / 3, ff, down)
    else:
        out += _classes("ssm", dense, h, [(1.0, base)])
    return out
