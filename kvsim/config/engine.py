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
:data:`FOREIGN_KNOBS` a paged knob that only the other paged engine has (vLLM's swap
space, ``--kv-cache-memory``, … on SGLang; SGLang's ``--max-total-tokens`` on vLLM).
vLLM, SGLang and Ollama have one KV cache type for K and V (:data:`ONE_CACHE_TYPE`).

NOTE: ``context_tokens`` means what the engine's own flag means: llama.cpp ``-c``
(the whole pool, all slots), Ollama ``num_ctx`` (per slot; the runner gets
``num_ctx × parallel``), vLLM/SGLang ``max_model_len`` (per request).  Use
:func:`slot_tokens` and :func:`pool_tokens_hint` rather than re-deriving it.
Unset in a scenario, it is the model's own default (:func:`engine_for_gpu`): vLLM and
SGLang take the model's maximum, llama-server ``-c 0`` the training context that
``--fit`` then shrinks toward what fits (``fit_context``); Ollama its release's own
``num_ctx`` (:func:`~kvsim.config.ollama.ollama_default_num_ctx`: 4096, or by the card's VRAM from v0.15.5).
The presets' numbers apply only where no model is known.

NOTE: the ``ollama`` preset follows one Ollama release, ``ollama_version`` (default
:data:`~kvsim.config.ollama.OLLAMA_LATEST`); every default that changed between releases
(docs/reference/engines.md §4) is derived from it for the knobs a scenario leaves unset
(:func:`~kvsim.config.ollama.ollama_defaults`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from kvsim.config.catalog import list_names, load_raw
from kvsim.config.ollama import OLLAMA_LATEST, ollama_defaults, parse_ollama_version
from kvsim.config.specs import GpuSpec
from kvsim.config.units import Bytes, FrozenModel
from kvsim.errors import InputError, from_validation_error

_FROZEN = ConfigDict(frozen=True, extra="forbid")
EngineName = Literal["vllm", "sglang", "llama.cpp", "ollama"]


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
    supported_cache_types: tuple[str, ...] = ("f16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2")
    notes: str = ""

    @model_validator(mode="after")
    def _check(self) -> PagedEngineConfig:
        _check_cache_types(self.cache_type_k, self.cache_type_v, self.supported_cache_types,
                           self.preset)
        _check_one_cache_type(self.cache_type_k, self.cache_type_v, self.preset)
        for knob, (unset, instead) in FOREIGN_KNOBS[self.preset].items():
            if getattr(self, knob) != unset:
                raise InputError(knob, getattr(self, knob),
                                 f"not a knob of the {self.preset} preset: {instead}")
        if self.preemption_mode == "swap" and self.disable_hybrid_kv_cache_manager is False:
            raise InputError("disable_hybrid_kv_cache_manager", False, "true or unset: "
                             "preemption_mode swap is vLLM V0, which has no hybrid manager")
        return self


class SlotEngineConfig(FrozenModel):
    """llama.cpp / Ollama: per-slot contexts (or one unified pool) allocated at load."""

    model_config = _FROZEN

    preset: Literal["llama.cpp", "ollama"]
    allocator: Literal["slots", "unified"]
    context_tokens: int = Field(gt=0, description="llama.cpp -c (all slots) / ollama num_ctx")
    parallel: int = Field(gt=0, description="--parallel / OLLAMA_NUM_PARALLEL")
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
    supported_cache_types: tuple[str, ...] = (
        "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
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
        is silently f16 (§4.1); llama-server refuses a quantized V cache instead (below)."""
        if not isinstance(raw, dict) or raw.get("preset") != "ollama":
            return raw
        if raw.get("flash_attn", True):  # NOTE: a re-validated dump may carry a stale one
            return {**raw, "ignored_cache_type": None} if raw.get("ignored_cache_type") \
                else raw
        k, v = raw.get("cache_type_k", "f16"), raw.get("cache_type_v", "f16")
        if (k, v) == ("f16", "f16") or k != v:  # NOTE: K != V is refused below
            return raw
        return {**raw, "cache_type_k": "f16", "cache_type_v": "f16", "ignored_cache_type": v}

    @model_validator(mode="after")
    def _check(self) -> SlotEngineConfig:
        _check_cache_types(self.cache_type_k, self.cache_type_v, self.supported_cache_types,
                           self.preset)
        _check_one_cache_type(self.cache_type_k, self.cache_type_v, self.preset)
        if self.cache_type_v not in ("f16", "bf16", "f32") and not self.flash_attn:
            raise InputError(
                "cache_type_v", self.cache_type_v, "a quantized V cache requires flash "
                "attention: the real server refuses it ('V cache quantization requires "
                "flash_attn'); set flash_attn or use an f16 V cache")
        if self.preset == "ollama":
            parse_ollama_version(self.ollama_version, "ollama_version")
        elif self.ollama_version is not None:
            raise InputError("ollama_version", self.ollama_version, "not a knob of the "
                             f"{self.preset} preset (only ollama has a release to follow)")
        if self.allocator == "slots" and self.parallel > self.context_tokens:
            raise InputError("parallel", self.parallel,
                             f"exceeds context_tokens ({self.context_tokens}); must be at most that")
        return self


EngineConfig = Annotated[PagedEngineConfig | SlotEngineConfig, Field(discriminator="preset")]

# The paged knobs one of vLLM / SGLang lacks: knob → (the value that leaves it unused,
# what the engine has instead).  Any other value is refused on that preset.
_SGLANG_CAP = "--max-total-tokens (max_total_tokens, §2.1)"
FOREIGN_KNOBS: dict[str, dict[str, tuple[Any, str]]] = {
    "sglang": {
        "preemption_mode": ("recompute", (
            "SGLang retracts requests and recomputes them (docs/reference/engines.md §2.3); swap "
            "preemption "
            "is vLLM V0's (§1.4)")),
        "swap_space_bytes": (0, (
            "vLLM V0's swap space (docs/reference/engines.md §1.4); SGLang retracts and recomputes "
            "(§2.3), "
            "and keeps KV in host memory only with HiCache (a host_kv_cache policy, §2.4)")),
        "kv_cache_memory_bytes": (None, (
            "vLLM's --kv-cache-memory (docs/reference/engines.md §1.1); SGLang sizes its pool by "
            f"mem_fraction_static (gpu_memory_utilization) and caps it with {_SGLANG_CAP}")),
        "num_gpu_blocks_override": (None, (
            "vLLM's --num-gpu-blocks-override (docs/reference/engines.md §1.1); SGLang caps its "
            "pool with "
            + _SGLANG_CAP)),
        "disable_hybrid_kv_cache_manager": (None, (
            "vLLM's hybrid KV cache manager (docs/reference/engines.md §1.7); SGLang has no such "
            "switch")),
        "non_torch_bytes": (0, (
            "vLLM's profiled non-torch memory inside its budget (docs/reference/engines.md §1.1); "
            "SGLang "
            "keeps what is not weights or KV outside mem_fraction_static (§2.1): "
            "activation_bytes, cuda_graph_bytes")),
    },
    "vllm": {
        "max_total_tokens": (None, (
            "SGLang's --max-total-tokens (docs/reference/engines.md §2.1); vLLM has "
            "num_gpu_blocks_override "
            "(--num-gpu-blocks-override) and kv_cache_memory_bytes (--kv-cache-memory, "
            "§1.1)")),
    },
}

# Engines with one cache type for K and V: the flag that sets it (docs/reference/engines.md §1.5,
# §2.1, §4.1); llama.cpp has -ctk and -ctv (§3.2).
ONE_CACHE_TYPE = {"vllm": ("--kv-cache-dtype", "§1.5"), "sglang": ("--kv-cache-dtype", "§2.1"),
                  "ollama": ("OLLAMA_KV_CACHE_TYPE", "§4.1")}


def _check_one_cache_type(k: str, v: str, preset: str) -> None:
    if preset in ONE_CACHE_TYPE and k != v:
        flag, ref = ONE_CACHE_TYPE[preset]
        raise InputError("cache_type_v", v, f"the same as cache_type_k ('{k}'): {preset} has "
                         f"one {flag} for both K and V (docs/reference/engines.md {ref})")


def _check_cache_types(k: str, v: str, supported: tuple[str, ...], preset: str) -> None:
    for which, t in (("cache_type_k", k), ("cache_type_v", v)):
        if t not in supported:
            raise InputError(which, t, f"not supported by {preset}; allowed: "
                             + ", ".join(supported))


def slot_tokens(cfg: SlotEngineConfig) -> int:
    """Tokens one slot may hold (llama.cpp ``n_ctx_seq``; Ollama ``num_ctx``)."""
    pad = cfg.context_pad_tokens
    if cfg.preset == "ollama":
        return cfg.context_tokens
    if cfg.allocator == "unified":
        return -(-cfg.context_tokens // pad) * pad
    per = cfg.context_tokens // cfg.parallel
    return -(-per // pad) * pad


def pool_tokens_hint(cfg: SlotEngineConfig) -> int:
    """KV cells allocated at load (llama.cpp ``n_ctx`` after padding/rounding)."""
    if cfg.allocator == "unified" and cfg.preset != "ollama":
        return slot_tokens(cfg)
    return slot_tokens(cfg) * cfg.parallel


def sglang_gpu_defaults(gpu_memory_bytes: int) -> tuple[float, int]:
    """SGLang's default ``(mem_fraction_static, chunked_prefill_size)`` for one GPU
    with TP = PP = 1 (docs/reference/engines.md §2.1; 24 GiB → 0.847)."""
    gpu_mib = gpu_memory_bytes / 2**20
    gib = gpu_memory_bytes / 2**30
    tiers = ((20, 2048, 8), (35, 2048, 24), (60, 4096, 32), (90, 8192, 256), (160, 8192, 256))
    chunk, graph_bs = next(((c, b) for lim, c, b in tiers if gib < lim), (16384, 512))
    reserved_mib = 512 + 1.5 * max(chunk, 2048) + 2 * graph_bs + 1024 * 1 * 1 / 8
    if gib > 60:
        reserved_mib = max(reserved_mib, 10 * 1024)
    return round((gpu_mib - reserved_mib) / gpu_mib, 3), chunk


def engine_for_gpu(spec: str | dict[str, Any], gpu: GpuSpec, model: Any = None,
                   weights: str | None = None) -> EngineConfig:
    """Resolve an engine preset, filling the defaults real engines derive from the GPU
    for keys the caller did not set: vLLM's batch budget on ≥ 70 GiB non-A100 cards
    (docs/reference/engines.md §1.4), SGLang's ``mem_fraction_static`` / chunked prefill (§2.1) and
    Ollama's release defaults (:func:`~kvsim.config.ollama.ollama_defaults`: num_ctx by VRAM, flash attention
    by architecture; ``weights`` only for the releases whose parallel count was automatic);
    with ``model``, the context the engine takes when none is set (module NOTE)."""
    given = _as_mapping(spec)
    unset = {k for k, v in given.items() if v is None}  # NOTE: null = not set (resolve_engine)
    given = {k: v for k, v in given.items() if k not in unset}
    preset = given.get("preset")
    fill: dict[str, Any] = {}
    if preset == "vllm" and gpu.memory_bytes >= 70 * 2**30 and "a100" not in gpu.name:
        fill = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
    elif preset == "sglang":
        frac, chunk = sglang_gpu_defaults(gpu.memory_bytes)
        fill = {"gpu_memory_utilization": frac, "max_num_batched_tokens": chunk}
    if model is not None and "context_tokens" not in given:
        if preset in ("vllm", "sglang"):  # §1.1: max_model_len = the model's maximum
            fill["context_tokens"] = model.max_context_tokens
        elif preset == "llama.cpp":  # §3.1: -c 0 = the training context; §3.6: --fit
            fill.update(context_tokens=model.max_context_tokens, fit_context=True)
    merged = {**{k: None for k in unset - fill.keys()}, **fill, **given}
    if model is not None:
        _model_context_rule(merged, model)
    if preset == "ollama" and model is not None and any(
            g.kind == "mla" for g in model.layer_groups):
        merged["context_shift"] = False  # §4.5: DeepSeek2-family models cannot shift
    return resolve_engine(merged, gpu=gpu, model=model, weights=weights)


def _model_context_rule(merged: dict[str, Any], model: Any) -> None:
    """What each engine does with a context above the model's maximum: vLLM and SGLang
    refuse a max_model_len above the derived maximum (unless overridden by an environment
    variable kvsim does not model); Ollama clamps num_ctx to the training length
    (docs/reference/engines.md §4.1); llama-server allows -c above it (warning only) — the host-RAM
    check of the layout bounds it (kvsim.model.budget.check_host_memory)."""
    ctx, most = merged.get("context_tokens"), model.max_context_tokens
    if not isinstance(ctx, int) or isinstance(ctx, bool) or ctx <= most:
        return
    if merged.get("preset") in ("vllm", "sglang"):
        raise InputError("engine.context_tokens", ctx, f"at most the model's maximum "
                         f"({most}): {merged['preset']} refuses a max_model_len above the "
                         "model's derived maximum")
    if merged.get("preset") == "ollama":
        merged["context_tokens"] = most


def _as_mapping(spec: Any) -> dict[str, Any]:
    """An engine given by preset name or as a mapping → a fresh mapping (else InputError)."""
    if not isinstance(spec, str | dict):
        raise InputError("engine", spec, "a preset name (one of " + ", ".join(engine_names())
                         + ") or a mapping with a 'preset' key and overrides")
    return {"preset": spec} if isinstance(spec, str) else dict(spec)


def engine_names() -> list[str]:
    return list_names("engines")


def resolve_engine(spec: str | dict[str, Any], *, gpu: GpuSpec | None = None,
                   model: Any = None, weights: str | None = None
                   ) -> PagedEngineConfig | SlotEngineConfig:
    """Preset defaults (YAML) + overrides → a validated engine config.

    ``spec`` is a preset name or a mapping with a ``preset`` key and overrides; an
    override of ``None`` (YAML ``null``, ``--set engine.context_tokens=null``) keeps the
    preset's value, or leaves the knob unset when the preset has none.  On Ollama the
    knobs left unset take the release's defaults (:func:`~kvsim.config.ollama.ollama_defaults`; ``gpu``,
    ``model`` and ``weights`` as far as known: :func:`engine_for_gpu`).
    """
    overrides = _as_mapping(spec)
    name = overrides.get("preset")
    if not isinstance(name, str):
        raise InputError("engine.preset", name, "one of " + ", ".join(engine_names()))
    raw = dict(load_raw("engines", name))
    for meta in ("source", "display_name"):
        raw.pop(meta, None)
    # NOTE: a knob set to null is left as the preset has it (unset: the engine decides)
    given = {k: v for k, v in overrides.items() if v is not None}
    merged = {**raw, **given, "preset": raw.get("preset", name)}
    cls = PagedEngineConfig if merged.get("allocator", "paged") == "paged" else SlotEngineConfig
    if merged["preset"] in ("llama.cpp", "ollama"):
        cls = SlotEngineConfig
    unknown = sorted(set(overrides) - set(cls.model_fields))
    if unknown:
        foreign = FOREIGN_KNOBS.get(merged["preset"], {})
        knobs = ", ".join(k for k in cls.model_fields
                          if k not in ("preset", "notes") and k not in foreign)
        other = SlotEngineConfig if cls is PagedEngineConfig else PagedEngineConfig
        hint = (f" ({unknown[0]} belongs to the other engines: to switch presets, set the "
                f"engine alone, e.g. engine={merged['preset']})"
                if unknown[0] in other.model_fields else "")
        raise InputError(f"engine.{unknown[0]}", overrides[unknown[0]],
                         f"not a knob of the {merged['preset']} preset; its knobs: {knobs}"
                         f"{hint}")
    if merged["preset"] == "ollama":
        if merged.get("ollama_version") is None:  # NOTE: a user's preset file may lack it
            merged["ollama_version"] = OLLAMA_LATEST
        merged.update(ollama_defaults(merged, set(given), gpu, model, weights))
    try:
        return cls.model_validate(merged)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix="engine") from None
