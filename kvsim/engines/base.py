"""The interface every engine preset declares: what generic code may ask an engine.

Generic code (the simulator's build, the API, the policies, the latency model) asks
``engine_for(cfg.preset)`` instead of comparing preset names.

NOTE: an engine object is immutable behaviour, not configuration: the knobs a scenario
sets live in the engine's config model (kvsim.config.engine); methods that depend on a
knob take that config.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol


class Engine(Protocol):
    """One serving engine's behaviour as the simulator models it."""

    name: str
    """The preset name (``engine: {preset: ...}``)."""
    slot_family: bool
    """True: per-slot contexts allocated at load (llama.cpp, Ollama); False: a paged pool."""
    retract_order: str
    """The paged scheduler's victim order on preemption (kvsim.core.scheduler)."""
    truncates_prompt: bool
    """A prompt longer than a slot is truncated (Ollama) instead of refused."""
    caps_slot_at_training_context: bool
    """The server caps each slot at the model's training context (llama-server)."""
    op_offload: bool
    """Host-weight ops of a large ubatch may run on the GPU (kvsim.latency.offload)."""
    host_kv_from_pool_ratio: bool
    """A host KV tier left unsized is a ratio of the device pool (SGLang HiCache), not
    LMCache's fixed default."""
    host_kv_chunked: bool
    """The host KV tier stores whole chunks and no decode KV (vLLM + LMCache)."""
    context_scope: Literal["pool", "slot", "request"]
    """What ``context_tokens`` counts: all slots' cells (llama.cpp ``-c``), one slot's
    (Ollama ``num_ctx``) or one request's (vLLM / SGLang ``max_model_len``)."""
    context_knob: str
    """The engine's own name for ``context_tokens``, as plan prints it."""
    seqs_flag: str
    """A paged engine's flag for the sequences admitted at once ('' on slot engines)."""
    unset_parallel_words: str
    """A paged engine's parallelism when none is given, a template of ``{n}`` = its
    max_num_seqs ('' on slot engines)."""
    settings: frozenset[str]
    """The optional settings this engine has, of ``flash_attn``, ``gpu_layers``,
    ``kv_unified``, ``gpu_util``, ``hybrid_kv``, ``ollama_version`` (kvsim fit refuses
    the others' flags)."""
    one_cache_type_flag: str
    """The one flag that sets the KV cache type of both K and V ('' where K and V have
    their own, llama.cpp ``-ctk``/``-ctv``)."""
    quant_v_needs_flash_attn: bool
    """The server refuses a quantized V cache without flash attention (llama-server),
    rather than silently using f16 (Ollama)."""
    context_above_model: Literal["refuse", "clamp", "allow"]
    """What the engine does with a context above the model's maximum."""
    fit_shrinks_context: bool
    """An unset context is the training context that ``--fit`` shrinks toward what fits
    (llama-server ``-c 0``)."""
    unset_context_words: str
    """What an unset context becomes when no model decides it ('': the model's own
    default does, kvsim.config.engine.engine_for_gpu)."""

    def null_block(self, cfg: Any) -> bool:
        """The paged pool reserves one block that holds no KV (vLLM v1)."""
        ...

    def unified_pool(self, cfg: Any) -> bool:
        """All slots share one pool (llama.cpp ``-kvu``)."""
        ...

    def launch_command(self, s: Any) -> str:
        """The command that starts the real engine with scenario ``s``'s settings (what
        ``kvsim plan`` prints)."""
        ...

    def launch_notes(self, s: Any) -> list[str]:
        """What :meth:`launch_command` cannot say by itself: which model file or
        checkpoint to serve ([] when the command says it all)."""
        ...
