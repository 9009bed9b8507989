"""CUDA parts whose MoE layers loop over the experts on the host: which, from how many
tokens a step, and what each expert's call costs (kvsim.latency.backend applies it).

Design: docs/design/speed-model.md, "Volta and the P100: the expert loop".
"""

from __future__ import annotations

from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.latency.dp4a import UNQUANTIZED

EXPERT_MATMULS = 3
"""Expert matrix products an MoE layer runs (``ffn_gate_exps``, ``ffn_up_exps``,
``ffn_down_exps``): one ``MUL_MAT_ID`` each, hence one loop over the experts each."""

VOLTA_LOOP_TOKENS = 64
"""Volta's fallback starts here: ggml-cuda's ``ggml_cuda_should_use_mmq`` keeps a part
with FP16 but not int8 matrix units on MMQ only below ``MMQ_DP4A_MAX_BATCH_SIZE`` (64)
tokens; a ``MUL_MAT_ID`` of more tokens, quantized, takes neither MMQ nor MMF."""

NO_DP4A_LOOP_TOKENS = 9
"""The P100's (compute capability 6.0: no dp4a, never MMQ) fallback starts above the
matrix-vector kernels' ``MMVQ_MAX_BATCH_SIZE`` (8) tokens."""

EXPERT_CALL_S = 16e-6
"""Seconds one used expert's call costs in the fallback of ggml-cuda's
``ggml_cuda_mul_mat_id``: the expert ids are copied to the host with a stream
synchronisation, then the host launches one ``ggml_cuda_mul_mat`` (a quantize and a
matmul kernel, and their pool allocations) per expert that got tokens, between two
``get_rows`` gathers. The GPU waits for the host's launches, so the time adds to the step.
Measured from the two single-ubatch prompts of a 2026 build on Volta boxes: Qwen3.6
35B-A3B pp512 on 2 V100s, Q4_K_M, 804 t/s, and on 3 V100s, Q8_0, 671 t/s. Less kvsim's
price without the loop, they leave 0.44 s and 0.57 s a ubatch over 30,720 calls (3 × 40
layers × 256 experts): 14.2 and 18.7 µs, mean 16
(docs/reference/measurements-community/multi-gpu.csv, CMM053 / CMM069). The P100 boxes
and the Gemma 4 and deeper rows of the same source check it
(docs/design/speed-model.md)."""


def loop_tokens(gpu: GpuSpec, backend: str, family: str, model: ModelSpec) -> int:
    """The smallest step (tokens) whose routed experts take the host loop on this part;
    0: never. CUDA, an MoE model with quantized experts, and a part without int8 matrix
    units that MMQ declines: Volta from :data:`VOLTA_LOOP_TOKENS`, a Pascal part without
    dp4a (the P100) from :data:`NO_DP4A_LOOP_TOKENS`. Pascal parts with dp4a (the P40,
    GTX 10-series) run MMQ at every size (kvsim.latency.dp4a)."""
    if backend != "CUDA" or not model.num_experts or family in UNQUANTIZED:
        return 0
    if gpu.architecture == "volta":
        return VOLTA_LOOP_TOKENS
    if gpu.architecture == "pascal" and not gpu.int8_tensor_ops:
        return NO_DP4A_LOOP_TOKENS
    return 0


def loop_fields(gpu: GpuSpec, backend: str, family: str, model: ModelSpec) -> dict[str, float]:
    """The :class:`kvsim.latency.rates.GpuRates` fields of the loop (none where it is not
    taken)."""
    start = loop_tokens(gpu, backend, family, model)
    return {"expert_call_s": EXPERT_CALL_S, "expert_loop_tokens": start} if start else {}
