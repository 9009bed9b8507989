"""KV policies: one module per family, each a pydantic config (``kind``) next to its logic.

Registry (:data:`PolicyConfig`, the discriminated union a scenario's ``policies``
list is validated against):

- quantization: ``kivi`` (kvsim.policies.quantization)
- eviction: ``sliding_window``, ``score_eviction``, ``recoverable_eviction``
  (kvsim.policies.eviction)
- offload: ``idle_offload`` (slot engines), ``host_kv_cache`` (paged engines)
  (kvsim.policies.offload)

Every config derives from :class:`kvsim.config.units.FrozenModel` (unknown keys, true/false
for a number and .inf/.nan are refused); an error names the key as written,
``policies.0.budget_tokens`` (:func:`_user_path` drops pydantic's union tag).

Which kinds apply to which engine family: :data:`SLOT_KINDS`, :data:`PAGED_KINDS`
(kvsim.policies.build refuses the others with a one-line error).

The mechanics live in :mod:`kvsim.policies.runtime` (the scheduler policy and step
hook), :mod:`kvsim.policies.recall` (reference scoring, promotion) and
:mod:`kvsim.policies.slot_evict` (per-token transitions) — installed by
:func:`kvsim.policies.build.install`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator

from kvsim.errors import from_validation_error
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


class _Untagged:
    """A ValidationError's errors without the union tag pydantic puts in their path."""

    def __init__(self, exc: ValidationError, tag: Any) -> None:
        self._errors: list[Any] = [
            {**e, "loc": e["loc"][1:]} if e["loc"][:1] == (tag,) else e for e in exc.errors()]

    def errors(self) -> list[Any]:
        return self._errors


def _user_path(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Validate one policy mapping; an error names the key the user wrote
    (``policies.0.budget_tokens``), not pydantic's ``policies.0.score_eviction.budget_tokens``."""
    if not isinstance(value, dict):
        return handler(value)
    try:
        return handler(value)
    except ValidationError as exc:
        raise from_validation_error(_Untagged(exc, value.get("kind"))) from None


PolicyConfig = Annotated[
    Annotated[KiviConfig | SlidingWindowConfig | ScoreEvictionConfig
              | RecoverableEvictionConfig | IdleOffloadConfig | HostKVCacheConfig,
              Field(discriminator="kind")],
    WrapValidator(_user_path)]

EVICTION_KINDS = ("kivi", "sliding_window", "score_eviction", "recoverable_eviction")
SLOT_KINDS = (*EVICTION_KINDS, "idle_offload")
PAGED_KINDS = ("host_kv_cache",)

__all__ = ["EVICTION_KINDS", "PAGED_KINDS", "REGISTRY", "SLOT_KINDS", "PolicyConfig"]
