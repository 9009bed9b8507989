"""KV geometry, weight bytes, compute buffers and model importers (no engine knowledge).

``geometry`` (bytes per token per layer group and cache type), ``dtypes`` (exact
bytes per stored element), ``weights`` (bytes per weight format, per-layer split),
``hybrid`` (vLLM's KV cache groups for sliding-window models), ``compute_buffer``
(llama.cpp compute buffers: fixed part and attention masks), ``importers``
(HF config.json and GGUF header → ModelSpec).  The load-time memory layout per engine is
:mod:`kvsim.engines.budget`'s.
"""
