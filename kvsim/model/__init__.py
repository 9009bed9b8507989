"""KV geometry, weight bytes, engine memory budgets and model importers.

``geometry`` (bytes per token per layer group and cache type), ``dtypes`` (exact
bytes per stored element), ``weights`` (bytes per weight format, per-layer split),
``budget`` / ``layouts`` (load-time memory layout per engine), ``compute_buffer``
(llama.cpp compute buffers: fixed part and attention masks), ``importers``
(HF config.json and GGUF header → ModelSpec).
"""
