"""What ``parallel`` means, per engine family — one meaning for fit, plan and compare.

**parallel = sessions the engine serves at once, each guaranteed room for its full
context.**  How each engine is made to guarantee it (``docs/reference/engines.md``):

- **llama.cpp** (§3.1): ``--parallel`` slots.  Per-slot streams (an explicit ``-np``
  without ``-kvu``): each slot holds ``-c / parallel`` cells, a hard limit.  Unified
  (``-kvu``, the preset's, a scenario's and ``kvsim fit``'s default): one pool of
  ``-c`` cells that any slot may grow into; the slots together hold ``-c``.
- **Ollama** (§4.1): ``OLLAMA_NUM_PARALLEL`` slots of ``num_ctx`` each.
- **vLLM / SGLang** (§1.1, §2.1): ``--max-num-seqs`` / ``--max-running-requests`` =
  parallel caps the sequences admitted, and the block pool must hold ``parallel``
  requests at ``max_model_len`` (vLLM's "Maximum concurrency for N tokens per
  request: X.XXx" with X ≥ parallel), so no admitted request is preempted for memory.
  ``max_num_seqs`` alone guarantees nothing: the pool may hold fewer full-length
  requests than it admits (they are then preempted and recomputed as they grow).

So the price per session of ``compare --gpus`` counts sessions each of which really
has its context.
"""

from __future__ import annotations

from typing import Any

from kvsim.engines import engine_for
from kvsim.engines.budget import (
    acceptable,
    engine_with,
    largest_where,
    memory_budget,
    share_within,
)
from kvsim.engines.config import PagedEngineConfig, SlotEngineConfig
from kvsim.engines.memory import PLANNING_LIMIT, MemoryBudget

PARALLEL_HELP = (
    "sessions served at once, each guaranteed its full context: llama.cpp --parallel "
    "slots with -c = context x parallel (in the scenario's allocator: the unified -kvu "
    "pool unless engine.allocator: slots), "
    "ollama OLLAMA_NUM_PARALLEL slots of num_ctx, vllm/sglang --max-num-seqs / "
    "--max-running-requests with a KV pool that holds that many max_model_len requests "
    "(vLLM's 'Maximum concurrency' >= parallel); 1-256 on llama.cpp / ollama "
    "(llama.cpp's LLAMA_MAX_SEQ), 1-65536 on vllm / sglang")


def full_length_held(b: MemoryBudget) -> int | None:
    """Paged engines: how many ``max_model_len`` requests the block pool holds at once
    (the floor of vLLM's "Maximum concurrency"; with the hybrid manager, blocks over
    blocks per request) — the test of :func:`kvsim.engines.budget.acceptable`.  None for
    slot engines, whose slots are preallocated whole."""
    if b.num_gpu_blocks is None:
        return None
    if b.blocks_per_request:
        return b.num_gpu_blocks // b.blocks_per_request
    return b.kv_pool_tokens // b.slot_tokens if b.slot_tokens else 0


def short_pool_note(b: MemoryBudget, parallel: int) -> str | None:
    """Why a paged layout does not give ``parallel`` sessions their full context, or
    None when it does (or the engine is not paged)."""
    held = full_length_held(b)
    if held is None or held >= parallel:
        return None
    seqs = engine_for(b.engine).seqs_flag
    conc = "" if b.max_concurrency is None else f" (concurrency {b.max_concurrency:.2f}x)"
    return (f"the KV pool holds {held} of the {parallel} requests at {b.slot_tokens:,} "
            f"tokens{conc}: {b.engine} admits {parallel} ({seqs} {parallel}) but "
            "preempts and recomputes them when they outgrow the pool")


def _at(gpu: Any, model: Any, weights: str, engine: PagedEngineConfig, p: int,
        limit: float, reserves: dict[str, int]) -> float | None:
    """The memory fraction at which ``--max-num-seqs p`` keeps the device under
    ``limit`` with ``p`` full-length requests held; None if none does."""
    cfg = engine.model_copy(update={"max_num_seqs": p})
    util = share_within(gpu, model, weights, cfg, limit, **reserves)
    if util is None:
        return None
    cfg = cfg.model_copy(update={"gpu_memory_utilization": util})
    ok = acceptable(memory_budget(gpu, model, weights, cfg, parallel=p, **reserves), p, limit)
    return util if ok else None


def paged_max_parallel(gpu: Any, model: Any, weights: str, engine: PagedEngineConfig,
                       limit: float = PLANNING_LIMIT, cap: int = 1024,
                       **reserves: int) -> tuple[int, float | None]:
    """vLLM / SGLang: the largest parallel at ``engine.context_tokens`` — with
    ``--max-num-seqs`` set to it, as plan's flags do, and the memory fraction lowered
    to the line — whose pool holds that many full-length requests, and that fraction;
    (0, None) if not even one fits.

    NOTE: monotone in p: more admitted sequences sample more logits in the profiling
    pass (vLLM's pool and SGLang's fraction shrink) and need a larger pool."""
    lo = largest_where(1, min(cap, engine.context_tokens),
                       lambda p: _at(gpu, model, weights, engine, p, limit, reserves) is not None)
    return max(lo, 0), (_at(gpu, model, weights, engine, lo, limit, reserves) if lo > 0 else None)


def session_tokens(b: MemoryBudget) -> int:
    """Slot engines: the context each of ``b.parallel`` sessions is guaranteed — plan's
    *context* (llama.cpp ``-c / parallel``, whichever allocator; Ollama ``num_ctx``)."""
    if engine_for(b.engine).context_scope == "slot":
        return b.slot_tokens
    return max(1, b.kv_pool_tokens // b.parallel)


def _slot_point(engine: SlotEngineConfig, per_session: int, p: int) -> SlotEngineConfig | None:
    """The slot engine serving ``p`` sessions of ``per_session`` tokens, as plan's flags
    set it (:func:`kvsim.plan.flags.engine_overrides`): llama.cpp ``context_tokens`` =
    per_session (so ``-c`` = per_session × p), Ollama ``num_ctx`` = per_session; None
    where the engine refuses it."""
    if engine_for(engine.preset).context_scope == "pool":
        return engine_with(engine, parallel=p, context_tokens=per_session)
    return engine_with(engine, parallel=p)


def slot_max_parallel(gpu: Any, model: Any, weights: str, engine: SlotEngineConfig,
                      per_session: int, limit: float = PLANNING_LIMIT, cap: int = 1024,
                      **reserves: int) -> int:
    """llama.cpp / Ollama: the largest parallel (≤ ``cap``) at which every session keeps
    ``per_session`` tokens (:func:`session_tokens` of the layout given) and the layout
    stays :func:`kvsim.engines.budget.acceptable`; 0 if not even one does.

    NOTE: monotone in p: the pool (``-c`` or ``num_ctx × p`` cells, each slot's share
    padded to the same size) and the compute buffer only grow with it."""
    def ok(p: int) -> bool:
        cfg = _slot_point(engine, per_session, p)
        return cfg is not None and acceptable(
            memory_budget(gpu, model, weights, cfg, **reserves), p, limit)

    return max(0, largest_where(1, cap, ok))


def seqs_flag(engine: str) -> str:
    """vLLM's / SGLang's flag for the sequences admitted at once."""
    return engine_for(engine).seqs_flag


def parallel_words(b: MemoryBudget, given: int | None, max_num_seqs: int | None) -> str:
    """parallel as a run has it: on vLLM/SGLang without one given, the sequences the
    engine admits by default (which guarantees no number of full-length requests)."""
    if b.allocator != "paged" or given is not None:
        return f"parallel {b.parallel}"
    return engine_for(b.engine).unset_parallel_words.format(n=max_num_seqs)


def session_words(b: MemoryBudget, per_session: int) -> str:
    """What a largest-parallel search holds fixed: each session's context."""
    scope = engine_for(b.engine).context_scope
    if scope == "pool":
        return f"context {per_session:,} per session, -c = {per_session:,} x parallel"
    if scope == "slot":
        return f"num_ctx {per_session:,} per session"
    return f"context {per_session}"


def largest_context_words(b: MemoryBudget, max_context: int,
                          most_tokens: int | None = None) -> str:
    """The largest context a search found (``max_context``, the engine's own meaning,
    :func:`kvsim.engines.budget.max_context_at`), per session as plan means it: llama.cpp
    ``-c`` is all ``b.parallel`` slots' total, so a session's share is ``-c / parallel``
    (each slot capped at ``most_tokens``, the model's maximum, said when reached)."""
    eng = engine_for(b.engine)
    pool = eng.context_scope == "pool"
    per = max_context // b.parallel if pool else max_context
    capped = " (the model's maximum)" if most_tokens and per >= most_tokens else ""
    if pool:
        return f"-c {max_context:,} = {per:,} per session x {b.parallel}{capped}"
    return f"{eng.context_knob} {max_context:,} per session{capped}"


def describe_allocator(b: MemoryBudget, max_num_seqs: int | None = None) -> str:
    """One line: the allocator a layout assumed, and what one session may hold."""
    p, slot, pool = b.parallel, b.slot_tokens, b.kv_pool_tokens
    scope = engine_for(b.engine).context_scope
    if scope == "pool" and b.allocator == "unified":
        return (f"allocator: unified (-kvu) — one pool of {pool:,} cells for {p} slots; one "
                f"session may grow to {slot:,}, all together hold {pool:,} (the preset's "
                "and a scenario's default; --no-kv-unified: -c split into per-slot "
                "streams, what llama-server does for an explicit -np without -kvu)")
    if scope == "pool":
        return (f"allocator: slots (per-slot streams) — {p} streams of {slot:,} cells, a "
                f"hard limit per session (llama-server -np {p} without -kvu; in a "
                "scenario: engine.allocator: slots)")
    if scope == "slot":
        return (f"allocator: slots — OLLAMA_NUM_PARALLEL={p} slots of num_ctx {slot:,} "
                f"each (the runner gets {pool:,} cells)")
    seqs = seqs_flag(b.engine)
    return (f"allocator: paged — one block pool of {pool:,} tokens; {b.engine} admits up "
            f"to {max_num_seqs} sequences ({seqs} {max_num_seqs}) and the pool holds "
            f"{full_length_held(b)} at {slot:,} tokens")
