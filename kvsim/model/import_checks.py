"""Checks of a model file's sizes before the importers (:mod:`kvsim.model.importers`) use
them: every size a positive integer, every per-layer list one valid entry per layer; and
the figures the importers derive from checked sizes (FFN widths, a parameter estimate).

NOTE: each failure is an InputError naming the key as ``FILE.KEY`` (``config.json
'NAME'.hidden_size``, ``gguf 'NAME'.llama.block_count``), its value and what is allowed.
"""

from __future__ import annotations

from typing import Any

from kvsim.errors import InputError, short_value

HF_SIZES = ("num_hidden_layers", "n_layer", "num_layers", "hidden_size", "d_model", "n_embd",
            "num_attention_heads", "n_head", "num_key_value_heads", "head_dim", "vocab_size",
            "max_position_embeddings", "n_positions", "model_max_length", "intermediate_size",
            "moe_intermediate_size", "sliding_window", "sliding_window_pattern",
            "attn_layer_period", "full_attention_interval", "attention_chunk_size",
            "state_size", "conv_kernel", "expand", "num_heads", "n_groups", "mamba_expand",
            "mamba_d_state", "mamba_d_conv", "linear_num_value_heads", "linear_num_key_heads",
            "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
            "kv_lora_rank", "qk_rope_head_dim", "global_head_dim",
            "num_global_key_value_heads")
"""config.json sizes the importer reads: each must be a positive integer when present.

NOTE: the importer reads ``value or default``, so a 0 would silently become the default,
and a string or fraction would crash or be truncated."""
HF_COUNTS = ("attn_layer_offset", "num_experts", "num_local_experts", "n_routed_experts",
             "shared_expert_intermediate_size")
"""config.json counts the importer reads: each a non-negative integer when present."""


def check_hf_sizes(cfg: dict[str, Any], where: str) -> None:
    """Refuse a config whose sizes (:data:`HF_SIZES`) are not positive integers, or whose
    KV heads do not divide the attention heads, before any of them is used.

    ``cfg`` is the config.json object with its ``text_config`` merged in; ``where``
    names the file in the error (``config.json 'NAME'``).
    """
    for keys, least, what in ((HF_SIZES, 1, "a positive integer"),
                              (HF_COUNTS, 0, "a non-negative integer")):
        for key in keys:
            v = cfg.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
                raise InputError(f"{where}.{key}", v, what)
    _check_hf_lists(cfg, where)
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    kv = cfg.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise InputError(f"{where}.num_key_value_heads", kv, f"a divisor of num_attention_heads "
                         f"({heads}): each KV head serves a whole group of query heads")
    if cfg.get("num_kv_shared_layers"):   # Gemma 4 E2B/E4B: later layers reuse earlier KV
        raise InputError(f"{where}.num_kv_shared_layers", cfg["num_kv_shared_layers"],
                         "0: layers that reuse another layer's KV are not modelled")




def _check_hf_lists(cfg: dict[str, Any], where: str) -> None:
    """``layer_types`` a list of strings, ``no_rope_layers`` one 0/1 per layer."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and not all(isinstance(t, str) for t in types):
        raise InputError(f"{where}.layer_types", short_value(types),
                         "a list of layer type names, one per layer")
    rope = cfg.get("no_rope_layers")
    n = next((cfg[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if cfg.get(k)), 0)
    if rope is not None and cfg.get("attention_chunk_size") and (
            not isinstance(rope, list) or len(rope) < n or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in rope)):
        raise InputError(f"{where}.no_rope_layers", short_value(rope),
                         f"a list of 0/1 integers, one per layer ({n} layers)")


GGUF_SIZES = ("block_count", "embedding_length", "context_length", "vocab_size",
              "attention.key_length", "attention.value_length", "attention.kv_lora_rank",
              "rope.dimension_count", "attention.sliding_window", "ssm.inner_size",
              "ssm.state_size", "ssm.conv_kernel", "ssm.group_count", "ssm.time_step_rank",
              "expert_feed_forward_length")
GGUF_PER_LAYER = ("attention.head_count", "attention.head_count_kv",
                  "attention.sliding_window_pattern", "feed_forward_length")


def check_gguf_sizes(f: dict[str, Any], arch: str, where: str) -> None:
    """Refuse a GGUF header whose sizes are not positive integers, or whose per-layer
    arrays (heads, KV heads, the sliding-window pattern) are not one entry per layer,
    before any of them is used (the error names the key as ``where.KEY``)."""
    def bad(v: Any, least: int) -> bool:
        return isinstance(v, bool) or not isinstance(v, int) or v < least

    for key in GGUF_SIZES:
        v = f.get(f"{arch}.{key}")
        if v is not None and bad(v, 1):
            raise InputError(f"{where}.{arch}.{key}", v, "a positive integer")
    n = f.get(f"{arch}.block_count")
    for key in GGUF_PER_LAYER:
        v = f.get(f"{arch}.{key}")
        flags = key.endswith("pattern")  # NOTE: per-layer booleans, or one period
        if not isinstance(v, list):
            if v is not None and bad(v, 1 if flags else 0):
                raise InputError(f"{where}.{arch}.{key}", v, "a non-negative integer, or "
                                 "one per layer")
            continue
        ok = (lambda x: isinstance(x, bool)) if flags else (lambda x: not bad(x, 0))
        if len(v) != n or not all(ok(x) for x in v):
            kind = "boolean" if flags else "non-negative integer"
            raise InputError(f"{where}.{arch}.{key}", short_value(v),
                             f"one {kind} per layer ({n} layers)")
    heads = f.get(f"{arch}.attention.head_count")
    if isinstance(heads, list) and not any(heads):
        raise InputError(f"{where}.{arch}.attention.head_count", short_value(heads),
                         "at least one layer with attention heads")


def ffn_widths(dense: Any, expert: Any) -> dict[str, int | None]:
    """The profile's FFN widths from a checked config or header: the dense (or shared
    expert's) and one routed expert's; the widest of a per-layer list (0 for a layer
    without one), None where absent."""
    def widest(value: Any) -> int | None:
        widths = [int(v) for v in (value if isinstance(value, list) else [value]) if v]
        return max(widths) if widths else None
    return {"ffn_intermediate_size": widest(dense), "moe_intermediate_size": widest(expert)}


def hf_params(cfg: dict[str, Any], n: int, hidden: int, heads: int, kv: int, hd: int,
              tied: bool | None) -> float:
    """Estimated parameter count of a checked config.json (attention + gated MLP or
    experts + embeddings; a tied head counted once)."""
    attn = hidden * heads * hd * 2 + 2 * hidden * kv * hd
    inter = cfg.get("intermediate_size") or 4 * hidden
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get(
        "n_routed_experts") or 0
    mlp = 3 * hidden * (cfg.get("moe_intermediate_size") or inter) * experts if experts \
        else 3 * hidden * inter
    embed = cfg["vocab_size"] * hidden * (1 if tied else 2)
    return float(n * (attn + mlp) + embed)
