"""The sustained rates one engine step runs at: what a latency model divides a step's
work by (kvsim.latency.roofline prices with them; kvsim.latency.backend derives them).

NOTE: a frozen value type; None fields fall back to the field named in their docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.config.specs import GpuSpec
from kvsim.latency.expert_loop import EXPERT_MATMULS

TILE_TOKENS_MAX = 128
"""The widest tile of tokens llama.cpp's MMQ kernels run (``mmq_x`` up to 128): a step
pays its per-tile work once per 128 tokens (GpuRates.tile_tokens)."""

SLOW_FP16 = 0.5
"""A part whose 16-bit rate is below this share of its FP32 rate has no fast FP16 (GP102,
GP104, GP106 Pascal: 1/64 of FP32): ggml runs its GEMMs and attention in FP32 there
(ggml-cuda ``common.cuh`` ``fast_fp16_hardware_available``: not compute capability 6.1;
``mmq.cu`` ``ggml_cuda_should_use_mmq``: dp4a MMQ on the vector ALUs, no tensor cores)."""


def matmul_flops(gpu: GpuSpec, fp16_flops: float) -> float:
    """The FLOP/s a GEMM or attention runs at: ``fp16_flops`` (the spec sheet's 16-bit
    rate), or the FP32 rate on a part without fast FP16 (:data:`SLOW_FP16`).

    NOTE: the P40's published llama 7B Q4_0 pp512 (ggml-org/llama.cpp PR #4766, 912 t/s)
    is ~12 TFLOP/s of its linear layers: its FP32 rate (11.8), not its dp4a int8 rate (47)."""
    fp32 = gpu.fp32_flops or 0.0
    return fp32 if fp16_flops < SLOW_FP16 * fp32 else fp16_flops


@dataclass(frozen=True)
class GpuRates:
    """The sustained rates one step runs at on the GPU: linear-layer FLOP/s, attention
    FLOP/s, weight-streaming and KV-reading bytes/s, and the fixed per-step time.

    The plain roofline uses one FLOP rate and one bandwidth (the card's peaks times its
    planning efficiencies); :mod:`kvsim.latency.backend` derives all of them from the
    spec sheet, the backend and the weight format, with fitted constants."""

    linear_flops_per_s: float
    attention_flops_per_s: float
    weight_bytes_per_s: float
    kv_bytes_per_s: float
    overhead_s: float
    label: str = ""
    overhead_batch_s: float | None = None
    """The fixed time of a step of more tokens than the engine replays as one captured
    graph (``RooflineLatency``'s ``graph_max_tokens``); None: ``overhead_s``."""
    decode_adds: bool = False
    """A decode-only step's GPU compute and memory time add instead of overlapping (the
    backend model: matrix-vector kernels near their ridge point, docs/design/
    speed-model.md); prefill and mixed steps take the larger either way."""
    attention_rows_flops_per_s: float | None = None
    """Attention FLOP/s of a step run by the per-row kernel: a decode-only step, or one of
    fewer than ``rows_below`` tokens (kvsim.latency.backend.ROW_KERNEL_ROWS); None:
    ``attention_flops_per_s``."""
    rows_below: int = 1
    small_flops_per_s: float | None = None
    """Linear-layer FLOP/s of a step of 2 to ``small_tokens`` tokens, prefill or
    decode: the matrix-vector kernels every llama.cpp GPU backend runs for so few
    columns (ggml-cuda ``MMVQ_MAX_BATCH_SIZE`` / ``MMVF_MAX_BATCH_SIZE``, 8: ``mmvq.cu``,
    ``mmvf.cu``; Vulkan's ``mul_mat_vec`` up to 8 columns; Metal's ``mul_mv_ext``)
    dequantise on the vector ALUs, once per column, and their time adds to the weight
    read as a decode's does (``decode_adds``); None: no such regime. A one-token step
    keeps ``linear_flops_per_s``: its one column's work hides in the weight read."""
    small_tokens: int = 0
    tile_tokens: float = 0.0
    """A step the tiled matmul kernels run (more tokens than ``small_tokens``, 2 or more)
    pays this many tokens' more linear compute per :data:`TILE_TOKENS_MAX` tokens or
    part of them: work done once per tile of tokens whatever its width (MMQ loads and
    dequantises each weight tile once per tile of up to 128 tokens, so a 16-token step
    pays for a whole tile's set-up with 16 tokens' work); 0: none."""
    reread_s_per_byte_token: float = 0.0
    """Prefill (any step that is not decode-only): seconds per weight byte and token of
    the step spent reading the weights again, beyond the one pass ``weight_bytes_per_s``
    prices — a tiled matmul reads its weight tile once per tile of tokens, and what the
    cache does not keep comes from memory again (kvsim.latency.backend: the fitted share
    re-read per token over peak bandwidth). It adds to the step's compute (the tiles
    wait for it); 0: no re-reads."""
    expert_tiles: bool = False
    """A tiled step's routed experts each pay ``tile_tokens`` per tile of their own
    tokens (:func:`expert_tile_excess`): CUDA's MMQ with expert ids; False: the dense
    factor for every FLOP."""
    expert_call_s: float = 0.0
    """Seconds each used expert's call costs where a step of ``expert_loop_tokens`` or
    more loops over the experts on the host (:func:`expert_loop_s`,
    kvsim.latency.expert_loop); 0: no loop."""
    expert_loop_tokens: int = 0
    """The smallest step (tokens) that takes that loop; 0: none."""


def linear_terms(rates: GpuRates, tokens: float) -> tuple[float, float, bool]:
    """(linear FLOP/s, time factor, matrix-vector step) of a step of ``tokens`` tokens.

    On the matrix-vector path (2 to ``small_tokens`` tokens, GpuRates.small_flops_per_s)
    the factor is ``(tokens - 1) / tokens``: the first column's work hides in the weight
    read, as a one-token step's does, and each further column adds its own; on the tiled
    path it is ``1 + tile_tokens * ceil(tokens / TILE_TOKENS_MAX) / tokens``; else 1.
    NOTE: a per-step hot path (RooflineLatency); the numpy decode path uses the same."""
    if rates.small_flops_per_s is not None and 1 < tokens <= rates.small_tokens:
        return rates.small_flops_per_s, (tokens - 1.0) / tokens, True
    if rates.tile_tokens and tokens > max(rates.small_tokens, 1):
        return rates.linear_flops_per_s, \
            1.0 + rates.tile_tokens * math.ceil(tokens / TILE_TOKENS_MAX) / tokens, False
    return rates.linear_flops_per_s, 1.0, False


def experts_used_fraction(tokens: int, pick_fraction: float) -> float:
    """Expected share of an MoE layer's experts that ``tokens`` tokens route to, each
    token picking ``k`` of ``E`` (``pick_fraction = k/E``): ``1 − (1 − k/E)^tokens``.
    Uniform routing is the planning assumption; real routers are skewed, which lowers
    the share only for small ubatches."""
    if pick_fraction <= 0.0:
        return 0.0
    return 1.0 - (1.0 - pick_fraction) ** tokens


def expert_tile_excess(rates: GpuRates, tokens: float, pick: float) -> float:
    """What a tiled step's routed-expert FLOPs cost beyond :func:`linear_terms`' factor,
    as a factor on them: 0 unless the step is tiled and the model routes (``pick = k/E``).

    The tiled kernels run an MoE layer expert by expert (ggml-cuda's MMQ with expert ids),
    so every used expert pays ``tile_tokens`` per tile of *its own* tokens: a step of
    ``t`` tokens gives each of the ``E · (1 − (1 − k/E)^t)`` experts it reaches
    ``t_e = t · k / used`` tokens on average, and its expert FLOPs take the factor
    ``1 + tile_tokens · ⌈t_e / 128⌉ / t_e`` where the dense ones take ``t``'s. A
    512-token micro-batch of a 32-expert top-4 model gives each expert 64 tokens; a
    64-token one 8 (docs/design/speed-model.md, "Experts tile their own tokens").
    NOTE: no new constant: the dense tiles' ``tile_tokens``. Prompt steps only
    (:func:`expert_tile_s`)."""
    if not rates.expert_tiles or not rates.tile_tokens or pick <= 0.0 \
            or tokens <= max(rates.small_tokens, 1):
        return 0.0
    per = tokens * pick / experts_used_fraction(int(tokens), pick)
    return rates.tile_tokens * (math.ceil(per / TILE_TOKENS_MAX) / per
                                - math.ceil(tokens / TILE_TOKENS_MAX) / tokens)


def expert_tile_s(rates: GpuRates, tokens: float, pick: float, expert_flops: float,
                  decode: bool) -> float:
    """Seconds a prompt step's routed-expert FLOPs (``expert_flops``, of ``tokens``
    tokens picking ``pick = k/E``) spend on their own tiles beyond the dense factor
    (:func:`expert_tile_excess`, at the tiled path's rate); 0 for a dense model and for
    a decode-only step (measured batched decode pays none)."""
    x = expert_tile_excess(rates, tokens, pick) if expert_flops and not decode else 0.0
    return expert_flops * x / rates.linear_flops_per_s if x else 0.0


def expert_loop_s(rates: GpuRates, tokens: float, pick: float, layer_experts: float) -> float:
    """Seconds a step of ``tokens`` tokens spends in the host's loop over the experts
    (kvsim.latency.expert_loop): ``expert_call_s`` for each expert product
    (``EXPERT_MATMULS`` a layer) of the ``layer_experts`` (MoE layers times experts, on
    this GPU) that its tokens reach (``pick = k/E``); 0 below ``expert_loop_tokens`` or
    where the rates have no loop. Prompt and decode steps alike: the kernel choice goes
    by the step's tokens.
    NOTE: added to the step's time last, on every path (per step and stretch), so a part
    without the loop keeps its floats."""
    if not rates.expert_loop_tokens or tokens < rates.expert_loop_tokens or pick <= 0.0:
        return 0.0
    return rates.expert_call_s * EXPERT_MATMULS * layer_experts \
        * experts_used_fraction(int(tokens), pick)


def times_add(rates: GpuRates, tokens: float, decode: bool) -> bool:
    """Whether a step's GPU compute and memory time add (a decode-only step, or a step
    the matrix-vector kernels run, where ``decode_adds``) rather than overlap."""
    return rates.decode_adds and (decode or linear_terms(rates, tokens)[2])


def peak_rates(gpu: GpuSpec, overhead_s: float) -> GpuRates:
    """The plain roofline's rates (``latency: {rates: peak}``): one FLOP rate and one
    bandwidth, the card's peaks times its planning efficiencies."""
    flops = matmul_flops(gpu, gpu.fp16_fp32acc_tensor_flops) * gpu.compute_efficiency
    bw = gpu.memory_bandwidth_bytes_per_s * gpu.bandwidth_efficiency
    return GpuRates(flops, flops, bw, bw, overhead_s)
