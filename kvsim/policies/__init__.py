"""KV policies: one module per family, each a pydantic config (``kind``) next to its logic.

Registry (:data:`PolicyConfig`, the discriminated union a scenario's ``policies``
list is validated against):

- quantization: ``kivi`` (kvsim.policies.quantization)
- eviction: ``sliding_window``, ``score_eviction``, ``recoverable_eviction``
  (kvsim.policies.eviction)
- offload: ``idle_offload`` (slot engines), ``host_kv_cache`` (paged engines)
  (kvsim.policies.offload)

Which kinds apply to which engine family: :data:`SLOT_KINDS`, :data:`PAGED_KINDS`
(kvsim.policies.build refuses the others with a one-line error).

The mechanics live in :mod:`kvsim.policies.runtime` (the scheduler policy and step
hook), :mod:`kvsim.policies.recall` (reference scoring, promotion) and
:mod:`kvsim.policies.slot_evict` (per-token transitions) — installed by
:func:`kvsim.policies.build.install`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kvsim.policies.eviction import (
    RecoverableEvictionConfig,
    ScoreEvictionConfig,
    SlidingWindowConfig,
)
from kvsim.policies.offload import HostKVCacheConfig, IdleOffloadConfig
from kvsim.policies.quantization import KiviConfig

REGISTRY = {c.model_fields["kind"].default: c for c in (
    KiviConfig, SlidingWindowConfig, ScoreEvictionConfig, RecoverableEvictionConfig,
    IdleOffloadConfig, HostKVCacheConfig)}
PolicyConfig = Annotated[
    KiviConfig | SlidingWindowConfig | ScoreEvictionConfig | RecoverableEvictionConfig
    | IdleOffloadConfig | HostKVCacheConfig, Field(discriminator="kind")]
EVICTION_KINDS = ("kivi", "sliding_window", "score_eviction", "recoverable_eviction")
SLOT_KINDS = (*EVICTION_KINDS, "idle_offload")
PAGED_KINDS = ("host_kv_cache",)

__all__ = ["EVICTION_KINDS", "PAGED_KINDS", "REGISTRY", "SLOT_KINDS", "PolicyConfig"]
