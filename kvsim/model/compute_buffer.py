"""llama.cpp's GPU compute buffer: what its worst-case graph reserve allocates.

docs/reference/engines.md §8 item 7 says only that llama.cpp's compute buffers "grow with
``n_ubatch`` and context".  What grows with context was read from llama.cpp's source (the
copy vendored in llama-cpp-python 0.3.36, which ``scripts/build_llama_server.sh`` builds) and
measured with that build:

- **The attention mask.**  One graph input per KV cache of ``n_kv × n_ubatch`` elements
  (``src/llama-graph.cpp``, ``build_attn_inp_kq_mask``: shape ``[n_kv, n_tokens/n_stream,
  1, n_stream]``), F16 with flash attention, F32 without.  The reserve uses the whole
  cache: ``n_kv`` is the cells of one stream (``src/llama-kv-cache.cpp``, the "full"
  context sets ``n_kv = get_size()``) — ``n_ctx`` with a unified cache, ``n_ctx_seq``
  with one stream per slot.  iSWA models (gpt-oss, Gemma 2/3) have two caches and two
  masks (``build_attn_inp_kv_iswa``): the full cells and the SWA cells.  Recurrent
  layers have no mask.  Graph inputs live in the CPU backend's buffer and a GPU split
  gets a copy of the same type in its own compute buffer (``ggml/src/ggml-backend.cpp``:
  inputs go to the last, CPU, backend; a split's foreign inputs are duplicated on its
  backend), so the GPU buffer grows by the mask.
- **Without flash attention**, the F32 KQ scores of one layer, ``n_head × n_ubatch ×
  n_kv × 4`` bytes (softmax runs in place; the layers reuse the space).

MEASURED (CPU build of that llama-server, kvsim's tiny GGUF: 6 layers, hidden 256,
4 heads, vocab 1024; ``CPU compute buffer size``, one slot)::

    -fa on,  -ub 512: -c 4096 10.51 MiB, 8192 14.51, 16384 22.51, 32768 38.51,
                      65536 70.51, 131072 134.51  -> +1024 B per cell = 512 x 2 (F16)
    -fa on,  -ub 256: -c 4096 5.26, 16384 11.26   -> +512 B per cell = 256 x 2
    -fa off, -ub 512: -c 4096 43.01, 8192 83.01, 16384 163.01, 32768 323.01
                      -> +10240 B per cell = 512 x (4 heads x 4 + 4)
    -np 4 -c 16384: 10.51 MiB one stream per slot (n_ctx_seq 4096), 22.51 unified

On a CUDA card the GPU buffer's growth is the copied mask (source, not measured here).

The context-independent part stays an ESTIMATE, as before: f32 logits of one micro-batch
(``n_ubatch × vocab × 4``) + four f32 hidden-state buffers (``n_ubatch × hidden × 16``).
Every preset lets the user paste the engine's own figure (``compute_buffer_bytes``).
"""

from __future__ import annotations

from kvsim.config.specs import ModelSpec

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
    if flash_attn or all(g.kind == "recurrent" for g in model.layer_groups):
        return 0
    return model.num_attention_heads * n_ubatch * n_kv * F32_BYTES


def llama_cpp_compute_bytes(model: ModelSpec, n_ubatch: int, n_kv: int, flash_attn: bool,
                            swa_cells: int = 0) -> int:
    """llama.cpp's GPU compute buffer (module docstring): ``n_kv`` full-attention cells
    of one stream, ``swa_cells`` SWA cells of one stream (iSWA models)."""
    logits = n_ubatch * model.vocab_size * F32_BYTES           # ESTIMATE
    hidden = n_ubatch * model.hidden_size * 4 * F32_BYTES       # ESTIMATE
    mask = kq_mask_bytes(model, n_ubatch, n_kv, swa_cells, flash_attn)
    return logits + hidden + mask + kq_scores_bytes(model, n_ubatch, n_kv, flash_attn)
