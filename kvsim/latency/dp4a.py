"""Pascal's dp4a path: which parts multiply quantized weights with ``dp4a`` on their
vector ALUs, and what that changes in their price (kvsim.latency.backend applies it).

Design: docs/design/speed-model.md, "Pascal: dp4a on the vector ALUs".
"""

from __future__ import annotations

from kvsim.config.specs import GpuSpec

UNQUANTIZED = frozenset({"f16", "f32"})
"""Format families whose weights are floats, not quantized blocks."""

DP4A_UNPACK_SLOTS = 1.5
"""Integer instructions MMQ's dp4a inner loop issues per dp4a beside it, on the same
vector ALUs: per 32-bit word of 4-bit weights a shift and two masks unpack the eight
nibbles for two dp4a (ggml-cuda ``vecdotq.cuh``, ``vec_dot_q4_0_q8_1_impl``). A tensor
core's product overlaps such work; a dp4a's cannot. The default of an unfitted
``c_dp4a`` is ``c_mat`` plus this (docs/design/speed-model.md, "Pascal: dp4a")."""


DP4A_PP_FAMILY = "q4_0"
"""The family whose prefill factor every quantized format takes on the dp4a path. Its
kernels are issue-bound on integer work whatever the format, so the format moves a
prompt by little: the P40's Llama 2 7B pp512 ran Q4_0 912, Q4_1 909, Q5_0 859 and Q4_K_S
851 t/s (llama.cpp PR #4766), where the k-quant factor fitted on the tensor-core path
is 0.79 of Q4_0's. Chosen on the fitted P40 rows; the held-out ones test it
(docs/design/speed-model.md, "Pascal: dp4a")."""

HELD_OUT_MEDIAN_ABS_ERR = 0.12
"""The median |error| of the dp4a price on held-out Pascal prompts (14 rows: P40 builds of
2024–2026 and a GTX 1060 6GB at micro-batches of 16+ tokens, from
docs/reference/measurements-prs and -community), which the speed note cites.
tests/validate/test_held_out_speed.py recomputes it, so a refit that moves it fails there
until this figure is updated."""


def pp_family(gpu: GpuSpec, backend: str, family: str) -> str:
    """The format family whose prefill factor a step of ``family`` weights takes:
    :data:`DP4A_PP_FAMILY` for a quantized one on the dp4a path, else its own."""
    return DP4A_PP_FAMILY if dp4a_path(gpu, backend, family) else family


def dp4a_path(gpu: GpuSpec, backend: str, family: str) -> bool:
    """Whether llama.cpp multiplies this part's ``family`` weights (a format family,
    kvsim.latency.backend.format_family) with ``dp4a`` on its
    vector ALUs: CUDA on a Pascal part with the instruction (compute capability 6.1:
    GP102/GP104/GP106…, whose sheet's int8 rate is the dp4a rate) and neither int8 nor
    FP16 matrix units, so every batch size takes MMQ's dp4a kernels (ggml-cuda
    ``ggml_cuda_should_use_mmq``; MMVQ's vector dot products use dp4a too). The P100
    (6.0) has no dp4a (no int8 rate): cuBLAS at its fast FP16 rate. Volta runs dp4a
    only below 64 tokens a batch and is not priced so."""
    return backend == "CUDA" and family not in UNQUANTIZED and gpu.architecture == "pascal" \
        and bool(gpu.int8_tensor_ops)
