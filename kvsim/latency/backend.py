"""Backend-aware sustained rates: spec sheet + backend + weight format -> :class:`GpuRates`.

Each of the roofline's five rates (linear, attention, weight bytes, KV bytes, overhead),
and a prefill's weight re-reads, comes from the card's spec sheet scaled by constants
fitted per backend (CUDA, ROCm, Vulkan, Metal, SYCL) and, where measured, per vendor on a
portable backend (``Vulkan:intel``) and per architecture class (``CUDA:ada``,
``Metal:apple-m2``…) — never per card.

NOTE: the constants live in ``hardware_profiles/speed/constants.yaml``, written by
``scripts/fit_speed.py`` from ``docs/reference/measurements``; this module only reads
them. They were fitted on llama.cpp measurements; other engines use them as the best
available estimate.
Design: docs/design/speed-model.md (the rate formulas, the fit and its errors).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from kvsim.config.catalog import data_root
from kvsim.config.files import read_yaml
from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import FrozenModel
from kvsim.errors import InputError
from kvsim.latency.dp4a import DP4A_UNPACK_SLOTS, UNQUANTIZED, dp4a_path
from kvsim.latency.expert_loop import loop_fields
from kvsim.latency.prompt_family import NO_INT8_MMA, fitted_pp_family, prompt_family
from kvsim.latency.rates import matmul_flops
from kvsim.latency.roofline import GpuRates

BACKENDS = ("CUDA", "ROCm", "Vulkan", "Metal", "SYCL")
Backend = Literal["CUDA", "ROCm", "Vulkan", "Metal", "SYCL"]
FORMAT_FAMILIES = ("f16", "f32", "q8_0", "q4_0", "kquant", "iquant", "mxfp4", "other")
_FAMILY = {"f32": "f32", "f16": "f16", "bf16": "f16", "q8_0": "q8_0", "q4_0": "q4_0",
           "q4_k_m": "kquant", "q4_k_s": "kquant", "q5_k_m": "kquant", "q6_k": "kquant",
           "iq4_xs": "iquant", "iq4_nl": "iquant", "mxfp4": "mxfp4", "mxfp4_moe": "mxfp4"}
_VENDOR_BACKEND = {"nvidia": "CUDA", "amd": "ROCm", "apple": "Metal", "intel": "Vulkan"}


def format_family(weight_format: str) -> str:
    """The family whose constants a weight format uses (``other``: AWQ, GPTQ, FP8…)."""
    return _FAMILY.get(weight_format.lower(), "other")


def resolve_backend(setting: str, gpu: GpuSpec) -> str:
    """A scenario's ``latency.backend`` for ``gpu``: as set, or ``auto``:
    :func:`default_backend`."""
    return default_backend(gpu) if setting == "auto" else setting


def default_backend(gpu: GpuSpec) -> str:
    """The backend a llama.cpp build uses on this device by default: CUDA on NVIDIA,
    ROCm (HIP) on AMD, Metal on Apple, Vulkan on Intel."""
    return _VENDOR_BACKEND.get(gpu.vendor.lower(), "Vulkan")


def arch_class(gpu: GpuSpec, backend: str) -> str:
    """``BACKEND:architecture`` (``CUDA:ada``); ``BACKEND:architecture-soc`` for a GPU that
    shares its memory and power with a CPU outside Apple's (``unified_memory``: the DGX
    Spark's GB10, Strix Halo, the Radeon 780M, Iris Xe): not a discrete card of its
    architecture (LPDDR/DDR, a package power budget), so it neither sets nor takes their
    class (Apple's classes are all SoCs already); the backend alone without an
    architecture."""
    soc = "-soc" if gpu.unified_memory and gpu.vendor.lower() != "apple" else ""
    return f"{backend}:{gpu.architecture}{soc}" if gpu.architecture else backend


def vendor_class(gpu: GpuSpec, backend: str) -> str:
    """``BACKEND:vendor`` (``Vulkan:intel``): a portable backend's driver differs by vendor."""
    return f"{backend}:{gpu.vendor.lower()}"


def class_scale(k: SpeedConstants, gpu: GpuSpec, backend: str) -> ClassScale:
    """The product of the vendor's and the architecture's scales on this backend (each 1
    where not fitted)."""
    v = k.classes.get(vendor_class(gpu, backend), ClassScale())
    a = k.classes.get(arch_class(gpu, backend), ClassScale())
    return ClassScale(pp_scale=v.pp_scale * a.pp_scale, bw_scale=v.bw_scale * a.bw_scale)


class BackendConstants(FrozenModel):
    """The fitted constants of one backend (all rates relative to the spec sheet)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    bw_eff: float = Field(gt=0, description="weight streaming: share of peak bandwidth")
    kv_eff: float = Field(gt=0, description="KV reads with flash attention: share of peak")
    kv_eff_no_fa: float = Field(gt=0, description="KV reads without flash attention")
    c_vec: float = Field(ge=0, description="linear layers: vector-ALU FLOPs per FLOP")
    c_mat: float = Field(ge=0, description="linear layers: matrix-unit FLOPs per FLOP")
    c_pow_pj: float = Field(0.0, ge=0, description="picojoules per FLOP at the board power "
                            "limit (sustained compute is power-bound; 0 or no board power: "
                            "no term)")
    attn_eff: float = Field(gt=0, description="attention FLOPs with flash attention")
    attn_eff_no_fa: float = Field(gt=0, description="attention FLOPs without it")
    attn_eff_rows: float = Field(0.3, gt=0, description="attention FLOPs of a step its "
                                 "per-row kernel runs (decode; ggml-cpu: fewer than 64 "
                                 "rows, ROW_KERNEL_ROWS), with or without flash attention")
    overhead_s: float = Field(ge=0)
    overhead_per_layer_s: float = Field(ge=0)
    launch_per_layer_s: float = Field(0.0, ge=0, description="CUDA: the extra per-layer "
                                      "time of a step launched kernel by kernel instead of "
                                      "replayed as a CUDA graph (cuda_graphs); ignored on "
                                      "other backends")
    pp_reread: float = Field(0.0, ge=0, description="prefill: the weights read again "
                             "per token of a many-token step, at peak bandwidth (a matmul "
                             "tile re-reads its weights for every tile of tokens; 0: none)")
    moe_eff: float = Field(1.0, gt=0, description="linear layers of MoE models: share of "
                           "the dense rate (experts are many small matmuls)")
    c_small: float = Field(0.0, ge=0, description="linear layers of a step of 2 to "
                           "SMALL_BATCH_TOKENS tokens (matrix-vector kernels): vector-ALU "
                           "FLOPs per FLOP, adding to the weight read; 0: no such regime")
    tile_tokens: float = Field(0.0, ge=0, description="a tiled matmul step's work per "
                               "128-token tile, in tokens of linear compute "
                               "(GpuRates.tile_tokens)")
    c_dp4a: float = Field(0.0, ge=0, description="linear layers of quantized weights on "
                          "a part whose kernels multiply with dp4a on the vector ALUs "
                          "(dp4a_path): the matrix term's weight against the sheet's "
                          "dp4a rate, in place of c_mat over the matrix rate; 0: not "
                          "fitted, c_mat + DP4A_UNPACK_SLOTS")


class ClassScale(FrozenModel):
    """An architecture class's departure from its backend (fitted where 2+ devices)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    pp_scale: float = Field(1.0, gt=0)
    bw_scale: float = Field(1.0, gt=0)


class SpeedConstants(FrozenModel):
    """Every backend's constants, the format factors and the class scales."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    backends: dict[str, BackendConstants]
    format_bw: dict[str, float] = Field(description="weight-streaming factor per family, "
                                        "or per 'BACKEND:family' where fitted apart")
    format_pp: dict[str, float] = Field(description="prefill rate factor per family, or per "
                                        "'BACKEND:family'")
    classes: dict[str, ClassScale] = Field(default_factory=dict)
    memory_bw: dict[str, float] = Field(default_factory=dict, description="bandwidth "
                                        "factor per memory kind (hbm, lpddr, ddr; gddr = 1)")
    fitted_on: str = ""
    errors: dict[str, dict[str, float]] = Field(default_factory=dict,
                                                description="leave-one-device-out errors")

    def format_factors(self, backend: str, family: str) -> tuple[float, float]:
        """(weight-streaming, prefill) factors of a format family on a backend: the
        backend's own where fitted, else (prefill) the backend's own of its
        ``PP_FALLBACK_ON`` family, else the shared ones, else (prefill) those of its
        ``PP_FALLBACK`` family, else 1 (kvsim.latency.prompt_family)."""
        bw = self.format_bw.get(f"{backend}:{family}", self.format_bw.get(family, 1.0))
        family = fitted_pp_family(self.format_pp, backend, family)
        pp = self.format_pp.get(f"{backend}:{family}", self.format_pp.get(family, 1.0))
        return bw, pp

    def with_backend(self, name: str, **fields: float) -> SpeedConstants:
        """These constants with ``fields`` of backend ``name`` replaced (starting from
        its fallback's where it has none of its own)."""
        c = self.backend(name).model_copy(update=fields)
        return self.model_copy(update={"backends": {**self.backends, name: c}})

    def backend(self, name: str) -> BackendConstants:
        if name in self.backends:
            return self.backends[name]
        if "default" in self.backends:
            return self.backends["default"]
        raise InputError("latency.backend", name, "one of " + ", ".join(self.backends))


def constants_path() -> Path:
    return data_root("hardware_profiles") / "speed" / "constants.yaml"


@functools.lru_cache(maxsize=8)
def load_constants(path: str | None = None) -> SpeedConstants:
    """The fitted constants (the shipped file unless ``path`` names another)."""
    p = Path(path) if path else constants_path()
    return SpeedConstants.model_validate(read_yaml(p, "latency.constants"))


MMQ_OPS_PER_UNIT_CLOCK = 2048.0
"""int8 ops per SM per clock of the ``mma.sync`` path llama.cpp's MMQ kernels use on a
GeForce or workstation part (the dense int8 rate of a TU10x/GA10x/AD10x/GB20x SM)."""
MMQ_OPS_PER_UNIT_CLOCK_MAX = 4096.0
"""The most ``mma.sync`` reaches per SM per clock: GA100's tensor cores (A100, A30, Orin)
run it at twice the GeForce rate, as their spec sheet's int8 rate says; Hopper's and
datacenter Blackwell's further doubling needs ``wgmma``/``tcgen05`` instructions, which
MMQ does not issue, so their spec rate above this is not used."""
_BEFORE_GRAPHS = {"volta": frozenset({"pascal", "maxwell", "kepler"}),
                  "ampere": frozenset({"pascal", "maxwell", "kepler", "volta", "turing"})}
"""ggml-cuda replays a step as a CUDA graph only for a one-token step (it disables
graphs when an ADD node's batch dimension exceeds 1; ggml/src/ggml-cuda/ggml-cuda.cu,
``check_node_graph_compatibility``; graphs since llama.cpp PR #6766, 2024-05), and only
on the architectures from ``since`` on: Volta and newer today, Ampere and newer in
builds before PR #25749 (2026-07); never Pascal and older."""


SMALL_BATCH_TOKENS = 8
"""The most columns (tokens of a step) llama.cpp's GPU backends multiply with their
matrix-vector kernels instead of tiled matmuls (GpuRates.small_flops_per_s):
ggml-cuda's ``MMVQ_MAX_BATCH_SIZE`` and ``MMVF_MAX_BATCH_SIZE`` (HIP builds share
them), ggml-vulkan's ``mul_mat_vec_max_cols``. ggml-cpu has no such switch (1)."""


def small_batch_tokens(backend: str) -> int:
    """:data:`SMALL_BATCH_TOKENS` on a GPU backend, 1 on CPU. NOTE: the one switch of
    both GPU kernel regimes: a backend with matrix-vector kernels (more than 1) also
    runs tiled matmuls that pay a per-tile cost (GpuRates.tile_tokens: MMQ and its
    ports); ggml-cpu's row-by-row dot products have neither."""
    return 1 if backend == "CPU" else SMALL_BATCH_TOKENS


def per_expert_tiles(backend: str) -> bool:
    """Whether a backend's tiled kernels run an MoE layer expert by expert, each paying
    its own tiles (GpuRates.expert_tiles): CUDA's MMQ with expert ids. ROCm sends batches
    of 64+ tokens to hipBLAS (``ggml_cuda_should_use_mmq``); the others are not measured."""
    return backend == "CUDA"


ROW_KERNEL_ROWS = {"CPU": 64}
"""Steps of fewer tokens than this run attention one query row at a time, as a decode
does on every backend: ggml-cpu's flash attention takes its tiled path
(``ggml_compute_forward_flash_attn_ext_tiled``, 64-cell KV tiles, a GEMM per tile) only
for micro-batches of 64 rows or more, and ``flash_attn_ext_f16_one_chunk`` (a dot
product, an ``expf`` and a V update per query-key pair) below; measured here on the tiny
GGUF (-t 1, d 1024): 32 rows 2.4 ms a token, 256 rows 0.92.  Elsewhere 1: only
decode-only steps (FA vec kernels)."""


def mmq_ops_per_unit_clock(gpu: GpuSpec) -> float:
    """int8 ``mma.sync`` ops per SM per clock: the spec sheet's dense int8 rate over
    SMs × boost clock, between :data:`MMQ_OPS_PER_UNIT_CLOCK` and
    :data:`MMQ_OPS_PER_UNIT_CLOCK_MAX` (the GeForce rate where the sheet gives none)."""
    if not (gpu.int8_tensor_ops and gpu.compute_units and gpu.boost_clock_hz):
        return MMQ_OPS_PER_UNIT_CLOCK
    spec = gpu.int8_tensor_ops / (gpu.compute_units * gpu.boost_clock_hz)
    return min(max(spec, MMQ_OPS_PER_UNIT_CLOCK), MMQ_OPS_PER_UNIT_CLOCK_MAX)


def cuda_graphs(gpu: GpuSpec, backend: str, since: str = "volta") -> bool:
    """Whether one-token steps replay as CUDA graphs on a build that captures them from
    the ``since`` architecture on (:data:`_BEFORE_GRAPHS`)."""
    return backend == "CUDA" and gpu.architecture not in _BEFORE_GRAPHS[since]


def matrix_rate(gpu: GpuSpec, backend: str, quantized: bool) -> float:
    """The matrix-unit FLOP/s the backend's matmul kernels run at (module docstring)."""
    int8 = gpu.int8_tensor_ops
    if backend == "CUDA" and quantized and gpu.architecture not in NO_INT8_MMA \
            and gpu.compute_units and gpu.boost_clock_hz:
        return gpu.compute_units * gpu.boost_clock_hz * mmq_ops_per_unit_clock(gpu)
    if backend in ("CUDA", "ROCm") and quantized and int8 \
            and gpu.architecture not in NO_INT8_MMA:
        return int8
    return matmul_flops(gpu, gpu.fp16_tensor_flops)


SM_ISSUE_FLOPS_PER_CLOCK = 256.0
"""An NVIDIA SM's vector issue limit: four warp schedulers × 32 lanes, each lane's FMA
two FLOPs.  The dequantisation and activation work of a quantized matmul is integer and
FP32 instructions mixed, which every SM since Turing issues at this rate whether its
spec sheet counts 64 FP32 lanes (Turing, GA100: the other 64 are INT32) or 128 (GA10x,
Ada, Hopper, Blackwell: dual FP32 datapaths)."""


def vector_rate(gpu: GpuSpec) -> float:
    """Vector FLOP/s: on NVIDIA parts the SM issue rate (:data:`SM_ISSUE_FLOPS_PER_CLOCK`
    × SMs × boost clock), elsewhere the spec sheet's FP32 rate; a profile with neither
    is taken as a part without matrix units (its FP16 rate is its vector rate)."""
    if gpu.vendor.lower() == "nvidia" and gpu.compute_units and gpu.boost_clock_hz:
        return gpu.compute_units * gpu.boost_clock_hz * SM_ISSUE_FLOPS_PER_CLOCK
    return gpu.fp32_flops or gpu.fp16_tensor_flops


def memory_kind(gpu: GpuSpec) -> str:
    """``hbm``, ``gddr``, ``lpddr`` or ``ddr`` from the profile's memory type ("" unknown)."""
    t = gpu.memory_type.lower()
    for kind in ("hbm", "gddr", "lpddr", "ddr"):
        if t.startswith(kind):
            return kind
    return ""


def board_power_w(gpu: GpuSpec) -> float | None:
    """The board power limit in watts (the largest figure of a range such as a laptop
    part's "80-150"); None when the profile gives none."""
    nums = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", gpu.tdp_w or "")]
    return max(nums) if nums else None


def compute_seconds_per_flop(c: BackendConstants, vec: float, mat: float,
                             power_w: float | None, c_mat: float | None = None) -> float:
    """``c_vec / vector rate + c_mat / matrix rate + c_pow / board power`` (``c_mat``:
    another weight of the matrix term, as the dp4a path's ``c_dp4a``)."""
    return c.c_vec / vec + (c.c_mat if c_mat is None else c_mat) / mat \
        + (c.c_pow_pj * 1e-12 / power_w if power_w else 0.0)


def linear_seconds_per_flop(c: BackendConstants, gpu: GpuSpec, backend: str,
                            family: str, vec: float, power_w: float | None) -> float:
    """Seconds a linear-layer FLOP of ``family`` weights costs
    (:func:`compute_seconds_per_flop`): on the dp4a path its matrix term is ``c_dp4a``
    (fitted, else ``c_mat`` + :data:`DP4A_UNPACK_SLOTS`) over the sheet's dp4a rate."""
    if dp4a_path(gpu, backend, family):
        return compute_seconds_per_flop(c, vec, float(gpu.int8_tensor_ops), power_w,
                                        dp4a_weight(c))
    return compute_seconds_per_flop(c, vec, matrix_rate(gpu, backend,
                                                        family not in UNQUANTIZED), power_w)


def dp4a_weight(c: BackendConstants) -> float:
    """The dp4a path's matrix-term weight: the fitted ``c_dp4a``, else its default."""
    return c.c_dp4a or c.c_mat + DP4A_UNPACK_SLOTS


def gpu_rates(gpu: GpuSpec, model: ModelSpec, weight_format: str, *, backend: str,
              flash_attn: bool = True, constants: SpeedConstants | None = None,
              graphs: bool | None = None, cublas_prompts: bool = False) -> GpuRates:
    """The five sustained rates of ``model`` in ``weight_format`` on ``gpu`` (docstring);
    ``graphs``: whether one-token steps replay as CUDA graphs (None: today's llama.cpp,
    :func:`cuda_graphs`); ``cublas_prompts``: a build from before MMQ by default
    (:func:`prompt_family`)."""
    k = constants or load_constants()
    c = k.backend(backend)
    scale = class_scale(k, gpu, backend)
    fam = format_family(weight_format)
    f_bw = k.format_factors(backend, fam)[0]
    f_pp = k.format_factors(backend, prompt_family(gpu, backend, fam, cublas_prompts))[1]
    vec, moe = vector_rate(gpu), (c.moe_eff if model.num_experts else 1.0)
    power = board_power_w(gpu)
    lin = scale.pp_scale * f_pp * moe / linear_seconds_per_flop(
        c, gpu, backend, fam, vec, power)
    # NOTE: attention multiplies 16-bit Q, K, V: an unquantized matmul's rate
    att16 = 1.0 / compute_seconds_per_flop(c, vec, matrix_rate(gpu, backend, False), power)
    att = att16 * (c.attn_eff if flash_attn else c.attn_eff_no_fa)
    rows = att16 * c.attn_eff_rows
    bw = gpu.memory_bandwidth_bytes_per_s * k.memory_bw.get(memory_kind(gpu), 1.0)
    w_bw = bw * c.bw_eff * scale.bw_scale * f_bw
    kv_bw = bw * (c.kv_eff if flash_attn else c.kv_eff_no_fa)
    overhead = c.overhead_s + c.overhead_per_layer_s * model.num_layers
    launched = overhead + c.launch_per_layer_s * model.num_layers if backend == "CUDA" \
        else overhead
    graphs = cuda_graphs(gpu, backend) if graphs is None else graphs
    small = small_batch_tokens(backend)
    return GpuRates(lin, att, w_bw, kv_bw, overhead if graphs else launched,
                    label=f"roofline({gpu.name}, {model.name}, {weight_format}, {backend} fit)",
                    overhead_batch_s=launched, decode_adds=True,
                    small_flops_per_s=vec / c.c_small if c.c_small else None,
                    small_tokens=small,
                    tile_tokens=c.tile_tokens if small > 1 else 0.0,
                    attention_rows_flops_per_s=rows,
                    rows_below=ROW_KERNEL_ROWS.get(backend, 1),
                    reread_s_per_byte_token=c.pp_reread / bw,
                    expert_tiles=per_expert_tiles(backend),
                    **loop_fields(gpu, backend, fam, model))
