"""Build the scenario's latency model (roofline, constant; calibrated when present)."""

from __future__ import annotations

import importlib
from typing import Any

from kvsim.latency.base import LatencyModel
from kvsim.latency.constant import ConstantLatency
from kvsim.latency.offload import op_offload_for
from kvsim.latency.roofline import DEFAULT_DEQUANT_FACTOR, RooflineLatency


def make_latency_model(scenario: Any, budget: Any | None = None) -> LatencyModel:
    """The latency model a scenario asks for.

    ``budget`` (a :class:`kvsim.model.budget.MemoryBudget`) gives the layer split for
    partial offload; without it every layer is assumed on the GPU.  llama.cpp and
    Ollama behind a PCIe link also get op offload (kvsim.latency.offload): large
    ubatches run their host-resident layers on the GPU.
    """
    cfg = scenario.latency
    if cfg.kind == "constant":
        return ConstantLatency(cfg.step_s, cfg.prefill_token_s, cfg.decode_token_s)
    if cfg.kind == "calibrated":
        mod = importlib.import_module("kvsim.latency.calibrated")
        return mod.make_calibrated(scenario, budget)  # written by the calibration issue
    from kvsim.model.dtypes import cache_type
    from kvsim.model.geometry import kv_geometry
    from kvsim.model.weights import model_weights

    eng = scenario.engine
    geom = kv_geometry(scenario.model, eng.cache_type_k, eng.cache_type_v)
    quant = cache_type(eng.cache_type_k).quantized or cache_type(eng.cache_type_v,
                                                                 role="v").quantized
    return RooflineLatency(
        gpu=scenario.gpu, host=scenario.host, model=scenario.model, geometry=geom,
        weights=model_weights(scenario.model, scenario.weights),
        gpu_layers=None if budget is None else budget.gpu_layers,
        step_overhead_s=cfg.step_overhead_s,
        kv_dequant_factor=getattr(cfg, "kv_dequant_factor", DEFAULT_DEQUANT_FACTOR),
        kv_quantized=quant, head_on_gpu=None if budget is None else budget.head_on_gpu,
        cpu_expert_layers=0 if budget is None else budget.cpu_expert_layers,
        op_offload=op_offload_for(scenario))
