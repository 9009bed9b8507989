"""A scenario's workload section: where its requests come from, and what a session does
after one of its requests failed.

The simulator's lower layers read these (:mod:`kvsim.workload.loader` the source,
:mod:`kvsim.core.sessions` the rule after a failure); :class:`kvsim.scenario.Scenario`
holds one :class:`WorkloadConfig`.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import ConfigDict, Field, field_validator

from kvsim.config.units import FrozenModel

AfterFailure = Literal["new_chat", "end_session", "continue"]
"""What a session sends after one of its requests failed (:mod:`kvsim.core.sessions`)."""
AFTER_FAILURE: tuple[str, ...] = get_args(AfterFailure)


class WorkloadConfig(FrozenModel):
    """Where requests come from: a household preset, or a trace file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: str | None = Field(None, description="household preset, e.g. 'family-4'")
    trace: str | None = Field(None, description="path to a kvsim trace (.jsonl or .parquet)")
    days: float = Field(1.0, gt=0, description="generated days (preset only)")
    start_weekday: int = Field(0, ge=0, le=6, description="0 = Monday (preset only)")
    params: dict[str, Any] = Field(default_factory=dict, description="preset overrides")
    max_sessions: int | None = Field(None, gt=0, description="down-sample to whole sessions")
    time_scale: float = Field(1.0, gt=0, description="multiply arrival times (open loop)")
    # NOTE: the same rule drives `kvsim replay --after-failure` (kvsim.core.sessions)
    after_failure: AfterFailure = Field(
        "new_chat", description="after one of its requests failed, a session starts a new "
        "chat (system prompt + the next turn's own input), ends (its later turns dropped) "
        "or continues the trace verbatim")

    @field_validator("trace")
    @classmethod
    def _one_source(cls, v: str | None, info: Any) -> str | None:
        if v is not None and info.data.get("preset") is not None:
            raise ValueError("give either preset or trace, not both")
        return v
