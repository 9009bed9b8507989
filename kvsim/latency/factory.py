"""Build the scenario's latency model (roofline, constant; calibrated when present)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvsim.engines import engine_for
from kvsim.engines.config import EngineConfig, SlotEngineConfig
from kvsim.latency.backend import gpu_rates, load_constants, resolve_backend
from kvsim.latency.base import LatencyModel
from kvsim.latency.bench_artifact import is_bench_artifact, load_bench_artifact
from kvsim.latency.box import box_latency
from kvsim.latency.calibrated import make_calibrated
from kvsim.latency.config import RooflineConfig
from kvsim.latency.constant import ConstantLatency
from kvsim.latency.jitter import ArrivalNoise, arrival_noise, with_jitter
from kvsim.latency.multi_gpu import MultiGpuLatency
from kvsim.latency.offload import op_offload_for
from kvsim.latency.rates import peak_rates
from kvsim.latency.roofline import DEFAULT_DEQUANT_FACTOR, GpuRates, RooflineLatency

PEAK_OVERHEAD_S = 0.004
"""The plain roofline's per-step overhead when the scenario sets none (``rates: peak``)."""


def _flash_attn(engine: EngineConfig) -> bool:
    """Whether the engine runs flash attention (a slot engine's ``flash_attn``; the
    paged engines always do)."""
    return engine.flash_attn if isinstance(engine, SlotEngineConfig) else True


def backend_rates(scenario: Any, gpu: Any = None) -> GpuRates | None:
    """The backend-aware rates of a scenario's card (or ``gpu``, another card of its box),
    model and weights (None for ``rates: peak``); a set ``step_overhead_s`` replaces the
    fitted overhead."""
    cfg, gpu = scenario.latency, gpu or scenario.gpu
    if cfg.rates == "peak":
        return None
    r = gpu_rates(gpu, scenario.model, scenario.weights,
                  backend=resolve_backend(cfg.backend, gpu),
                  flash_attn=_flash_attn(scenario.engine),
                  constants=load_constants(cfg.constants) if cfg.constants else None)
    return r if cfg.step_overhead_s is None else replace(r, overhead_s=cfg.step_overhead_s,
                                                          overhead_batch_s=None)


def _device_rates(scenario: Any, gpu: Any) -> GpuRates:
    """One card's rates in a box: backend-aware, or (``rates: peak``) the plain roofline's
    peak times the card's planning efficiencies."""
    r = backend_rates(scenario, gpu)
    if r is not None:
        return r
    step = scenario.latency.step_overhead_s
    return peak_rates(gpu, PEAK_OVERHEAD_S if step is None else step)


def bench_latency(scenario: Any, budget: Any | None = None) -> LatencyModel:
    """The roofline with a ``kvsim calibrate bench`` artifact's card and constants
    (``latency: {kind: calibrated, path}``): the card's fitted rates for the scenario's
    own model, weights and flash-attention setting."""
    art = load_bench_artifact(scenario.latency.path)
    rates = gpu_rates(art.device, scenario.model, scenario.weights, backend=art.backend,
                      flash_attn=_flash_attn(scenario.engine),
                      constants=art.constants)
    label = f"calibrated(llama-bench {scenario.latency.path})"
    return _roofline(scenario, budget, replace(rates, label=label), rates.overhead_s)


def make_latency_model(scenario: Any, budget: Any | None = None) -> LatencyModel:
    """The latency model a scenario asks for.

    ``budget`` (a :class:`kvsim.engines.memory.MemoryBudget`) gives the layer split for
    partial offload; without it every layer is assumed on the GPU.  A budget over several
    GPUs (``devices``) makes the roofline a box's (kvsim.latency.box: each GPU's share at
    its own rates, the link between them).  llama.cpp and
    Ollama behind a PCIe link also get op offload (kvsim.latency.offload): large
    ubatches run their host-resident layers on the GPU.  A ``jitter_cv`` (or
    ``jitter_prompt_cv``, ``jitter_run_cv``) above 0 wraps the model in its timing noise
    (kvsim.latency.jitter), seeded by ``jitter_seed`` or, unset, the scenario's seed; a
    roofline's ``speed_band`` (fast, slow) scales its steps to that end of its band first
    (:func:`at_band_end`).
    """
    cfg = scenario.latency
    model = _exact_model(scenario, budget)
    if cfg.kind == "roofline" and cfg.speed_band != "none":
        model = at_band_end(scenario, model)
    return with_jitter(model, cfg.jitter_cv, jitter_seed(scenario), cfg.prompt_cv,
                       cfg.jitter_run_cv)


def at_band_end(scenario: Any, model: LatencyModel) -> LatencyModel:
    """``model`` with its step times at the end of the speed band that
    ``latency.speed_band`` names (kvsim.latency.speed_band); InputError where the
    scenario's model has no band."""
    from kvsim.errors import InputError
    from kvsim.latency.speed_band import ScaledLatency, speed_band

    cfg = scenario.latency
    band = speed_band(scenario)
    if band is None:
        raise InputError("latency.speed_band", cfg.speed_band,
                         "none unless the roofline runs on fitted backend constants "
                         "(rates: backend) whose errors name its backend")
    return ScaledLatency(model, *band.factors(cfg.speed_band))


def jitter_seed(scenario: Any) -> int:
    """The seed of a scenario's timing noise: ``latency.jitter_seed``, else its seed."""
    cfg = scenario.latency
    return scenario.seed if cfg.jitter_seed is None else cfg.jitter_seed


def make_arrival_noise(scenario: Any) -> ArrivalNoise | None:
    """The scenario's request arrival delays (``latency.arrival_delay_s`` /
    ``arrival_jitter_s``, kvsim.latency.jitter.ArrivalNoise); None when on time."""
    cfg = scenario.latency
    return arrival_noise(cfg.arrival_delay_s, cfg.arrival_jitter_s, jitter_seed(scenario))


def box_model(scenario: Any, budget: Any, rates_of: Callable[[Any], GpuRates]
              ) -> MultiGpuLatency:
    """A box's latency model (kvsim.latency.box) with ``rates_of`` giving each card's
    rates: ``kvsim validate`` prices a several-GPU llama-bench test with its constants."""
    step = scenario.latency.step_overhead_s
    base = _roofline(scenario, budget, rates_of(scenario.gpu),
                     PEAK_OVERHEAD_S if step is None else step)
    return box_latency(scenario, budget, base, rates_of)


def _exact_model(scenario: Any, budget: Any | None) -> LatencyModel:
    """The scenario's latency model without timing noise."""
    cfg = scenario.latency
    if cfg.kind == "constant":
        return ConstantLatency(cfg.step_s, cfg.prefill_token_s, cfg.decode_token_s)
    if cfg.kind == "calibrated":
        if is_bench_artifact(cfg.path):  # a card's constants fitted from llama-bench output
            return bench_latency(scenario, budget)
        return make_calibrated(scenario, budget)
    base = _roofline(scenario, budget, backend_rates(scenario),
                     PEAK_OVERHEAD_S if cfg.step_overhead_s is None else cfg.step_overhead_s)
    if budget is not None and budget.devices:
        return box_latency(scenario, budget, base, lambda g: _device_rates(scenario, g))
    return base


def _roofline(scenario: Any, budget: Any | None, rates: GpuRates | None,
              overhead_s: float) -> RooflineLatency:
    """The roofline of a scenario's card, model, weights, cache types and layer split."""
    from kvsim.model.dtypes import cache_type
    from kvsim.model.geometry import kv_geometry
    from kvsim.model.weights import model_weights

    eng, cfg = scenario.engine, scenario.latency
    geom = kv_geometry(scenario.model, eng.cache_type_k, eng.cache_type_v)
    engine = engine_for(eng.preset)
    quant = cache_type(eng.cache_type_k).quantized or cache_type(eng.cache_type_v,
                                                                 role="v").quantized
    return RooflineLatency(
        gpu=scenario.gpu, host=scenario.host, model=scenario.model,
        geometry=engine.attention_geometry(eng, geom),
        weights=model_weights(scenario.model, scenario.weights),
        gpu_layers=None if budget is None else budget.gpu_layers,
        step_overhead_s=overhead_s, rates=rates,
        kv_dequant_factor=cfg.kv_dequant_factor if isinstance(cfg, RooflineConfig)
        else DEFAULT_DEQUANT_FACTOR,
        kv_quantized=quant, head_on_gpu=None if budget is None else budget.head_on_gpu,
        cpu_expert_layers=0 if budget is None else budget.cpu_expert_layers,
        op_offload=op_offload_for(scenario),
        graph_max_tokens=engine.graph_max_tokens(eng, scenario.gpu))
