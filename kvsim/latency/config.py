"""A scenario's ``latency`` section: which step-time model prices the engine's steps.

NOTE: ``kind`` picks the model (kvsim.latency.factory.make_latency_model); each config
holds only that model's knobs.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from kvsim.config.units import FrozenModel, Seconds

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class RooflineConfig(FrozenModel):
    """Step times from the card's spec sheet: the backend-aware roofline
    (kvsim.latency.backend; constants fitted on published llama.cpp measurements), or
    with ``rates: peak`` the plain one (peak × the profile's efficiencies)."""

    model_config = _FROZEN
    kind: Literal["roofline"] = "roofline"
    backend: Literal["auto", "CUDA", "ROCm", "Vulkan", "Metal", "SYCL"] = Field(
        "auto", description="the engine's GPU backend; auto: CUDA on NVIDIA, ROCm on AMD, "
        "Metal on Apple, Vulkan on Intel")
    rates: Literal["backend", "peak"] = Field(
        "backend", description="backend: fitted backend constants; peak: the card's peak "
        "rates × its profile's bandwidth/compute efficiencies")
    constants: str | None = Field(None, description="a speed-constants YAML to use instead "
                                  "of the shipped one (rates: backend)")
    step_overhead_s: Seconds | None = Field(
        None, ge=0, description="per-step launch/sync overhead; unset: the backend's fitted "
        "overhead (rates: backend) or 4 ms (rates: peak)")
    kv_dequant_factor: float = Field(
        0.25, ge=0, description="quantized KV: dequant time as a fraction of its read time "
        "(planning assumption, kvsim.latency.roofline; 0 = fused kernels)")


class CalibratedConfig(FrozenModel):
    """Step times from a calibration artifact (kvsim calibrate: torch kernels, an engine
    or llama-bench output)."""

    model_config = _FROZEN
    kind: Literal["calibrated"]
    path: str
    out_of_range: Literal["clamp", "refuse"] = "clamp"


class ConstantConfig(FrozenModel):
    """Fixed costs, for tests and queueing-theory validation."""

    model_config = _FROZEN
    kind: Literal["constant"]
    step_s: Seconds = Field(0.02, ge=0, description="fixed time of one engine step")
    prefill_token_s: Seconds = Field(0.0, ge=0, description="added per prefilled token")
    decode_token_s: Seconds = Field(0.0, ge=0, description="added per decoded token")
    # NOTE: no transfer cost here: every KV copy is priced by the PCIe link model
    # (kvsim.core.link, LinkSpec.latency_s + bytes / bandwidth) whatever the latency kind.


LatencyConfig = Annotated[
    RooflineConfig | CalibratedConfig | ConstantConfig, Field(discriminator="kind")]
