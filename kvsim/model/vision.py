"""The vision encoder of a vision-language checkpoint: its parameters, its bytes, and
the ``vision_config`` of an HF ``config.json`` it is read from.

vLLM and SGLang load a vision-language checkpoint whole, encoder included, beside the
language model; llama.cpp and Ollama run the language model from a GGUF that leaves the
encoder to a separate ``mmproj`` file.  Quantized checkpoints keep the encoder in 16-bit
(the MLX 4-bit Qwen3.6 config lists each ``model.visual`` tensor as not quantized,
code-index file id 54697833809), so kvsim counts it at 16 bits in every weight format.

The count follows the three layouts named in :class:`kvsim.config.specs.VisionEncoder`;
it gives 416.9 M for Gemma 3's SigLIP encoder (the Gemma 3 technical report, table 1:
417 M), 676.6 M for Qwen2.5-VL's (the Qwen2.5-VL technical report, table 1: 675 M) and
460,730,096 for Qwen3.6-27B's (its checkpoint's tensor list: the same), pinned in
tests/model/test_vision.py.
"""

from __future__ import annotations

from typing import Any

from kvsim.config.specs import ModelSpec, VisionEncoder

VISION_BYTES_PER_PARAM = 2
"""The encoder's 16-bit weights, whatever the language model's format (module doc)."""
QWEN_VL_MAX_IMAGE_TOKENS = 16384
"""The largest image of the Qwen-VL processors, in language-model tokens: Qwen2.5-VL's
``max_pixels`` 12,845,056 over (14 px x 2)², Qwen3-VL's and Qwen3.5's ``size.longest_edge``
16,777,216 over (16 px x 2)² (their ``preprocessor_config.json``, e.g. Qwen/Qwen3.5-2B-Base
and Qwen/Qwen3.6-35B-A3B-FP8 as quoted in public code, code-index file ids 54877551029 and
66291497997).  ``config.json`` does not carry it."""


def vision_params(v: VisionEncoder) -> int:
    """Parameters of the encoder and its projector (biases and norms included)."""
    h, i = v.hidden_size, v.intermediate_size
    norm = 2 * h if v.norm_bias else h
    attn = 4 * h * h + 4 * h                                     # Q, K, V, O with biases
    mlp = (3 * h * i + 2 * i + h) if v.gated_mlp else (2 * h * i + i + h)
    blocks = v.depth * (2 * norm + attn + mlp)
    patch = v.in_channels * v.temporal_patch_size * v.patch_size ** 2 * h \
        + (h if v.patch_bias else 0)
    positions = v.position_embeddings * h
    post = norm if v.post_norm else 0
    if v.spatial_merge_size > 1:   # norm, then merge x merge patches through a 2-layer MLP
        m = h * v.spatial_merge_size ** 2
        projector = norm + m * m + m + m * v.out_hidden_size + v.out_hidden_size
    else:                          # RMSNorm, then one linear map without bias
        projector = h + h * v.out_hidden_size
    return blocks + patch + positions + post + projector


def patches_per_image(v: VisionEncoder) -> int:
    """Patches the encoder runs for the processor's largest image: ``merge²`` per
    language-model token with a merger (Qwen-VL), else the fixed image's positions
    (SigLIP: 896 px / 14 px = 4,096 patches, pooled to 256 tokens)."""
    if v.spatial_merge_size > 1:
        return v.max_image_tokens * v.spatial_merge_size ** 2
    return v.position_embeddings


def vision_bytes(model: ModelSpec) -> int:
    """Bytes a paged engine loads for ``model``'s vision encoder (0 for a text model)."""
    v = model.vision_encoder
    return 0 if v is None else vision_params(v) * VISION_BYTES_PER_PARAM


def _qwen_vl(vc: dict[str, Any], qwen25: bool) -> dict[str, Any]:
    """Qwen2.5-VL (RMSNorm, gated MLP, rotary positions) or Qwen3-VL / Qwen3.5
    (LayerNorm, learned positions) blocks; both merge 2 x 2 patches."""
    return {"depth": int(vc["depth"]), "patch_size": int(vc["patch_size"]),
            "temporal_patch_size": int(vc.get("temporal_patch_size", 2)),
            "in_channels": int(vc.get("in_channels", vc.get("in_chans", 3))),
            "position_embeddings": 0 if qwen25 else int(vc.get("num_position_embeddings", 0)),
            "gated_mlp": qwen25, "norm_bias": not qwen25, "patch_bias": not qwen25,
            "spatial_merge_size": int(vc.get("spatial_merge_size", 2)),
            "out_hidden_size": int(vc["out_hidden_size"]),
            "max_image_tokens": QWEN_VL_MAX_IMAGE_TOKENS, "video_largest": qwen25}


def vision_from_hf(raw: dict[str, Any]) -> VisionEncoder | None:
    """The encoder of an HF ``config.json``'s ``vision_config`` in a layout kvsim counts
    (SigLIP, Qwen2.5-VL, Qwen3-VL / Qwen3.5); None without one, or in another layout
    (DeepStack mergers, Llama 4, Pixtral: not sized)."""
    vc = raw.get("vision_config")
    if not isinstance(vc, dict) or vc.get("deepstack_visual_indexes"):
        return None
    mtype, top = str(vc.get("model_type", "")), str(raw.get("model_type", ""))
    try:
        h, i = int(vc["hidden_size"]), int(vc["intermediate_size"])
        if mtype == "siglip_vision_model":
            side = int(vc["image_size"]) // int(vc["patch_size"])
            text = raw.get("text_config") or {}
            shape = {"depth": int(vc["num_hidden_layers"]), "patch_size": int(vc["patch_size"]),
                     "position_embeddings": side * side, "post_norm": True,
                     "out_hidden_size": int(text.get("hidden_size") or raw["hidden_size"]),
                     "max_image_tokens": int(raw.get("mm_tokens_per_image") or 0)}
        elif top.startswith(("qwen2_5_vl", "qwen3_vl", "qwen3_5")):
            shape = _qwen_vl(vc, top.startswith("qwen2_5_vl"))
        else:
            return None
    except (KeyError, TypeError, ValueError):
        return None
    return VisionEncoder(hidden_size=h, intermediate_size=i, **shape)
