"""Host offload of idle sessions' KV (docs/reference/engines.md §3.4 ``--cache-ram`` /
``--cache-idle-slots``, §5 LMCache, §2.4 HiCache).

During a session's think time its KV sits idle on the GPU.  ``idle_offload`` writes
a slot idle for ``idle_after_s`` to host RAM over PCIe (device→host, asynchronous:
costs link time, not latency) and frees its GPU cells; on the session's next turn
the server restores the saved state host→device *or recomputes it*, whichever is
cheaper (``restore: auto``, as LMCache and llama.cpp's RAM cache do: a transfer of
``bytes / h2d + latency`` against the prefill time of those tokens).
``mode: drop`` frees the cells without a copy (the next turn recomputes: the
"recompute" end of the trade-off).  The host tier holds at most
``host_budget_bytes`` (default: the engine's ``cache_ram_bytes``, capped by the
host's memory); the oldest entries are evicted first.

``host_kv_cache`` is the paged engines' counterpart (vLLM native offloading /
LMCache, SGLang HiCache): a host LRU tier of prefix blocks under the GPU prefix
cache (kvsim.core.kv.host_pool, kvsim.core.scheduler).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvsim.config.units import Bytes, Seconds
from kvsim.policies.registry import Family, PolicyBase, register_policy


@register_policy
class IdleOffloadConfig(PolicyBase):
    """Idle slots offloaded to host RAM (or dropped) after ``idle_after_s``."""

    kind: Literal["idle_offload"] = "idle_offload"
    singleton: ClassVar[bool] = True
    offloads_idle: ClassVar[bool] = True
    idle_after_s: Seconds = Field(10.0, ge=0, description="offload a slot idle this long")
    mode: Literal["offload", "drop"] = "offload"
    restore: Literal["auto", "always"] = "auto"
    host_budget_bytes: Bytes | None = Field(None, description="host KV capacity; None = engine's")

    def needs_host(self) -> bool:
        return self.mode == "offload"


@register_policy
class HostKVCacheConfig(PolicyBase):
    """A host-RAM tier under a paged engine's prefix cache (kvsim.core.kv.host_pool).

    vLLM ``--kv-offloading-size`` (native CPU pool, LRU) or LMCache's local CPU
    backend (``max_local_cpu_size`` default 5.0 GB), SGLang HiCache (host pool =
    ``--hicache-ratio`` × the device KV pool, default 2.0), docs/reference/engines.md §1.6, §2.4,
    §5. ``host_budget_bytes`` None = the engine's default: 2.0 × the GPU pool on SGLang,
    LMCache's 5.0 GB on vLLM.  On vLLM ``backend: lmcache`` (default) stores and loads
    whole 256-token chunks of prompt KV only; ``native`` stores every full block.
    ``load: auto`` loads a host hit only when the copy ends before recomputing those
    tokens would; ``always`` loads every hit.
    """

    kind: Literal["host_kv_cache"] = "host_kv_cache"
    family: ClassVar[Family] = "paged"
    singleton: ClassVar[bool] = True
    host_tier: ClassVar[bool] = True
    host_budget_bytes: Bytes | None = Field(None, description="host KV capacity; None = engine's")
    hicache_ratio: float = Field(2.0, gt=0, description="SGLang: host pool / device pool")
    load: Literal["auto", "always"] = "auto"
    backend: Literal["lmcache", "native"] = Field(
        "lmcache", description="vLLM: LMCache keeps whole 256-token chunks of prompt KV "
        "(no partial chunk, no decoded KV, docs/reference/engines.md §5); native offloading keeps "
        "blocks")
