"""KV policies: one module per family, each policy a pydantic config (``kind``) next to its logic.

:data:`PolicyConfig` is the discriminated union a scenario's ``policies`` list is
validated against, built from :data:`kvsim.policies.registry.REGISTRY`: a config class
registers itself with ``@register_policy`` and declares ``family`` (the engine family it
applies to: slot = llama.cpp / ollama, paged = vllm / sglang) and ``evicts`` (the
eviction family, one per scenario); :data:`SLOT_KINDS`, :data:`PAGED_KINDS` and
:data:`EVICTION_KINDS` are derived from those declarations.

Every config derives from :class:`kvsim.config.units.FrozenModel` (unknown keys, true/false
for a number and .inf/.nan are refused); an error names the key as written,
``policies.0.budget_tokens`` (:func:`_user_path` drops pydantic's union tag).

The mechanics live in :mod:`kvsim.policies.runtime` (the scheduler policy and step
hook), :mod:`kvsim.policies.recall` (reference scoring, promotion) and
:mod:`kvsim.policies.slot_evict` (per-token transitions, driven by each eviction
config's ``act`` / ``quiet_steps``) — wired into the scheduler by
:func:`kvsim.policies.build.wire_policies`.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator

from kvsim.errors import from_validation_error

# NOTE: importing a policy module registers its configs; this order is the tag order
from kvsim.policies import quantization  # noqa: F401  # isort: skip
from kvsim.policies import eviction, offload  # noqa: F401  # isort: skip
from kvsim.policies.registry import REGISTRY, kinds


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
        kind = value.get("kind")
        raise from_validation_error(_Untagged(exc, kind), model=REGISTRY.get(kind)
                                    if isinstance(kind, str) else None) from None


# NOTE: the union is built from the registry, so a type checker cannot see its members
PolicyConfig = Annotated[  # type: ignore[valid-type]
    Annotated[Union[tuple(REGISTRY.values())],  # noqa: UP007
              Field(discriminator="kind")],
    WrapValidator(_user_path)]

EVICTION_KINDS = kinds(evicts=True)
SLOT_KINDS = kinds(family="slot")
PAGED_KINDS = kinds(family="paged")

__all__ = ["EVICTION_KINDS", "PAGED_KINDS", "REGISTRY", "SLOT_KINDS", "PolicyConfig"]
