"""Backend-aware sustained rates: spec sheet + backend + weight format -> :class:`GpuRates`.

A step's time is the roofline of :mod:`kvsim.latency.roofline`, but each of its five
rates comes from the card's spec sheet scaled by constants fitted per *backend*
(CUDA, ROCm, Vulkan, Metal, SYCL) and, where the measurements allow, per
*architecture class* (``CUDA:ada``, ``Metal:apple-m2``…) — never per card:

- linear layers: ``1 / R = c_vec / fp32_flops + c_mat / matrix_rate``, times the weight
  format's prefill factor.  Two resources a quantized matmul really uses: the vector
  ALUs (dequantisation, activation quantisation, norms) and the matrix units.  The
  matrix rate is the one the backend's kernels use: on CUDA, quantized weights run
  llama.cpp's MMQ on int8 tensor cores (Turing and newer) and F16 weights run cuBLAS
  at the FP16-accumulate rate; Volta and Pascal dequantize to FP16 for cuBLAS; ROCm
  uses int8 matrix cores where the card has them; Vulkan, Metal and SYCL multiply in
  FP16 (``fp16_tensor_flops``: the vector FP16 rate on parts without matrix units);
- attention FLOPs: the FP16 matrix rate through the same two-resource form, times an
  attention efficiency (flash attention on or off);
- weights: ``memory_bandwidth × bw_eff × format factor`` (k-quants and legacy quants
  stream at different shares of peak);
- KV reads: ``memory_bandwidth × kv_eff`` (flash attention on or off);
- overhead per step: ``overhead_s + overhead_per_layer_s × layers`` (kernel launches
  and synchronisation grow with the graph).

NOTE: the constants live in ``hardware_profiles/speed/constants.yaml``, written by
``scripts/fit_speed.py`` from ``shared/measurements``; this module only reads them.
Constants were fitted on llama.cpp measurements; other engines use them as the best
available estimate (their kernels differ: calibrate to pin a card).
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from kvsim.config.files import read_yaml
from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import FrozenModel
from kvsim.errors import InputError
from kvsim.latency.roofline import GpuRates

BACKENDS = ("CUDA", "ROCm", "Vulkan", "Metal", "SYCL")
Backend = Literal["CUDA", "ROCm", "Vulkan", "Metal", "SYCL"]
FORMAT_FAMILIES = ("f16", "q8_0", "q4_0", "kquant", "iquant", "mxfp4", "other")
_FAMILY = {"f16": "f16", "bf16": "f16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_k_m": "kquant",
           "q5_k_m": "kquant", "q6_k": "kquant", "iq4_xs": "iquant", "mxfp4": "mxfp4",
           "mxfp4_moe": "mxfp4"}
_NO_INT8_MMA = frozenset({"pascal", "volta"})
_VENDOR_BACKEND = {"nvidia": "CUDA", "amd": "ROCm", "apple": "Metal", "intel": "Vulkan"}


def format_family(weight_format: str) -> str:
    """The family whose constants a weight format uses (``other``: AWQ, GPTQ, FP8…)."""
    return _FAMILY.get(weight_format.lower(), "other")


def default_backend(gpu: GpuSpec) -> str:
    """The backend a llama.cpp build uses on this device by default: CUDA on NVIDIA,
    ROCm (HIP) on AMD, Metal on Apple, Vulkan on Intel."""
    return _VENDOR_BACKEND.get(gpu.vendor.lower(), "Vulkan")


def arch_class(gpu: GpuSpec, backend: str) -> str:
    """``BACKEND:architecture`` (``CUDA:ada``); the backend alone without an architecture."""
    return f"{backend}:{gpu.architecture}" if gpu.architecture else backend


class BackendConstants(FrozenModel):
    """The fitted constants of one backend (all rates relative to the spec sheet)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    bw_eff: float = Field(gt=0, description="weight streaming: share of peak bandwidth")
    kv_eff: float = Field(gt=0, description="KV reads with flash attention: share of peak")
    kv_eff_no_fa: float = Field(gt=0, description="KV reads without flash attention")
    c_vec: float = Field(ge=0, description="linear layers: vector-ALU FLOPs per FLOP")
    c_mat: float = Field(ge=0, description="linear layers: matrix-unit FLOPs per FLOP")
    attn_eff: float = Field(gt=0, description="attention FLOPs with flash attention")
    attn_eff_no_fa: float = Field(gt=0, description="attention FLOPs without it")
    overhead_s: float = Field(ge=0)
    overhead_per_layer_s: float = Field(ge=0)


class ClassScale(FrozenModel):
    """An architecture class's departure from its backend (fitted where 2+ devices)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    pp_scale: float = Field(1.0, gt=0)
    bw_scale: float = Field(1.0, gt=0)


class SpeedConstants(FrozenModel):
    """Every backend's constants, the format factors and the class scales."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    backends: dict[str, BackendConstants]
    format_bw: dict[str, float] = Field(description="weight-streaming factor per family")
    format_pp: dict[str, float] = Field(description="prefill rate factor per family")
    classes: dict[str, ClassScale] = Field(default_factory=dict)
    fitted_on: str = ""
    errors: dict[str, dict[str, float]] = Field(default_factory=dict,
                                                description="leave-one-device-out errors")

    def backend(self, name: str) -> BackendConstants:
        if name in self.backends:
            return self.backends[name]
        if "default" in self.backends:
            return self.backends["default"]
        raise InputError("latency.backend", name, "one of " + ", ".join(self.backends))


def constants_path() -> Path:
    return Path(str(resources.files("kvsim.hardware_profiles"))) / "speed" / "constants.yaml"


@functools.lru_cache(maxsize=8)
def load_constants(path: str | None = None) -> SpeedConstants:
    """The fitted constants (the shipped file unless ``path`` names another)."""
    p = Path(path) if path else constants_path()
    return SpeedConstants.model_validate(read_yaml(p, "latency.constants"))


def matrix_rate(gpu: GpuSpec, backend: str, quantized: bool) -> float:
    """The matrix-unit FLOP/s the backend's matmul kernels run at (module docstring)."""
    int8 = gpu.int8_tensor_ops
    if backend in ("CUDA", "ROCm") and quantized and int8 \
            and gpu.architecture not in _NO_INT8_MMA:
        return int8
    return gpu.fp16_tensor_flops


def vector_rate(gpu: GpuSpec) -> float:
    """Vector FP32 FLOP/s; a profile without it is taken as a part without matrix units
    (its FP16 rate is its vector rate)."""
    return gpu.fp32_flops or gpu.fp16_tensor_flops


def gpu_rates(gpu: GpuSpec, model: ModelSpec, weight_format: str, *, backend: str,
              flash_attn: bool = True, constants: SpeedConstants | None = None) -> GpuRates:
    """The five sustained rates of ``model`` in ``weight_format`` on ``gpu`` (docstring)."""
    k = constants or load_constants()
    c = k.backend(backend)
    scale = k.classes.get(arch_class(gpu, backend), ClassScale())
    fam = format_family(weight_format)
    vec = vector_rate(gpu)
    quantized = fam not in ("f16",)
    lin = scale.pp_scale * k.format_pp.get(fam, 1.0) / (
        c.c_vec / vec + c.c_mat / matrix_rate(gpu, backend, quantized))
    att16 = 1.0 / (c.c_vec / vec + c.c_mat / gpu.fp16_tensor_flops)
    att = att16 * (c.attn_eff if flash_attn else c.attn_eff_no_fa)
    bw = gpu.memory_bandwidth_bytes_per_s
    w_bw = bw * c.bw_eff * scale.bw_scale * k.format_bw.get(fam, 1.0)
    kv_bw = bw * (c.kv_eff if flash_attn else c.kv_eff_no_fa)
    overhead = c.overhead_s + c.overhead_per_layer_s * model.num_layers
    return GpuRates(lin, att, w_bw, kv_bw, overhead,
                    label=f"backend({gpu.name}, {backend}, {model.name}, {weight_format})")
