"""Engine configuration: one frozen model per allocator family, presets as YAML.

Real engines lay out KV memory in three ways (docs/design/DESIGN.md §3.2):

- ``paged`` (vLLM, SGLang): one block pool sized by a memory fraction;
- ``slots`` (llama.cpp with ``--no-kv-unified``, Ollama's runners): ``-c`` split
  evenly over ``--parallel`` slots;
- ``unified`` (llama.cpp ``-kvu``): every slot may grow into one shared pool.

A scenario names a preset (``engine: {preset: llama.cpp, parallel: 4}``); the
preset's YAML under ``hardware_profiles/engines/`` supplies every default with its
source in ``docs/reference/engines.md``, and the scenario's keys override them.
``extra="forbid"`` makes a knob that the preset's family does not have an error, and
each engine's ``foreign_knobs`` a paged knob that only the other paged engine has (vLLM's
swap space, ``--kv-cache-memory``, … on SGLang; SGLang's ``--max-total-tokens`` on vLLM).
vLLM, SGLang and Ollama have one KV cache type for K and V (``Engine.one_cache_type_flag``).
Presets resolve to these models in :mod:`kvsim.engines.resolve`.

NOTE: ``context_tokens`` is what one session may hold, on every engine: llama.cpp's
slot share (``-c / parallel``), Ollama ``num_ctx`` (per slot; the runner gets
``num_ctx × parallel``), vLLM/SGLang ``max_model_len`` (per request).  llama.cpp's own
flag is ``ctx_size`` (``-c``, all slots' cells together); on the engine whose context
counts the pool (``Engine.context_scope == "pool"``) the config always holds both:
given one, the other is derived (``context_tokens = ctx_size // parallel``, the share
each slot is guaranteed, with ``-kvu`` too; ``ctx_size = context_tokens × parallel``),
given both they must agree.  The layout reads ``ctx_size`` (:func:`slot_tokens`,
:func:`pool_tokens_hint`), so ``ctx_size`` 10000 with 3 slots is the layout of
``-c 10000`` whatever ``context_tokens`` (3333) says.  Code that edits a config's dump
keeps the key it changes and drops the derived one (:func:`drop_derived_context`).
Unset in a scenario, the context is the model's own default
(:func:`kvsim.engines.resolve.engine_for_gpu`): vLLM and SGLang take the model's maximum,
llama-server ``-c 0`` the training context that ``--fit`` then shrinks toward what fits
(``ctx_size`` = the model's maximum with ``fit_context``); Ollama its release's own ``num_ctx``
(:func:`~kvsim.engines.ollama_releases.ollama_default_num_ctx`: 4096, or by the card's
VRAM from v0.15.5).  The presets' numbers apply only where no model is known.

NOTE: the ``ollama`` preset follows one Ollama release, ``ollama_version`` (default
:data:`~kvsim.engines.ollama_releases.OLLAMA_LATEST`); every default that changed between
releases (docs/reference/engines.md §4) is derived from it for the knobs a scenario leaves
unset (:func:`~kvsim.engines.ollama_releases.ollama_defaults`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from kvsim.config.gpu_set import MAX_GPUS
from kvsim.config.units import Bytes, FrozenModel
from kvsim.engines import engine_for, registered_engines
from kvsim.engines.base import Engine
from kvsim.errors import InputError

MAX_SPLIT_SHARE = 1e30
"""A --tensor-split share: at most 1e30 (llama.cpp reads them as 32-bit floats and sums
them; larger ones overflow)."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class PagedEngineConfig(FrozenModel):
    """vLLM / SGLang: a paged block pool with prefix caching and preemption."""

    model_config = _FROZEN

    preset: Literal["vllm", "sglang"]
    allocator: Literal["paged"] = "paged"
    block_tokens: int = Field(gt=0)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    context_tokens: int = Field(gt=0, description="max_model_len (per request)")
    max_num_seqs: int = Field(gt=0)
    max_num_batched_tokens: int = Field(gt=0, description="token budget per step")
    enable_prefix_caching: bool = True
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    cuda_graph_bytes: Bytes = 0
    non_torch_bytes: Bytes = 0
    activation_bytes: Bytes | None = Field(
        None, description="profiled peak activation; None = estimate from the model")
    kv_cache_memory_bytes: Bytes | None = Field(None, description="--kv-cache-memory override")
    num_gpu_blocks_override: int | None = Field(None, gt=0)
    swap_space_bytes: Bytes = 0
    disable_hybrid_kv_cache_manager: bool | None = Field(
        None, description="vLLM: True holds sliding-window layers at full length (§1.7); "
        "None (auto) turns the hybrid manager off only with a KV connector or swap")
    max_total_tokens: int | None = Field(
        None, gt=0, description="SGLang --max-total-tokens: caps the pool at this many "
        "tokens (§2.1); None = all that mem_fraction_static leaves")
    supported_cache_types: tuple[str, ...] = Field(
        ("f16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"), min_length=1)
    tensor_parallel_size: int = Field(1, ge=1, le=MAX_GPUS, description=(
        "--tensor-parallel-size (vLLM) / --tp (SGLang): GPUs each layer is split over"))
    pipeline_parallel_size: int = Field(1, ge=1, le=MAX_GPUS, description=(
        "--pipeline-parallel-size (vLLM) / --pp (SGLang): stages the layers are split into; "
        "tensor x pipeline = the scenario's GPUs"))
    version: str | None = Field(
        None, description="vLLM: the release whose start-up arithmetic and defaults apply "
        "(kvsim.engines.vllm_releases), e.g. '0.6.4'; None = the newest described")
    language_model_only: bool = Field(
        False, description="vLLM --language-model-only: every item kind's limit 0, so a "
        "vision-language checkpoint's image encoder is neither built nor profiled (§1.11)")
    cuda_graphs_in_budget: bool = Field(
        False, description="vLLM: CUDA-graph memory is estimated while profiling and taken "
        "out of the gpu_memory_utilization share (0.21.0 on), else it comes on top")
    notes: str = ""

    @model_validator(mode="after")
    def _check(self) -> PagedEngineConfig:
        engine = _check_cache(self)
        _check_parallel("max_num_seqs", self.max_num_seqs, engine)
        for knob, unset, instead in engine.foreign_knobs:
            if getattr(self, knob) != unset:
                raise InputError(knob, getattr(self, knob),
                                 f"not a knob of the {self.preset} preset: {instead}")
        engine.check_release(self.version)
        if self.preemption_mode == "swap" and self.disable_hybrid_kv_cache_manager is False:
            raise InputError("disable_hybrid_kv_cache_manager", False, "true or unset: "
                             "preemption_mode swap is vLLM V0, which has no hybrid manager")
        return self


class SlotEngineConfig(FrozenModel):
    """llama.cpp / Ollama: per-slot contexts (or one unified pool) allocated at load."""

    model_config = _FROZEN

    preset: Literal["llama.cpp", "ollama"]
    allocator: Literal["slots", "unified"]
    context_tokens: int = Field(gt=0, description="what one session may hold: llama.cpp "
                                "-c / parallel, ollama num_ctx")
    parallel: int = Field(gt=0, description="--parallel / OLLAMA_NUM_PARALLEL")
    ctx_size: int | None = Field(None, gt=0, description="llama.cpp -c: all slots' cells "
                                 "together (derived from context_tokens x parallel when "
                                 "unset); None on Ollama")
    context_pad_tokens: int = Field(256, gt=0, description="-c is padded to a multiple of this")
    n_batch: int = Field(2048, gt=0)
    n_ubatch: int = Field(512, gt=0)
    flash_attn: bool = True
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    cache_prompt: bool = True
    slot_prompt_similarity: float | None = Field(
        0.10, ge=0, le=1, description="llama-server's threshold (0 = always the LRU slot); "
        "None = the longest common prefix, no threshold (Ollama's runners)")
    cache_ram_bytes: Bytes | None = Field(None, description="--cache-ram; None = unlimited")
    cache_idle_slots: bool = Field(True, description="--cache-idle-slots: after a task starts, "
                                   "idle slots are saved to the RAM cache (and cleared when "
                                   "unified)")
    context_shift: bool = False
    n_keep: int = Field(0, ge=-1)
    n_discard: int = Field(0, ge=0, description="context shift: tokens discarded after n_keep; "
                           "0 = half of them (llama.cpp request default, docs/reference/engines.md "
                           "§3.4)")
    gpu_layers: int | None = Field(None, ge=0, description="-ngl; None = all that fit")
    op_offload: bool = Field(True, description="false = --no-op-offload: a ubatch of "
                             "op_offload_min_batch tokens or more no longer runs the CPU "
                             "layers' matmuls on the GPU (kvsim.latency.offload)")
    op_offload_min_batch: int = Field(32, gt=0, description="GGML_OP_OFFLOAD_MIN_BATCH: the "
                                      "smallest ubatch whose host-weight ops go to the GPU")
    use_mmap: bool = Field(True, description="false = --no-mmap: host weights in pinned "
                           "memory, copied at the link's full rate, not its pageable rate")
    max_queue: int | None = Field(None, gt=0, description="requests that may wait for a "
                                  "slot, then HTTP 503 (Ollama OLLAMA_MAX_QUEUE); None = "
                                  "no limit (llama-server defers without one)")
    fit_context: bool = Field(False, description="-c unset (0 = the training context): "
                              "--fit shrinks it toward what fits, not below 4096, rounded "
                              "to 256 (docs/reference/engines.md §3.1, §3.6)")
    gpu_overhead_bytes: Bytes = 0
    minimum_reserve_bytes: Bytes = 0
    compute_buffer_bytes: Bytes | None = Field(None, description="None = estimate from the model")
    split_mode: Literal["none", "layer", "row"] = Field(
        "layer", description="--split-mode with several GPUs: layer = whole layers per GPU "
        "(the default), row = each matrix split by rows, none = main_gpu only")
    tensor_split: tuple[float, ...] | None = Field(
        None, description="--tensor-split: each GPU's share, in device order (proportions, "
        "normalised); None = by each GPU's free memory, as llama.cpp does")
    main_gpu: int = Field(0, ge=0, lt=MAX_GPUS, description=(
        "--main-gpu: the GPU of split_mode none (current llama.cpp keeps each layer's KV "
        "and results on its own GPU with row too, docs/reference/engines.md §3.8)"))
    supported_cache_types: tuple[str, ...] = Field((
        "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"), min_length=1)
    notes: str = ""

    ignored_cache_type: str | None = Field(
        None, description="Ollama: the OLLAMA_KV_CACHE_TYPE it ignored because flash "
        "attention is off (the cache is then f16, docs/reference/engines.md §4.1)")
    ollama_version: str | None = Field(
        None, description="Ollama: the release whose defaults apply (docs/reference/engines.md §4, "
        "ollama_defaults), e.g. '0.15.5'; None on llama.cpp")

    @model_validator(mode="before")
    @classmethod
    def _ollama_quantizes_only_with_flash_attention(cls, raw: Any) -> Any:
        """Ollama applies its KV cache type only with flash attention, otherwise the cache
        is silently f16 (§4.1, ``Engine.ignores_quant_cache_without_flash_attn``); llama-server
        refuses a quantized V cache instead (below)."""
        if not isinstance(raw, dict) or raw.get("preset") not in registered_engines() \
                or not engine_for(raw["preset"]).ignores_quant_cache_without_flash_attn:
            return raw
        if raw.get("flash_attn", True):  # NOTE: a re-validated dump may carry a stale one
            return {**raw, "ignored_cache_type": None} if raw.get("ignored_cache_type") \
                else raw
        k, v = raw.get("cache_type_k", "f16"), raw.get("cache_type_v", "f16")
        if (k, v) == ("f16", "f16") or k != v:  # NOTE: K != V is refused below
            return raw
        return {**raw, "cache_type_k": "f16", "cache_type_v": "f16", "ignored_cache_type": v}

    @model_validator(mode="before")
    @classmethod
    def _both_contexts(cls, raw: Any) -> Any:
        """llama.cpp: ``context_tokens`` (per session) and ``ctx_size`` (``-c``) from
        whichever is given (module NOTE); both given must agree."""
        if not isinstance(raw, dict) or raw.get("preset") not in registered_engines() \
                or engine_for(raw["preset"]).context_scope != "pool":
            return raw
        return {**raw, **pool_contexts(raw)}

    @model_validator(mode="after")
    def _check(self) -> SlotEngineConfig:
        engine = _check_cache(self)
        for knob, unset, instead in engine.foreign_knobs:
            if getattr(self, knob) != unset:
                raise InputError(knob, getattr(self, knob),
                                 f"not a knob of the {self.preset} preset: {instead}")
        if self.cache_type_v not in ("f16", "bf16", "f32") and not self.flash_attn:
            raise InputError(
                "cache_type_v", self.cache_type_v, "a quantized V cache requires flash "
                "attention: the real server refuses it ('V cache quantization requires "
                "flash_attn'); set flash_attn or use an f16 V cache")
        engine.check_release(self.ollama_version)
        if self.tensor_split is not None and (
                any(not 0 <= x <= MAX_SPLIT_SHARE for x in self.tensor_split)
                or sum(self.tensor_split) <= 0):
            raise InputError("tensor_split", list(self.tensor_split), "one share per GPU, "
                             "each from 0 to 1e30, summing to more than 0 (proportions: "
                             "3,1 = 75 % / 25 %)")
        if self.allocator == "slots" and self.ctx_size is None \
                and self.parallel > self.context_tokens:
            raise InputError("parallel", self.parallel,
                             f"exceeds context_tokens ({self.context_tokens}); must be at most that")
        _check_parallel("parallel", self.parallel, engine)
        return self


CONTEXT_KEYS = ("context_tokens", "ctx_size")  # per session; llama.cpp -c
_INT = TypeAdapter(int)


def _count(raw: dict[str, Any], key: str) -> int | None:
    """``raw[key]`` as the field will read it (``"4096"`` and ``4096.0`` are 4096) when
    that is a positive whole number, else None (the field's own validation names it)."""
    v = raw.get(key)
    if v is None or isinstance(v, bool):
        return None
    try:
        n = _INT.validate_python(v)
    except ValidationError:
        return None
    return n if n > 0 else None


def pool_contexts(raw: dict[str, Any]) -> dict[str, Any]:
    """``context_tokens`` and ``ctx_size`` of a llama.cpp knob mapping, the missing one
    derived from the other and ``parallel`` (module NOTE); {} where they cannot be yet
    (a field's own check then speaks)."""
    ctx, size, par = (_count(raw, k) for k in ("context_tokens", "ctx_size", "parallel"))
    given = [k for k in CONTEXT_KEYS if raw.get(k) is not None]
    if not given:
        return {}
    if par is None or None in (_count(raw, k) for k in given):
        # NOTE: the bad field's own error is the one to report (this never validates)
        return {k: raw[k] if k in given else 1 for k in CONTEXT_KEYS}
    if size is None:
        assert ctx is not None
        return {"ctx_size": ctx * par}
    if size < par:
        raise InputError("parallel", par, f"exceeds ctx_size ({size}); must be at most "
                         "that (-c is split over the slots)")
    if ctx is None:
        return {"context_tokens": size // par}
    if size // par != ctx:
        raise InputError("ctx_size", size, f"context_tokens {ctx} x parallel {par} = "
                         f"{ctx * par} (ctx_size // parallel must equal context_tokens): give "
                         "either context_tokens (per session) or ctx_size (llama-server -c, "
                         "all slots), not both")
    return {}


def stale_context(knobs: dict[str, Any], changed: set[str] | Any) -> str | None:
    """The context key of an engine mapping (a dump, a scenario's engine section) that
    setting the knobs ``changed`` makes stale (module NOTE), or None: a change naming
    ``ctx_size`` drops ``context_tokens``; one naming ``context_tokens`` drops
    ``ctx_size``, and so does one naming ``parallel`` where both are given (the session
    keeps its context, ``-c`` follows)."""
    changed = set(changed)
    if "ctx_size" in changed:
        return "context_tokens"
    both = all(knobs.get(k) is not None for k in CONTEXT_KEYS)
    if "context_tokens" in changed or ("parallel" in changed and both):
        return "ctx_size"
    return None


def drop_derived_context(knobs: dict[str, Any], changed: set[str] | Any) -> dict[str, Any]:
    """``knobs`` less the context key setting ``changed`` makes stale
    (:func:`stale_context`)."""
    stale = stale_context(knobs, changed)
    return {k: v for k, v in knobs.items() if k != stale}


def context_words(engine: Any) -> str:
    """One session's context as users read it: ``context N per session (-c M)`` where the
    engine has a ``-c`` for all slots (llama.cpp's ``ctx_size``), else ``context N``;
    ``engine`` is a config or its dump (a run's scenario.json: before ``ctx_size``
    existed, a llama.cpp ``context_tokens`` was ``-c`` and shows as a plain number)."""
    get = engine.get if isinstance(engine, dict) else lambda k: getattr(engine, k, None)
    size = get("ctx_size")
    return f"context {get('context_tokens')}" + (
        "" if size is None else f" per session (-c {size})")


EngineConfig = Annotated[PagedEngineConfig | SlotEngineConfig, Field(discriminator="preset")]


def parallel_allowed(engine: Engine) -> str:
    """What an error says of sessions-at-once above ``engine.max_parallel``."""
    return f"at most {engine.max_parallel} on {engine.name}: {engine.max_parallel_why}"


def _check_parallel(knob: str, n: int, engine: Engine) -> None:
    if n > engine.max_parallel:
        raise InputError(knob, n, parallel_allowed(engine))


def _check_cache(cfg: PagedEngineConfig | SlotEngineConfig) -> Engine:
    """The checks both config families share: cache types the preset supports, one type
    for K and V where the engine has one flag; returns the engine."""
    engine = engine_for(cfg.preset)
    _check_cache_types(cfg.cache_type_k, cfg.cache_type_v, cfg.supported_cache_types,
                       cfg.preset)
    _check_one_cache_type(cfg.cache_type_k, cfg.cache_type_v, engine)
    return engine


def _check_one_cache_type(k: str, v: str, engine: Engine) -> None:
    flag, ref = engine.one_cache_type_flag, engine.one_cache_type_section
    if flag and k != v:
        raise InputError("cache_type_v", v, f"the same as cache_type_k ('{k}'): {engine.name} "
                         f"has one {flag} for both K and V (docs/reference/engines.md {ref})")


def _check_cache_types(k: str, v: str, supported: tuple[str, ...], preset: str) -> None:
    for which, t in (("cache_type_k", k), ("cache_type_v", v)):
        if t not in supported:
            raise InputError(which, t, f"not supported by {preset}; allowed: "
                             + ", ".join(supported))


def slot_tokens(cfg: SlotEngineConfig) -> int:
    """Tokens one slot may hold (llama.cpp ``n_ctx_seq`` of ``-c`` = ``ctx_size``;
    Ollama ``num_ctx``: an engine whose ``context_tokens`` counts one slot's cells)."""
    pad = cfg.context_pad_tokens
    if cfg.ctx_size is None:
        return cfg.context_tokens
    if cfg.allocator == "unified":
        return -(-cfg.ctx_size // pad) * pad
    per = cfg.ctx_size // cfg.parallel
    return -(-per // pad) * pad


def pool_tokens_hint(cfg: SlotEngineConfig) -> int:
    """KV cells allocated at load (llama.cpp ``n_ctx`` after padding/rounding)."""
    if cfg.allocator == "unified" and cfg.ctx_size is not None:
        return slot_tokens(cfg)
    return slot_tokens(cfg) * cfg.parallel


