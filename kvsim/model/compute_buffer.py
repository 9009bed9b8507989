"""llama.cpp's GPU compute buffer: what its worst-case graph reserve allocates.

What grows with context (read from the llama.cpp vendored in llama-cpp-python 0.3.36 and
measured with that build): the attention mask, ``n_kv × n_ubatch`` elements per KV cache (F16
with flash attention, F32 without; two caches and masks for iSWA models, none for recurrent
layers), and, without flash attention, one layer's F32 KQ scores
(``n_head × n_ubatch × n_kv × 4``). ``n_kv`` is the cells of one stream.

NOTE: the context-independent part (f32 logits of one micro-batch + four f32 hidden-state
buffers) is an ESTIMATE; every preset accepts the engine's own ``compute_buffer_bytes``.
Design: docs/design/memory-layout.md (sources and measured figures; after
docs/reference/engines.md §8 item 7).
"""

from __future__ import annotations

from kvsim.config.specs import ATTENTION_KINDS, ModelSpec

F16_MASK_BYTES = 2      # flash attention: the mask is F16
F32_BYTES = 4           # without: the mask and the KQ scores are F32


def kq_mask_bytes(model: ModelSpec, n_ubatch: int, full_cells: int, swa_cells: int,
                  flash_attn: bool) -> int:
    """Bytes of the attention masks: ``n_ubatch`` rows of one stream's cells, one mask
    for the full-attention cache and one for the SWA cache (where the model has each)."""
    kinds = {g.kind for g in model.layer_groups}
    cells = (full_cells if kinds & {"full", "mla"} else 0) \
        + (swa_cells if kinds & {"sliding", "chunked"} else 0)
    return n_ubatch * cells * (F16_MASK_BYTES if flash_attn else F32_BYTES)


def kq_scores_bytes(model: ModelSpec, n_ubatch: int, n_kv: int, flash_attn: bool) -> int:
    """Without flash attention, one layer's F32 ``n_head × n_ubatch × n_kv`` scores."""
    if flash_attn or not any(g.kind in ATTENTION_KINDS for g in model.layer_groups):
        return 0
    return model.num_attention_heads * n_ubatch * n_kv * F32_BYTES


def llama_cpp_logits_bytes(model: ModelSpec, n_ubatch: int) -> int:
    """The f32 logits of one micro-batch: the part of the compute buffer only the GPU
    holding the output layer has (several GPUs, kvsim.engines._slot_box).  ESTIMATE."""
    return n_ubatch * model.vocab_size * F32_BYTES


def llama_cpp_compute_bytes(model: ModelSpec, n_ubatch: int, n_kv: int, flash_attn: bool,
                            swa_cells: int = 0) -> int:
    """llama.cpp's GPU compute buffer (module docstring): ``n_kv`` full-attention cells
    of one stream, ``swa_cells`` SWA cells of one stream (iSWA models)."""
    logits = llama_cpp_logits_bytes(model, n_ubatch)
    hidden = n_ubatch * model.hidden_size * 4 * F32_BYTES       # ESTIMATE
    mask = kq_mask_bytes(model, n_ubatch, n_kv, swa_cells, flash_attn)
    return logits + hidden + mask + kq_scores_bytes(model, n_ubatch, n_kv, flash_attn)
