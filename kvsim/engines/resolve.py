"""Engine presets → validated engine configs: the preset YAML, the scenario's overrides and
the defaults a real engine derives from the GPU, the model and (Ollama) its release.

The per-engine rules are the engine objects' (:class:`kvsim.engines.base.Engine`):
``gpu_defaults`` (vLLM's batch budget, SGLang's memory fraction, each engine's context
when none is set), ``release_defaults`` (Ollama's), ``foreign_knobs``,
``context_above_model`` and ``shifts_mla_context``; this module only applies them.

NOTE: a catalogue preset may carry any file name; its YAML's ``preset`` key names the
engine.  The GPU- and model-derived defaults apply by the name the scenario gives (a
preset file named otherwise gets the YAML's numbers).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from kvsim.config.catalog import list_names, load_raw
from kvsim.config.specs import GpuSpec
from kvsim.engines import find_engine
from kvsim.engines.base import BudgetOf, Engine
from kvsim.engines.budget import memory_budget
from kvsim.engines.config import (
    EngineConfig,
    PagedEngineConfig,
    SlotEngineConfig,
    drop_derived_context,
)
from kvsim.engines.memory import MemoryBudget
from kvsim.errors import InputError, from_validation_error


def engine_for_gpu(spec: str | dict[str, Any], gpu: GpuSpec, model: Any = None,
                   weights: str | None = None, more_gpus: tuple[GpuSpec, ...] = ()
                   ) -> EngineConfig:
    """Resolve an engine preset, filling the defaults real engines derive from the GPU
    for keys the caller did not set (``Engine.gpu_defaults``: vLLM's batch budget on
    ≥ 70 GiB non-A100 cards, docs/reference/engines.md §1.4; SGLang's
    ``mem_fraction_static`` / chunked prefill, §2.1) and Ollama's release defaults
    (``Engine.release_defaults``: num_ctx by VRAM, flash attention by architecture;
    ``weights`` only for the releases whose parallel count was automatic); with ``model``,
    the context the engine takes when none is set (kvsim.engines.config, module NOTE).
    ``gpu`` is device 0 of a box whose other cards are ``more_gpus``
    (``Engine.split_defaults``; Ollama's defaults weigh the whole box)."""
    given = _as_mapping(spec)
    unset = {k for k, v in given.items() if v is None}  # NOTE: null = not set (resolve_engine)
    given = {k: v for k, v in given.items() if k not in unset}
    engine = find_engine(given.get("preset"))
    for card in (gpu, *more_gpus) if engine is not None else ():
        engine.check_device(card)
    split = {} if engine is None else engine.split_defaults(given, 1 + len(more_gpus))
    fill = {} if engine is None else {
        **engine.gpu_defaults(gpu, model, set(given), _ranks({**split, **given})), **split}
    merged = {**{k: None for k in unset - fill.keys()}, **fill, **given}
    if model is not None and engine is not None:
        _model_context_rule(merged, model, engine)
        if not engine.shifts_mla_context and any(g.kind == "mla" for g in model.layer_groups):
            merged["context_shift"] = False  # §4.5: DeepSeek2-family models cannot shift
    return resolve_engine(merged, gpu=gpu, model=model, weights=weights,
                          more_gpus=tuple(more_gpus))


def _ranks(knobs: dict[str, Any]) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes the knobs give (1 where unset or not a count:
    the engine config refuses those)."""
    sizes = [knobs.get(k, 1) for k in ("tensor_parallel_size", "pipeline_parallel_size")]
    tp, pp = (v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1
              for v in sizes)
    return tp, pp


def _model_context_rule(merged: dict[str, Any], model: Any, engine: Engine) -> None:
    """What the engine does with a context above the model's maximum
    (``Engine.context_above_model``): vLLM and SGLang refuse a max_model_len above the
    derived maximum (unless overridden by an environment variable kvsim does not model);
    Ollama clamps num_ctx to the training length (docs/reference/engines.md §4.1);
    llama-server allows -c above it (warning only) — the host-RAM check of the layout
    bounds it (kvsim.engines.budget.check_host_memory)."""
    ctx, most = merged.get("context_tokens"), model.max_context_tokens
    if not isinstance(ctx, int) or isinstance(ctx, bool) or ctx <= most:
        return
    if engine.context_above_model == "refuse":
        raise InputError("engine.context_tokens", ctx, f"at most the model's maximum "
                         f"({most}): {merged['preset']} refuses a max_model_len above the "
                         "model's derived maximum")
    if engine.context_above_model == "clamp":
        merged["context_tokens"] = most


def _as_mapping(spec: Any) -> dict[str, Any]:
    """An engine given by preset name or as a mapping → a fresh mapping (else InputError)."""
    if not isinstance(spec, str | dict):
        raise InputError("engine", spec, "a preset name (one of " + ", ".join(engine_names())
                         + ") or a mapping with a 'preset' key and overrides")
    return {"preset": spec} if isinstance(spec, str) else dict(spec)


def engine_names() -> list[str]:
    """The engine presets of the catalogue (file names under ``hardware_profiles/engines``)."""
    return list_names("engines")


def resolve_engine(spec: str | dict[str, Any], *, gpu: GpuSpec | None = None,
                   model: Any = None, weights: str | None = None,
                   more_gpus: tuple[GpuSpec, ...] = ()
                   ) -> PagedEngineConfig | SlotEngineConfig:
    """Preset defaults (YAML) + overrides → a validated engine config.

    ``spec`` is a preset name or a mapping with a ``preset`` key and overrides (a key
    given beats the preset's; ``context_tokens`` given drops the preset's ``ctx_size``,
    and the reverse); an override of ``None`` (YAML ``null``, ``--set
    engine.context_tokens=null``) keeps the preset's value, or leaves the knob unset when
    the preset has none.  The knobs left
    unset take the engine's release defaults (``Engine.release_defaults``, Ollama's;
    ``gpu``, ``model`` and ``weights`` as far as known: :func:`engine_for_gpu`).
    """
    overrides = _as_mapping(spec)
    name = overrides.get("preset")
    if not isinstance(name, str):
        raise InputError("engine.preset", name, "one of " + ", ".join(engine_names()))
    raw = dict(load_raw("engines", name))
    for meta in ("source", "display_name"):
        raw.pop(meta, None)
    # NOTE: a knob set to null is left as the preset has it (unset: the engine decides);
    # a context given one way (context_tokens per session, llama.cpp's ctx_size = -c)
    # replaces the preset's given the other way (kvsim.engines.config, module NOTE)
    given = {k: v for k, v in overrides.items() if v is not None}
    merged = {**drop_derived_context(raw, set(given)), **given,
              "preset": raw.get("preset", name)}
    engine = find_engine(merged["preset"])
    cls: type[PagedEngineConfig] | type[SlotEngineConfig] = (
        PagedEngineConfig if merged.get("allocator", "paged") == "paged" else SlotEngineConfig)
    if engine is not None and engine.slot_family:
        cls = SlotEngineConfig
    _refuse_unknown_knobs(overrides, cls, merged["preset"], engine)
    if engine is not None:
        merged.update(engine.release_defaults(merged, set(given), gpu, model, weights,
                                              _budget_of(gpu, model, weights, more_gpus),
                                              more_gpus))
    try:
        return cls.model_validate(merged)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix="engine") from None


def _refuse_unknown_knobs(overrides: dict[str, Any],
                          cls: type[PagedEngineConfig] | type[SlotEngineConfig], preset: Any,
                          engine: Engine | None) -> None:
    """An override that is no knob of the preset's family: InputError listing its knobs
    (less those the engine lacks, ``Engine.foreign_knobs``)."""
    unknown = sorted(set(overrides) - set(cls.model_fields))
    if not unknown:
        return
    foreign = {k.knob for k in engine.foreign_knobs} if engine is not None else set()
    knobs = ", ".join(k for k in cls.model_fields
                      if k not in ("preset", "notes") and k not in foreign)
    other = SlotEngineConfig if cls is PagedEngineConfig else PagedEngineConfig
    hint = (f" ({unknown[0]} belongs to the other engines: to switch presets, set the "
            f"engine alone, e.g. engine={preset})"
            if unknown[0] in other.model_fields else "")
    raise InputError(f"engine.{unknown[0]}", overrides[unknown[0]],
                     f"not a knob of the {preset} preset; its knobs: {knobs}{hint}")


def _budget_of(gpu: GpuSpec | None, model: Any, weights: str | None,
               more_gpus: tuple[GpuSpec, ...] = ()) -> BudgetOf:
    """The load-time budget of the engine a knob mapping resolves to, on ``gpu`` (and the
    box's ``more_gpus``) with ``model`` in ``weights`` (what a release's defaults may try,
    e.g. Ollama's automatic parallel count); called only where all three are known."""
    def budget_of(knobs: dict[str, Any]) -> MemoryBudget:
        assert gpu is not None and model is not None and weights is not None
        return memory_budget(gpu, model, weights, resolve_engine(knobs), more_gpus=more_gpus)
    return budget_of
