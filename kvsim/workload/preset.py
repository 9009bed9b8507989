"""Household presets: the data a household generator draws sessions from.

A preset (``workloads/households/<name>.yaml``) names *assistants* (each with one
shared system prompt), *session kinds* (chat, homework, agent, voice, document —
each with its own turn-count, token, think-time and reference distributions) and
*members* (daily activity windows for weekdays and weekends, sessions per day, and
which kinds they use).  Every number is data with a ``source`` string saying where
it comes from; numbers that nobody measured are labelled ``ASSUMPTION``.

Distributions are tiny frozen models sampled with a numpy Generator:
``const`` (value), ``uniform`` (low, high), ``lognormal`` (median, p95 — so the YAML
speaks in the percentiles that trace READMEs report) and ``exponential`` (mean);
each clips to ``[min, max]``.

NOTE: presets are frozen and validated with extra="forbid"; ``params`` overrides
from a scenario are deep-merged into the raw YAML mapping *before* validation, so
an override can never bypass the checks.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, ValidationError, model_validator

from kvsim.config.catalog import bundled_path, read_yaml
from kvsim.config.units import FrozenModel
from kvsim.errors import InputError, from_validation_error

_FROZEN = ConfigDict(frozen=True, extra="forbid")
Z95 = 1.6448536269514722  # standard-normal 95th percentile


class _Dist(FrozenModel):
    model_config = _FROZEN
    min: float = 0.0
    max: float | None = None
    source: str = ""

    @model_validator(mode="after")
    def _bounds(self) -> _Dist:
        if self.max is not None and self.max < self.min:
            raise InputError("max", self.max, f"at least min ({self.min:g})")
        return self

    def _raw(self, rng: np.random.Generator) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def sample(self, rng: np.random.Generator) -> float:
        x = max(self.min, self._raw(rng))
        return x if self.max is None else min(self.max, x)

    def sample_int(self, rng: np.random.Generator) -> int:
        return round(self.sample(rng))


class ConstDist(_Dist):
    dist: Literal["const"]
    value: float

    def _raw(self, rng: np.random.Generator) -> float:
        return self.value


class UniformDist(_Dist):
    dist: Literal["uniform"]
    low: float
    high: float

    @model_validator(mode="after")
    def _order(self) -> UniformDist:
        if self.high < self.low:
            raise InputError("high", self.high, f"at least low ({self.low:g})")
        return self

    def _raw(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))


class LogNormalDist(_Dist):
    """Log-normal given by its median and 95th percentile."""

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    p95: float = Field(gt=0)

    @model_validator(mode="after")
    def _order(self) -> LogNormalDist:
        if self.p95 < self.median:
            raise InputError("p95", self.p95, f"at least median ({self.median:g})")
        return self

    def _raw(self, rng: np.random.Generator) -> float:
        sigma = math.log(self.p95 / self.median) / Z95
        return float(rng.lognormal(math.log(self.median), sigma))


class ExponentialDist(_Dist):
    dist: Literal["exponential"]
    mean: float = Field(gt=0)

    def _raw(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.mean))


Dist = Annotated[ConstDist | UniformDist | LogNormalDist | ExponentialDist,
                 Field(discriminator="dist")]


class AssistantSpec(FrozenModel):
    """One assistant = one system prompt shared by all its sessions."""

    model_config = _FROZEN
    system_prompt_tokens: int = Field(gt=0)
    source: str = ""


class ReferenceSpec(FrozenModel):
    """How later turns refer back to earlier content."""

    model_config = _FROZEN
    p_per_turn: float = Field(0.0, ge=0, le=1, description="chance a turn >= 1 refers back")
    p_exact: float = Field(0.5, ge=0, le=1, description="share of 'exact' (vs 'gist') refs")
    target: Literal["any", "first"] = Field(
        "any", description="earlier turn referred to: uniform over earlier turns, or turn 0")
    span_tokens: Dist = Field(default_factory=lambda: ConstDist(dist="const", value=32))
    source: str = ""


class KindSpec(FrozenModel):
    """Distributions for one session kind."""

    model_config = _FROZEN
    assistant: str | None = None
    turns: Dist
    input_tokens: Dist
    output_tokens: Dist
    think_s: Dist
    first_input_tokens: Dist | None = Field(
        None, description="turn 0 input when it differs (pasted document, agent task)")
    tool_tokens: Dist | None = Field(None, description="tool output on turns >= 1 (agents)")
    reread_every: Dist | None = Field(
        None, description="tool calls between re-reads of the system prompt (agents)")
    references: ReferenceSpec = Field(default_factory=ReferenceSpec)
    source: str = ""


class Window(FrozenModel):
    """A daily activity window in local hours [start_h, end_h) with a weight."""

    model_config = _FROZEN
    start_h: float = Field(ge=0, le=24)
    end_h: float = Field(ge=0, le=24)
    weight: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _order(self) -> Window:
        if self.end_h <= self.start_h:
            raise ValueError("end_h must be after start_h")
        return self


class DayPattern(FrozenModel):
    model_config = _FROZEN
    sessions: float = Field(ge=0, description="mean sessions per day (Poisson)")
    windows: tuple[Window, ...] = Field(min_length=1)


class MemberSpec(FrozenModel):
    model_config = _FROZEN
    role: str = ""
    weekday: DayPattern
    weekend: DayPattern
    kinds: dict[str, float] = Field(min_length=1, description="kind -> weight")
    source: str = ""


class HouseholdPreset(FrozenModel):
    model_config = _FROZEN
    name: str
    description: str = ""
    assistants: dict[str, AssistantSpec] = Field(default_factory=dict)
    kinds: dict[Literal["chat", "homework", "agent", "voice", "document"], KindSpec]
    members: dict[str, MemberSpec] = Field(min_length=1)
    sources: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _links(self) -> HouseholdPreset:
        for kname, kind in self.kinds.items():
            if kind.assistant is not None and kind.assistant not in self.assistants:
                raise InputError(f"kinds.{kname}.assistant", kind.assistant, "unknown; one of: "
                                 + ", ".join(self.assistants))
        for mname, m in self.members.items():
            for k, w in m.kinds.items():
                if k not in self.kinds:
                    raise InputError(f"members.{mname}.kinds", k, "unknown kind; one of: "
                                     + ", ".join(self.kinds))
                if w < 0:
                    raise InputError(f"members.{mname}.kinds.{k}", w, "a weight >= 0")
        return self


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursively merge ``override`` into a copy of ``base`` (mappings merge, rest replace)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_preset(name: str | Path, overrides: dict[str, Any] | None = None,
                field: str = "preset") -> HouseholdPreset:
    """A bundled preset by name (``family-4``) or a YAML path, with overrides merged;
    ``field`` is how errors name the preset (``workload.preset`` in a scenario)."""
    p = Path(name)
    if not (str(name).endswith((".yaml", ".yml")) and p.is_file()):
        p = bundled_path("households", str(name), field)
    raw = deep_merge(read_yaml(p, field), overrides or {})
    try:
        return HouseholdPreset.model_validate(raw)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=f"{field} '{p.stem}'",
                                    model=HouseholdPreset) from None
