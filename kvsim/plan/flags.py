"""Plan axes → engine settings, and the exact command line a user should type.

The plan's axes are engine-neutral: **context** = tokens one session may hold,
**parallel** = sessions served at once, plus a KV cache dtype.  Each engine spells
them differently (``docs/reference/engines.md``); its engine object
(:mod:`kvsim.engines`) builds the command line and says which checkpoint it names.

- llama.cpp: ``-c`` is the whole KV pool over all slots (§3.1), so
  ``-c = context × parallel`` (the engine config derives ``ctx_size`` from the
  per-session ``context_tokens``, kvsim.engines.config); an explicit ``--parallel``
  without ``-kvu`` means per-slot streams, so the unified allocator adds ``-kvu``;
  quantized V needs ``-fa on`` (§3.2);
- Ollama: ``OLLAMA_CONTEXT_LENGTH`` is per slot (§4);
- vLLM / SGLang: ``--max-model-len`` / ``--context-length`` per request and
  ``--max-num-seqs`` / ``--max-running-requests`` = parallel; the memory fraction is
  lowered until the whole device total (driver, display and what the engine takes
  outside its share: vLLM's CUDA graphs, SGLang's activations) stays within the plan's
  device-fraction limit, since the share *is* the reservation.  The search then asks
  the pool to hold ``parallel`` full-length requests (:mod:`kvsim.plan.parallel`).
  The model argument follows the weight format (:mod:`kvsim.engines._checkpoint`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvsim.engines import engine_for
from kvsim.engines.budget import box_reserves, share_within
from kvsim.engines.config import (
    PagedEngineConfig,
    SlotEngineConfig,
    drop_derived_context,
    parallel_allowed,
)
from kvsim.errors import InputError
from kvsim.scenario import Scenario, resolve_scenario

_QUANT_V = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def check_contexts(contexts: Iterable[int], model: Any, field: str = "--contexts") -> None:
    """Refuse per-session contexts above the model's maximum, up front, on every engine:
    vLLM/SGLang refuse such a ``max_model_len`` (docs/reference/engines.md §1.1), Ollama clamps
    ``num_ctx`` to the training length (§4.1) and llama-server caps each slot at the
    training context — so such a point would be the model's maximum under a larger
    name (and on llama.cpp ``-c`` cells no session can use)."""
    most = model.max_context_tokens
    over = sorted({int(c) for c in contexts if int(c) > most})
    if over:
        raise InputError(field, over[0] if len(over) == 1 else over,
                         f"per-session contexts at most {model.name}'s maximum, {most} "
                         "tokens (vLLM/SGLang refuse a larger max_model_len, Ollama clamps "
                         "num_ctx to it, llama-server caps each slot at it)")


def check_parallels(parallels: Iterable[int], engine: Any, field: str = "--parallel") -> None:
    """Refuse sessions-at-once above what the engine serves (``Engine.max_parallel``),
    up front, naming the flag rather than the engine knob each point sets."""
    traits = engine_for(engine.preset)
    over = sorted({int(p) for p in parallels if int(p) > traits.max_parallel})
    if over:
        raise InputError(field, over[0] if len(over) == 1 else over,
                         parallel_allowed(traits))


def engine_overrides(engine: Any, context: int, parallel: int, kv: str | None
                     ) -> dict[str, Any]:
    """Engine keys that realise one plan point on this engine: ``context_tokens`` is
    the per-session context on every engine (llama.cpp's ``-c`` follows from it; apply
    them with :func:`with_engine_keys`, which drops the stale one)."""
    if isinstance(engine, SlotEngineConfig):
        # NOTE: a context the plan sets is not --fit's to shrink
        out: dict[str, Any] = {"context_tokens": context, "parallel": parallel,
                               "fit_context": False}
        if kv is not None:
            out.update(cache_type_k=kv, cache_type_v=kv)
            if kv in _QUANT_V:
                out["flash_attn"] = True
        return out
    assert isinstance(engine, PagedEngineConfig)
    # NOTE: the memory fraction is configure's to lower (share_within), whole device
    out = {"context_tokens": context, "max_num_seqs": parallel}
    if kv is not None:
        out.update(cache_type_k=kv, cache_type_v=kv)
    return out


def with_engine_keys(engine: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    """A dumped engine section with ``keys`` set, less the context key they make stale
    (llama.cpp: ``ctx_size`` when ``context_tokens`` or ``parallel`` changes, and the
    reverse; kvsim.engines.config.drop_derived_context)."""
    return {**drop_derived_context(engine, set(keys)), **keys}


def configure(scenario: Scenario, context: int, parallel: int, kv: str | None,
              policies: tuple[dict[str, Any], ...] | None,
              max_device_fraction: float) -> Scenario:
    """The scenario with one plan point applied (validated like any scenario)."""
    doc = scenario.model_dump(mode="json")
    doc["engine"] = with_engine_keys(doc["engine"], engine_overrides(
        scenario.engine, context, parallel, kv))
    if policies is not None:
        doc["policies"] = [dict(p) for p in policies]
    out = resolve_scenario(doc)
    if isinstance(out.engine, PagedEngineConfig):
        util = share_within(out.gpu, out.model, out.weights, out.engine, max_device_fraction,
                            **box_reserves(out))
        if util is not None and util != out.engine.gpu_memory_utilization:
            # NOTE: lowered, in (0, 1): nothing to re-validate
            out = out.model_copy(update={"engine": out.engine.model_copy(
                update={"gpu_memory_utilization": util})})
    return out


def engine_flags(s: Scenario) -> str:
    """The command that starts the real engine with this scenario's settings."""
    return engine_for(s.engine.preset).launch_command(s)


def flag_notes(s: Scenario) -> list[str]:
    """What the printed command cannot say by itself: which checkpoint to serve."""
    return engine_for(s.engine.preset).launch_notes(s)


def point_parallel(s: Scenario) -> int:
    e = s.engine
    return e.parallel if isinstance(e, SlotEngineConfig) else e.max_num_seqs
