"""Which format family's prefill factor a prompt step takes: the kernel a build runs
for the weights on the part (Pascal's dp4a path, CUDA's int8 MMQ) and, where the
constants fitted no factor for that family, the family whose factor stands in.

kvsim.latency.backend applies both (``gpu_rates``, ``SpeedConstants.format_factors``).
Design: docs/design/speed-model.md ("A k-quant prompt on today's CUDA", "Pascal: dp4a").
"""

from __future__ import annotations

from collections.abc import Mapping

from kvsim.config.specs import GpuSpec
from kvsim.latency.dp4a import dp4a_path, pp_family

PP_FALLBACK = {"iquant": "q4_0"}
"""A family without a fitted prefill factor of its own takes this family's: ggml-cuda's
MMQ loads IQ4_NL and IQ4_XS tiles as 4-bit values, expands them to int8 through their
lookup table, and multiplies them with the int8 product the legacy quants use
(``mmq.cuh``: ``mmq_type_traits`` of both types use ``vec_dot_q8_0_q8_1_mma``): Q4_0's
loads and product, not Q8_0's twice as many bytes a tile."""
PP_FALLBACK_ON = {"Metal": {"kquant": "q4_0"}}
"""Per backend, a family whose prefill factor that backend has not fitted takes the
backend's own factor of this family, ahead of the shared one. ggml-metal's
``kernel_mul_mm`` dequantizes every format's weight tile to 16 bits in threadgroup memory
and multiplies it with simdgroup matrices on the same ALUs, so the format costs little of
a prompt there (Metal's fitted q4_0, q8_0 and f16 factors are 0.79, 0.82 and 0.96) and a
4-bit k-quant's prompt runs as Q4_0's; the shared k-quant factor comes from CUDA's MMQ,
whose k-quant dot products unpack sub-block scales in the inner loop. No fitted row is a
Metal k-quant prompt: the rule was chosen on held-out rows (docs/validation.md, "Held-out
community rows")."""
NO_INT8_MMA = frozenset({"pascal", "volta"})
"""Architectures whose CUDA parts have no int8 matrix units (ggml-cuda's
``turing_mma_available`` is false): MMQ's int8 ``mma`` product is not theirs."""
MMQ_PP_FAMILY = {"kquant": "q4_0"}
"""On CUDA parts with int8 tensor cores, the family whose prefill factor a quantized
family takes in today's builds: since llama.cpp PR #8075 (2024-06, "CUDA: use MMQ instead
of cuBLAS by default") a prompt's quantized matmuls run MMQ, which loads every format's
tile as int8 for one ``mma`` product, so a 4-bit k-quant costs about Q4_0's. The fitted
k-quant factor comes from rows of May 2024 builds, which dequantized to FP16 for cuBLAS
(their ``LLAMA_CUBLAS`` builds: ``cublas_prompts``); held-out rows of 2025-2026 builds
ran 24-30 % faster than it priced (docs/validation.md, "The k-quant prompt on CUDA")."""
def prompt_family(gpu: GpuSpec, backend: str, family: str, cublas: bool = False) -> str:
    """The family whose prefill factor a step of ``family`` weights takes: Pascal's dp4a
    path (kvsim.latency.dp4a.pp_family), else :data:`MMQ_PP_FAMILY` on a CUDA part with
    int8 tensor cores unless the build predates MMQ by default (``cublas``), else
    ``family``."""
    if dp4a_path(gpu, backend, family):
        return pp_family(gpu, backend, family)
    if backend == "CUDA" and not cublas and gpu.architecture not in NO_INT8_MMA:
        return MMQ_PP_FAMILY.get(family, family)
    return family



def fitted_pp_family(format_pp: Mapping[str, float], backend: str, family: str) -> str:
    """The family whose fitted prefill factor stands in for ``family`` on ``backend``
    (``format_pp``: the fitted factors, keyed ``family`` and ``backend:family``): its
    own where fitted, else the backend's own factor of its :data:`PP_FALLBACK_ON` family,
    else the shared one, else its :data:`PP_FALLBACK` family."""
    if f"{backend}:{family}" in format_pp:
        return family
    own = PP_FALLBACK_ON.get(backend, {}).get(family)
    if f"{backend}:{own}" in format_pp:
        return str(own)
    return family if family in format_pp else PP_FALLBACK.get(family, family)
