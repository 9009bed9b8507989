"""KV policies: one module per family, each a pydantic config (``kind``) next to its logic.

Registry (:data:`PolicyConfig`, the discriminated union a scenario's ``policies``
list is validated against):

- quantization: ``kivi`` (kvsim.policies.quantization)
- eviction: ``sliding_window``, ``score_eviction``, ``recoverable_eviction``
  (kvsim.policies.eviction)
- offload: ``idle_offload`` (kvsim.policies.offload)

The mechanics live in :mod:`kvsim.policies.runtime` (block states per session
span, PCIe transfers, accuracy proxy) — built by :func:`kvsim.policies.runtime.install`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kvsim.policies.eviction import (
    RecoverableEvictionConfig,
    ScoreEvictionConfig,
    SlidingWindowConfig,
)
from kvsim.policies.offload import IdleOffloadConfig
from kvsim.policies.quantization import KiviConfig

REGISTRY = {c.model_fields["kind"].default: c for c in (
    KiviConfig, SlidingWindowConfig, ScoreEvictionConfig, RecoverableEvictionConfig,
    IdleOffloadConfig)}
PolicyConfig = Annotated[
    KiviConfig | SlidingWindowConfig | ScoreEvictionConfig | RecoverableEvictionConfig
    | IdleOffloadConfig, Field(discriminator="kind")]
EVICTION_KINDS = ("kivi", "sliding_window", "score_eviction", "recoverable_eviction")

__all__ = ["EVICTION_KINDS", "REGISTRY", "PolicyConfig"]
