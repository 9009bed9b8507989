"""The policy registry: each policy config registers itself with :func:`register_policy`.

NOTE: registration order is the order of the ``kind`` tags in validation errors and in
the "one of …" lists of kvsim.policies.build; the package imports its modules in that order.
"""

from __future__ import annotations

from typing import ClassVar, Literal, TypeVar

from kvsim.config.units import FrozenModel
from kvsim.engines import ENGINES

Family = Literal["slot", "paged"]  # slot: llama.cpp / ollama; paged: vllm / sglang


class PolicyBase(FrozenModel):
    """A policy config: its ``kind`` tag plus what it declares about itself."""

    family: ClassVar[Family] = "slot"  # the engine family it applies to
    evicts: ClassVar[bool] = False     # the eviction family: at most one per scenario
    singleton: ClassVar[bool] = False  # at most one of this kind per scenario
    offloads_idle: ClassVar[bool] = False  # moves idle slots' KV off the GPU (slot engines)
    host_tier: ClassVar[bool] = False  # gives a paged pool a host KV tier

    def needs_host(self) -> bool:
        """Whether this config copies KV to host memory over a link (no link: refused)."""
        return False


REGISTRY: dict[str, type[PolicyBase]] = {}

_P = TypeVar("_P", bound=PolicyBase)


def register_policy(cls: type[_P]) -> type[_P]:
    """Add a policy config class (its ``kind`` default is the tag) to :data:`REGISTRY`.
    """
    REGISTRY[cls.model_fields["kind"].default] = cls
    return cls


def kinds(family: Family | None = None, evicts: bool | None = None) -> tuple[str, ...]:
    """Registered kinds, in registration order, filtered by family and eviction flag."""
    return tuple(k for k, c in REGISTRY.items()
                 if (family is None or c.family == family)
                 and (evicts is None or c.evicts == evicts))


def family_engines(family: Family) -> str:
    """The engines a policy family applies to, as errors and ``--help`` name them
    (``llama.cpp / ollama``), from the engines' own ``slot_family`` declarations."""
    return " / ".join(n for n, e in ENGINES.items() if e.slot_family == (family == "slot"))


def kinds_help() -> str:
    """Every registered kind with the engines it applies to, one clause per family."""
    fams: tuple[Family, ...] = ("slot", "paged")
    return "; ".join(f"{', '.join(kinds(f))} on {family_engines(f)}" for f in fams)
