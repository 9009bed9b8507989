"""Validate a scenario's policies against its engine and install the runtime.

Bad input, one line each (InputError → CLI exit 2): a window or budget that does
not fit the slot's context; a demotion cache type the engine preset does not
support (or a quantized engine cache underneath KIVI / recoverable eviction); more
than one eviction-family policy; offload without host memory (no link, a unified
memory host, or a zero host budget); a kind that does not apply to the engine
family (windows, KIVI and idle offload act on llama.cpp / Ollama slots; the host KV
tier on vLLM / SGLang paged pools).

:func:`wire_policies` checks all of it before the scheduler exists and returns what
kvsim.core.build.make_scheduler builds it with: the factory of its policy (the runtime,
kvsim.policies.runtime), a paged scheduler's host tier, a slot scheduler's RAM limit.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from kvsim.core.build import PolicyWiring, PoolSizing, make_link, paged_shape
from kvsim.core.kv.host_pool import HostTier
from kvsim.core.scheduler import PagedScheduler
from kvsim.core.slot_scheduler import SlotScheduler
from kvsim.engines import engine_for
from kvsim.engines.config import SlotEngineConfig
from kvsim.errors import InputError
from kvsim.latency.base import BatchShape, LatencyModel
from kvsim.latency.config import RooflineConfig
from kvsim.model.dtypes import bytes_per_element
from kvsim.policies import EVICTION_KINDS, PAGED_KINDS, REGISTRY, SLOT_KINDS
from kvsim.policies.quantization import nominal_bits
from kvsim.policies.registry import family_engines
from kvsim.policies.runtime import PolicyRuntime

HOST_KV_FRACTION = 0.5  # ASSUMPTION: half of host RAM may hold KV copies (OS + apps the rest)
LMCACHE_CPU_BYTES = 5 * 10**9  # docs/reference/engines.md §5: LMCache max_local_cpu_size default
# 5.0 GB
LMCACHE_CHUNK_TOKENS = 256     # docs/reference/engines.md §5: chunk_size default 256


def _bytes_per_token(sched: PagedScheduler | SlotScheduler) -> int:
    if isinstance(sched, SlotScheduler):
        return int(sched.bytes_per_token)
    return int(sched.block_bytes // sched.block_tokens)


def _check_eviction(i: int, pol: Any, engine: Any, cap: int) -> tuple[Fraction, float]:
    field = f"policies.{i}"
    recent = pol.keep_recent()
    size = pol.size_tokens()  # NOTE: equal to keep_recent() but for score_eviction's budget
    if recent + pol.sink_tokens >= cap or size >= cap:
        raise InputError(f"{field}.{pol.size_field}", size, f"a window (+ {pol.sink_tokens} "
                         f"sinks) smaller than the slot context ({cap} tokens)")
    if not pol.demotes:
        return Fraction(1), 16.0
    base = engine.cache_type_k.lower()
    if base not in ("f16", "bf16") or engine.cache_type_v.lower() not in ("f16", "bf16"):
        raise InputError(f"{field}.kind", pol.kind, "demotes f16/bf16 KV; the engine cache is "
                         f"{engine.cache_type_k}/{engine.cache_type_v}")
    ct = pol.cache_type
    if pol.host_backed:
        bits = nominal_bits(ct)
        if ct not in engine.supported_cache_types or bits >= 16:
            allowed = [t for t in engine.supported_cache_types if nominal_bits(t) < 16]
            raise InputError(f"{field}.cache_type", ct, f"a quantized type {engine.preset} "
                             f"supports: {', '.join(allowed)}")
        # docs/reference/engines.md §3.2; paged engines have no such switch
        if isinstance(engine, SlotEngineConfig) and not engine.flash_attn:
            raise InputError(f"{field}.cache_type", ct, "none with engine.flash_attn false: "
                             "the demoted tokens are a quantized V cache, which llama.cpp "
                             "refuses without flash attention; set engine.flash_attn true")
    return pol.bytes_per_element() / bytes_per_element(base), nominal_bits(ct)


def _check_family(pols: list, engine: Any, slot_engine: bool) -> None:
    for i, p in enumerate(pols):
        if slot_engine and p.family != "slot":
            raise InputError(f"policies.{i}.kind", p.kind, f"on {engine.preset} (slot "
                             f"engines) one of {', '.join(SLOT_KINDS)}; {p.kind} is the "
                             f"{family_engines(p.family)} host tier (use idle_offload / "
                             "cache_ram)")
        if not slot_engine and p.family != "paged":
            raise InputError(f"policies.{i}.kind", p.kind, f"on {engine.preset} (paged) one "
                             f"of {', '.join(PAGED_KINDS)}; {p.kind} is modelled for the "
                             f"{family_engines(p.family)} slot engines")
    seen = [p.kind for p in pols]
    for kind in (k for k, c in REGISTRY.items() if c.singleton):
        if seen.count(kind) > 1:
            raise InputError(f"policies.{len(seen) - 1 - seen[::-1].index(kind)}.kind", kind,
                             f"one {kind} per scenario")


def _host_tier(i: int, pol: Any, scenario: Any, sizing: PoolSizing,
               latency: LatencyModel) -> HostTier:
    """A paged scheduler's host KV tier (vLLM offloading / LMCache / HiCache)."""
    host, engine = scenario.host, scenario.engine
    if any(kind != "full" for kind, _ in sizing.kv_groups):
        # NOTE: a scenario turns the hybrid manager off (kvsim.scenario); a
        # hand-made pool sizing may not
        raise InputError(f"policies.{i}.kind", pol.kind,
                         "no hybrid KV cache groups: vLLM turns its hybrid manager off "
                         "with a KV connector (engine.disable_hybrid_kv_cache_manager)")
    if make_link(scenario.link, host) is None:
        raise InputError(f"policies.{i}.kind", pol.kind, f"a host KV tier needs host memory "
                         f"over PCIe; {host.name} shares memory with the GPU (no host tier)")
    blocks, block_bytes = paged_shape(sizing)
    traits = engine_for(engine.preset)
    budget = pol.host_budget_bytes
    if budget is None:
        budget = int(pol.hicache_ratio * blocks * block_bytes) \
            if traits.host_kv_from_pool_ratio else LMCACHE_CPU_BYTES
    if budget < block_bytes or budget > host.memory_bytes:
        raise InputError(f"policies.{i}.host_budget_bytes", budget, f"between one block "
                         f"({block_bytes} bytes) and the host's memory "
                         f"({host.memory_bytes} bytes)")
    chunked = traits.host_kv_chunked and pol.backend == "lmcache"
    return HostTier(
        budget // block_bytes, load=pol.load,
        chunk_blocks=max(LMCACHE_CHUNK_TOKENS // sizing.block_tokens, 1) if chunked else 1,
        store_decode=not chunked,
        recompute_s=lambda n, ctx: latency.step_time_s(BatchShape((n,), (ctx,), ())))


def _idle_offload_budget(i: int, offload: Any, engine: Any, host: Any) -> int:
    """Host bytes idle offload may hold: its own budget, else the engine's RAM cache,
    else :data:`HOST_KV_FRACTION` of host RAM; capped by the host's memory."""
    budget = offload.host_budget_bytes
    if budget is None:
        budget = engine.cache_ram_bytes if engine.cache_ram_bytes is not None \
            else int(host.memory_bytes * HOST_KV_FRACTION)
    if budget <= 0:
        if offload.host_budget_bytes is not None:
            raise InputError(f"policies.{i}.host_budget_bytes", budget,
                             "> 0 bytes for idle offload to host RAM (mode: drop frees "
                             "idle slots without a copy)")
        raise InputError("engine.cache_ram_bytes", budget, "> 0 for idle_offload's "
                         "default host budget (0 is --cache-ram 0, no RAM cache); or "
                         f"set policies.{i}.host_budget_bytes")
    return int(min(budget, host.memory_bytes))


def wire_policies(scenario: Any, sizing: PoolSizing, latency: LatencyModel
                  ) -> PolicyWiring:
    """Check the scenario's policies against its engine and pool, and return what the
    scheduler is built with (kvsim.core.build.make_scheduler); the scheduler's policy is
    then the :class:`PolicyRuntime` (KV policies + the accuracy proxy).

    NOTE: :func:`_check_family` keeps eviction and idle offload to slot engines and the
    host tier to paged ones."""
    pols = list(scenario.policies)
    engine, host = scenario.engine, scenario.host
    slot = isinstance(engine, SlotEngineConfig)
    _check_family(pols, engine, slot)
    evicts = [(i, p) for i, p in enumerate(pols) if p.evicts]
    if len(evicts) > 1:
        raise InputError(f"policies.{evicts[1][0]}.kind", evicts[1][1].kind,
                         f"one of {', '.join(EVICTION_KINDS)} per scenario")
    tiers = [_host_tier(i, p, scenario, sizing, latency)
             for i, p in enumerate(pols) if p.host_tier and not slot]
    link = make_link(scenario.link, host)
    if any(p.needs_host() for p in pols) and link is None:
        raise InputError("policies", [p.kind for p in pols], f"offload needs host memory over "
                         f"PCIe; {host.name} shares memory with the GPU (no host tier)")
    ratio, bits = Fraction(1), 16.0
    evict = evicts[0][1] if evicts else None
    if evict is not None and slot:
        ratio, bits = _check_eviction(evicts[0][0], evict, engine, sizing.slot_tokens)
    offloads = [(i, p) for i, p in enumerate(pols) if p.offloads_idle]
    offload = offloads[0][1] if offloads else None
    ram_limit = _idle_offload_budget(offloads[0][0], offload, engine, host) \
        if offload is not None and offload.mode == "offload" and slot else None
    gpu_bw = latency.gpu_bytes_per_s  # roofline: sustained GPU bandwidth
    # NOTE: demoted tokens pay the roofline's dequant factor; other models price none
    factor = scenario.latency.kv_dequant_factor \
        if isinstance(scenario.latency, RooflineConfig) else 0.0

    def runtime(sched: PagedScheduler | SlotScheduler) -> PolicyRuntime:
        return PolicyRuntime(
            sched, link=sched.link if isinstance(sched, PagedScheduler) else link,
            accuracy=scenario.accuracy, evict=evict, offload=offload,
            bytes_per_token=_bytes_per_token(sched),
            engine_bits=nominal_bits(engine.cache_type_k, engine.cache_type_v),
            quant_ratio=ratio, demote_bits=bits,
            dequant_s_per_byte=factor / gpu_bw if gpu_bw and ratio != 1 else 0.0,
            recompute_s=lambda n: latency.step_time_s(BatchShape((n,), (0,), ())),
            host_backup_bytes=int(host.memory_bytes * HOST_KV_FRACTION),
            # roofline: demoted tokens are read at their quantized bytes (a per-byte model)
            read_token_bytes=latency.kv_read_token_bytes if ratio != 1 else 0)

    return PolicyWiring(factory=runtime, host_tier=tiers[-1] if tiers else None,
                        ram_limit_bytes=ram_limit)
