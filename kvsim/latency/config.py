"""A scenario's ``latency`` section: which step-time model prices the engine's steps.

NOTE: ``kind`` picks the model (kvsim.latency.factory.make_latency_model); each config
holds only that model's knobs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from kvsim.config.units import FrozenModel, Seconds
from kvsim.errors import InputError

_FROZEN = ConfigDict(frozen=True, extra="forbid")

JITTER_CV_MAX = 1.0
"""``jitter_cv`` is below this: at a CV of 1 the noise's median step is 71 % of its mean,
a server that erratic is not one step time with jitter around it."""


JitterCv = Annotated[float, Field(
    ge=0, lt=JITTER_CV_MAX, description="per-step multiplicative timing noise: its "
    "coefficient of variation, in [0, 1) (0 = exact step times; `kvsim calibrate engine` "
    "prints a server's); > 0 runs every step (no fast-forward)")]
JitterPromptCv = Annotated[float | None, Field(
    None, ge=0, lt=JITTER_CV_MAX, description="the noise's coefficient of variation for "
    "steps that compute prompt tokens, in [0, 1); unset: jitter_cv (a long prompt step "
    "wobbles less than a decode step: `kvsim calibrate engine` prints both)")]
JitterRunCv = Annotated[float, Field(
    0.0, ge=0, lt=JITTER_CV_MAX, description="coefficient of variation of a whole run's "
    "speed, in [0, 1): one lognormal factor per run on every step, the drift of a machine "
    "from one run to the next (0 = none; `kvsim calibrate engine` prints its rounds')")]
ARRIVAL_DELAY_MAX_S = 60.0
"""``arrival_delay_s`` and ``arrival_jitter_s`` are at most this: a client's lateness and a
server's request handling are milliseconds; a minute is a stalled client, and a longer
wait between turns is a think time, which the workload holds."""
ArrivalDelay = Annotated[Seconds, Field(
    ge=0, le=ARRIVAL_DELAY_MAX_S, allow_inf_nan=False, description="seconds between a "
    "request's time in the workload (its start, or the end of its think time) and the "
    "engine taking it: the client's own lateness and the server's request handling beyond "
    "its typical time; the mean of each request's draw, at most 60 s (0 = on time; `kvsim "
    "calibrate engine` prints a client's)")]
ArrivalJitter = Annotated[Seconds, Field(
    ge=0, le=ARRIVAL_DELAY_MAX_S, allow_inf_nan=False, description="standard deviation of "
    "that delay (seconds, at most 60): each request's a lognormal draw of mean "
    "arrival_delay_s; which slot a returning session finds hinges on it (0 = every request "
    "arrival_delay_s late)")]
JitterSeed = Annotated[int | None, Field(
    ge=0, description="seed of the noise's own stream; unset: the scenario's seed (kvsim "
    "simulate --jitter-replications sets one per replication)")]


def arrival_keys(delay_s: float, sd_s: float) -> str:
    """The two scenario keys that replay a measured arrival delay, as a line says them."""
    return f"latency.arrival_delay_s: {delay_s:.3g} and latency.arrival_jitter_s: {sd_s:.3g}"


class JitterKnobs(FrozenModel):
    """Base of every latency kind, which takes timing noise (``jitter_cv``,
    ``jitter_prompt_cv``, ``jitter_run_cv``, ``jitter_seed``, last among its keys): each
    engine step's time times a lognormal draw of coefficient of variation ``jitter_cv``,
    centred on the model's prediction (median 1 for a calibration's medians, else mean
    1) — or ``jitter_prompt_cv``, when set, for a step that computes prompt tokens — and
    times one draw per run of CV ``jitter_run_cv`` (kvsim.latency.jitter); and each
    request ``arrival_delay_s`` late on average, with standard deviation
    ``arrival_jitter_s`` (kvsim.latency.jitter.ArrivalNoise).

    NOTE: at the defaults (no jitter) none of the keys is written out, so a scenario
    without jitter dumps, hashes and saves exactly as before the knobs existed.
    """

    # NOTE: each kind declares jitter_cv, jitter_prompt_cv, jitter_run_cv, arrival_delay_s,
    # arrival_jitter_s and jitter_seed after its own keys (declared here, they would be
    # dumped first and change scenario hashes)

    @model_validator(mode="after")
    def _check_arrival(self) -> JitterKnobs:
        sd, mean = self.arrival_jitter_s, self.arrival_delay_s  # type: ignore[attr-defined]
        if sd > 0 and mean <= 0:
            raise InputError("arrival_jitter_s", sd,
                             "0 unless arrival_delay_s > 0 (the delay's mean; its draws "
                             "are lognormal, never early)")
        return self

    @property
    def prompt_cv(self) -> float:
        """The noise's CV on a step that computes prompt tokens."""
        cv, prompt = self.jitter_cv, self.jitter_prompt_cv  # type: ignore[attr-defined]
        return float(cv if prompt is None else prompt)

    @property
    def noise_knobs(self) -> dict[str, float]:
        """The timing noise's knobs, resolved (``jitter_prompt_cv``: :attr:`prompt_cv`)."""
        return {"jitter_cv": self.jitter_cv,  # type: ignore[attr-defined]
                "jitter_prompt_cv": self.prompt_cv,
                "jitter_run_cv": self.jitter_run_cv,  # type: ignore[attr-defined]
                "arrival_delay_s": self.arrival_delay_s,  # type: ignore[attr-defined]
                "arrival_jitter_s": self.arrival_jitter_s}  # type: ignore[attr-defined]

    @property
    def noise_words(self) -> str:
        """The timing noise in words, e.g. ``latency.jitter_cv 0.12, prompt steps 0.02,
        requests 0.65 ms late (sd 0.35 ms)``."""
        k = self.noise_knobs
        out = [f"latency.jitter_cv {k['jitter_cv']:g}"]
        if k["jitter_prompt_cv"] != k["jitter_cv"]:
            out.append(f"prompt steps {k['jitter_prompt_cv']:g}")
        if k["jitter_run_cv"] > 0:
            out.append(f"run speed {k['jitter_run_cv']:g}")
        if k["arrival_delay_s"] > 0:
            out.append(f"requests {k['arrival_delay_s'] * 1e3:.3g} ms late (sd "
                       f"{k['arrival_jitter_s'] * 1e3:.3g} ms)")
        return ", ".join(out)

    @property
    def steps_jittered(self) -> bool:
        """Whether any step carries timing noise (then every step is simulated)."""
        return self.jitter_cv > 0 or self.prompt_cv > 0  # type: ignore[attr-defined]

    @property
    def jittered(self) -> bool:
        """Whether the run's timing carries noise: its steps', its speed's or its
        arrivals'."""
        return (self.steps_jittered or self.jitter_run_cv > 0  # type: ignore[attr-defined]
                or self.arrival_jitter_s > 0)  # type: ignore[attr-defined]

    @model_serializer(mode="wrap")
    def _drop_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        if isinstance(out, dict):
            if not out.get("jitter_cv"):
                out.pop("jitter_cv", None)
            if out.get("jitter_prompt_cv") is None:
                out.pop("jitter_prompt_cv", None)
            if not out.get("jitter_run_cv"):
                out.pop("jitter_run_cv", None)
            for key in ("arrival_delay_s", "arrival_jitter_s"):
                if not out.get(key):
                    out.pop(key, None)
            if out.get("jitter_seed") is None:
                out.pop("jitter_seed", None)
            if out.get("speed_band") == "none":  # NOTE: RooflineConfig's, as the above
                out.pop("speed_band", None)
        return out


class RooflineConfig(JitterKnobs):
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
    speed_band: Literal["none", "fast", "slow"] = Field(
        "none", description="run at one end of the speed model's error on cards its fit "
        "left out (rates: backend): slow = every step as long as on a card at the 90th "
        "percentile of that error, fast = the 10th (kvsim.latency.speed_band); none = as "
        "predicted")
    jitter_cv: JitterCv = 0.0
    jitter_prompt_cv: JitterPromptCv = None
    jitter_run_cv: JitterRunCv = 0.0
    arrival_delay_s: ArrivalDelay = 0.0
    arrival_jitter_s: ArrivalJitter = 0.0
    jitter_seed: JitterSeed = None


class CalibratedConfig(JitterKnobs):
    """Step times from a calibration artifact (kvsim calibrate: torch kernels, an engine
    or llama-bench output)."""

    model_config = _FROZEN
    kind: Literal["calibrated"]
    path: str
    out_of_range: Literal["clamp", "refuse"] = "clamp"
    jitter_cv: JitterCv = 0.0
    jitter_prompt_cv: JitterPromptCv = None
    jitter_run_cv: JitterRunCv = 0.0
    arrival_delay_s: ArrivalDelay = 0.0
    arrival_jitter_s: ArrivalJitter = 0.0
    jitter_seed: JitterSeed = None


class ConstantConfig(JitterKnobs):
    """Fixed costs, for tests and queueing-theory validation."""

    model_config = _FROZEN
    kind: Literal["constant"]
    step_s: Seconds = Field(0.02, ge=0, description="fixed time of one engine step")
    prefill_token_s: Seconds = Field(0.0, ge=0, description="added per prefilled token")
    decode_token_s: Seconds = Field(0.0, ge=0, description="added per decoded token")
    jitter_cv: JitterCv = 0.0
    jitter_prompt_cv: JitterPromptCv = None
    jitter_run_cv: JitterRunCv = 0.0
    arrival_delay_s: ArrivalDelay = 0.0
    arrival_jitter_s: ArrivalJitter = 0.0
    jitter_seed: JitterSeed = None
    # NOTE: no transfer cost here: every KV copy is priced by the PCIe link model
    # (kvsim.core.link, LinkSpec.latency_s + bytes / bandwidth) whatever the latency kind.


LatencyConfig = Annotated[
    RooflineConfig | CalibratedConfig | ConstantConfig, Field(discriminator="kind")]
