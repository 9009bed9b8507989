"""From a resolved scenario and its memory budget to a configured scheduler.

:class:`PoolSizing` is the small value type the pools are sized from — taken from
:class:`kvsim.engines.memory.MemoryBudget` in normal runs, written by hand in tests.

NOTE: bytes per KV cell (slots) and per block (paged) are ``kv_reserved_bytes``
divided by the number of cells/blocks (floored), so allocated bytes can never exceed
reserved bytes, and windowed / recurrent layers are spread over the cells exactly as
the budget reserved them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvsim.config.gpu_set import gpu_set_label
from kvsim.config.specs import HostSpec, LinkSpec
from kvsim.core.kv.host_pool import HostTier
from kvsim.core.link import Link
from kvsim.core.policy import PolicyFactory
from kvsim.core.scheduler import PagedScheduler
from kvsim.core.slot_scheduler import SlotScheduler
from kvsim.engines import engine_for
from kvsim.engines.config import PagedEngineConfig, SlotEngineConfig
from kvsim.errors import InputError
from kvsim.model.hybrid import blocks_per_request, hybrid_off_reason

if TYPE_CHECKING:
    from kvsim.engines.memory import MemoryBudget


@dataclass(frozen=True)
class PoolSizing:
    kv_pool_tokens: int
    slot_tokens: int
    kv_reserved_bytes: int
    num_gpu_blocks: int | None = None
    block_tokens: int = 1
    static_device_bytes: int = 0  # everything on the device except the KV pool
    device_bytes: int = 1
    kv_cpu_bytes: int = 0  # KV of layers left on the CPU (partial offload)
    kv_groups: tuple[tuple[str, int], ...] = ()  # vLLM hybrid manager (kvsim.model.hybrid)
    devices: tuple[DevicePart, ...] = ()  # several GPUs: each one's part (summary, report)

    @classmethod
    def from_budget(cls, b: MemoryBudget) -> PoolSizing:
        return cls(kv_pool_tokens=b.kv_pool_tokens, slot_tokens=b.slot_tokens,
                   kv_reserved_bytes=b.kv_reserved_bytes, num_gpu_blocks=b.num_gpu_blocks,
                   block_tokens=b.block_tokens,
                   static_device_bytes=b.total_bytes - b.kv_reserved_bytes,
                   device_bytes=b.device_bytes, kv_cpu_bytes=b.kv_cpu_bytes,
                   kv_groups=b.kv_groups, devices=tuple(
                       DevicePart(d.index, d.gpu, d.total_bytes - d.kv_bytes,
                                  d.kv_bytes, d.device_bytes) for d in b.devices))


@dataclass(frozen=True)
class DevicePart:
    """One GPU of a several-GPU box, for the per-GPU peaks: the bytes that do not change,
    its part of the KV pool (the pool's use is spread over the GPUs in these parts) and
    its memory.  NOTE: the parts' ``kv_bytes`` sum to the pool's reserved bytes."""

    index: int
    gpu: str
    static_bytes: int
    kv_bytes: int
    device_bytes: int


def scenario_budget(scenario: Any) -> MemoryBudget:
    """The engine's load-time memory layout for a scenario (kvsim.scenario.Scenario): its
    box and reserves, checked against the host and the cards (InputError if it cannot
    load) — what ``kvsim simulate`` starts from and ``kvsim validate`` lays a box out by."""
    from kvsim.engines.budget import box_reserves, check_host_memory, memory_budget

    budget = memory_budget(scenario.gpu, scenario.model, scenario.weights, scenario.engine,
                           **box_reserves(scenario))
    check_host_memory(budget, scenario.host, scenario.engine.context_tokens)
    check_loads(budget, gpu_set_label([g.name for g in scenario.gpus]), scenario.model.name)
    return budget


def check_loads(budget: MemoryBudget, gpu_name: str, model_name: str) -> None:
    """Refuse a model that cannot even load, with the numbers."""
    if budget.fits:
        return
    gib = 2**30
    failure = budget.failure or "does not fit"
    if budget.total_bytes <= budget.device_bytes:  # fits in memory, refused by an engine rule
        fit = budget.extra.get("max_model_len_fit", budget.kv_pool_tokens)
        short = fit < budget.slot_tokens  # the pool under max_model_len
        hint = ("; set engine.context_tokens (max_model_len; unset, it is the model's "
                f"maximum) to at most {fit}") if short else ""
        raise InputError("engine", budget.engine, f"cannot start on {gpu_name} with "
                         f"{model_name}: {failure}{hint}")
    raise InputError(
        "model", model_name,
        f"cannot load on {gpu_name}: needs {budget.total_bytes / gib:.2f} GiB, the card has "
        f"{budget.device_bytes / gib:.2f} GiB ({failure})")


def restore_time_fn(link: LinkSpec | None, host: HostSpec | None) -> Callable[[int], float]:
    """Seconds to copy ``n`` bytes host→device (the link, or host memory when unified)."""
    if link is not None:
        rate, lat = link.h2d_bytes_per_s, link.latency_s
    else:
        rate, lat = host.memory_bandwidth_bytes_per_s, 0.0
    return lambda n: lat + n / rate if n else 0.0


def make_link(link: LinkSpec | None, host: HostSpec | None) -> Link | None:
    """The host↔device link as FIFO channels, or None when there is no host tier
    (no link profile, or memory shared with the GPU)."""
    if link is None or link.name == "unified" or (host is not None and host.unified_with_gpu):
        return None
    return Link(link)


@dataclass(frozen=True)
class PolicyWiring:
    """What a scenario's KV policies give the scheduler when it is built
    (kvsim.policies.build.wire_policies)."""

    factory: PolicyFactory | None = None
    """Builds the scheduler's policy from the scheduler (None: no policy)."""
    host_tier: HostTier | None = None
    """A paged scheduler's host KV tier (vLLM offloading, LMCache, HiCache)."""
    ram_limit_bytes: int | None = None
    """A slot scheduler's RAM cache limit set by idle offload (None: ``--cache-ram``'s)."""


def paged_shape(sizing: PoolSizing) -> tuple[int, int]:
    """``(blocks, block_bytes)`` of the paged pool ``sizing`` describes."""
    blocks = sizing.num_gpu_blocks or sizing.kv_pool_tokens // sizing.block_tokens
    return blocks, sizing.kv_reserved_bytes // blocks


def check_pool(engine: PagedEngineConfig | SlotEngineConfig, sizing: PoolSizing, *,
               link: LinkSpec | None = None, host: HostSpec | None = None) -> None:
    """Refuse a paged pool the engine would not start with (InputError naming the knob);
    slot engines are checked by their memory budget."""
    if not isinstance(engine, PagedEngineConfig):
        return
    blocks, _ = paged_shape(sizing)
    if sizing.kv_groups:
        why = hybrid_off_reason(engine)
        if why:
            raise InputError("engine.disable_hybrid_kv_cache_manager", True,
                             f"no KV cache groups when vLLM's hybrid manager is off "
                             f"({why})")
        per_req = blocks_per_request(sizing.kv_groups, sizing.block_tokens,
                                     engine.context_tokens, engine.max_num_batched_tokens)
        if per_req > blocks:
            raise InputError(
                "engine.context_tokens", engine.context_tokens,
                f"one request of this max_model_len holds up to {per_req} blocks across "
                f"the KV cache groups and the pool has {blocks}; lower it or free memory")
    elif blocks * sizing.block_tokens < engine.context_tokens:
        raise InputError(
            "engine.context_tokens", engine.context_tokens,
            f"the model's max seq len ({engine.context_tokens}) is larger than the "
            f"maximum number of tokens that can be stored in KV cache "
            f"({blocks * sizing.block_tokens}); lower it or free memory")
    if engine.preemption_mode == "swap":
        if engine.swap_space_bytes <= 0:
            raise InputError("engine.swap_space_bytes", engine.swap_space_bytes,
                             "> 0 with preemption_mode swap (vLLM V0 default 4 GiB)")
        if make_link(link, host) is None:
            raise InputError("engine.preemption_mode", "swap", "recompute: swap needs "
                             "host memory over PCIe and this host has no separate tier")


def make_scheduler(engine: PagedEngineConfig | SlotEngineConfig, sizing: PoolSizing, *,
                   link: LinkSpec | None = None, host: HostSpec | None = None,
                   wiring: PolicyWiring = PolicyWiring()) -> PagedScheduler | SlotScheduler:
    """The engine's scheduler over the pool ``sizing`` describes, complete with its
    policy (``wiring``); InputError where the engine would not start (:func:`check_pool`)."""
    check_pool(engine, sizing, link=link, host=host)
    traits = engine_for(engine.preset)
    if isinstance(engine, PagedEngineConfig):
        blocks, block_bytes = paged_shape(sizing)
        return PagedScheduler(
            num_blocks=blocks, block_tokens=sizing.block_tokens,
            block_bytes=block_bytes, max_num_seqs=engine.max_num_seqs,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            max_model_len=engine.context_tokens,
            enable_prefix_caching=engine.enable_prefix_caching,
            preemption_mode=engine.preemption_mode,
            retract_order=traits.retract_order,
            swap_space_bytes=engine.swap_space_bytes, link=make_link(link, host),
            kv_groups=sizing.kv_groups, null_block=traits.null_block(engine),
            host_tier=wiring.host_tier, policy=wiring.factory,
            max_tokens_margin=traits.max_tokens_margin)
    unified = traits.unified_pool(engine)
    cells = sizing.kv_pool_tokens
    ram = engine.cache_ram_bytes if wiring.ram_limit_bytes is None else wiring.ram_limit_bytes
    return SlotScheduler(
        parallel=engine.parallel, slot_tokens=sizing.slot_tokens, pool_cells=cells,
        unified=unified, bytes_per_token=sizing.kv_reserved_bytes // cells,
        reserved_bytes=sizing.kv_reserved_bytes, n_batch=engine.n_batch,
        similarity=engine.slot_prompt_similarity, cache_prompt=engine.cache_prompt,
        cache_ram_bytes=ram, cache_idle_slots=engine.cache_idle_slots,
        context_shift=engine.context_shift,
        n_keep=engine.n_keep, n_discard=engine.n_discard,
        truncate_prompt=traits.truncates_prompt,
        restore_time_s=restore_time_fn(link, host) if (link or host) else (lambda n: 0.0),
        state_bytes_per_token=(sizing.kv_reserved_bytes + sizing.kv_cpu_bytes) // cells,
        max_queue=engine.max_queue, policy=wiring.factory,
        ubatch_split=traits.ubatch_split(engine),
        fresh_slots_from_last=traits.fresh_slots_from_last)
