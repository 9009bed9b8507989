"""Pascal's dp4a path (kvsim.latency.dp4a): llama.cpp multiplies a GP10x
part's quantized weights with dp4a on the vector ALUs, priced against the sheet's dp4a
rate by the fitted ``c_dp4a``; every other part and format is priced as before."""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.latency.backend import gpu_rates, load_constants
from kvsim.latency.dp4a import DP4A_UNPACK_SLOTS, dp4a_path, pp_family

LLAMA = load_model("llama-2-7b")


@pytest.mark.parametrize("slug", ["tesla-p40", "tesla-p4", "gtx-1080-ti", "gtx-1080",
                                  "gtx-1070-ti", "gtx-1070", "gtx-1060-6gb"])
def test_gp10x_quantized_weights_take_the_dp4a_path_on_cuda_only(slug):
    g = load_gpu(slug)
    assert dp4a_path(g, "CUDA", "q4_0")
    assert not dp4a_path(g, "CUDA", "f16")      # F16 weights: FP32 GEMMs
    assert not dp4a_path(g, "Vulkan", "q4_0")   # other backends have their own kernels


@pytest.mark.parametrize("slug", ["tesla-p100-16gb", "tesla-v100-sxm2-32gb", "rtx-3090",
                                  "titan-rtx"])
def test_parts_with_matrix_units_or_without_dp4a_do_not(slug):
    # P100: compute capability 6.0, no dp4a (no int8 rate), fast FP16 through cuBLAS;
    # Volta and later: tensor cores for a prompt's batches
    assert not dp4a_path(load_gpu(slug), "CUDA", "q4_0")


def _with_c_dp4a(value: float):
    return load_constants().with_backend("CUDA", c_dp4a=value)


def test_the_shipped_constants_fit_c_dp4a_for_cuda():
    assert load_constants().backends["CUDA"].c_dp4a > 0


def test_an_unfitted_c_dp4a_takes_c_mat_plus_the_unpacking_slots():
    p40, k = load_gpu("tesla-p40"), load_constants()
    default = k.backends["CUDA"].c_mat + DP4A_UNPACK_SLOTS
    a = gpu_rates(p40, LLAMA, "q4_0", backend="CUDA", constants=_with_c_dp4a(0.0))
    b = gpu_rates(p40, LLAMA, "q4_0", backend="CUDA", constants=_with_c_dp4a(default))
    assert a.linear_flops_per_s == b.linear_flops_per_s
    # which prices a Pascal prompt above the FP32 rate the part was priced at before
    fp32 = gpu_rates(p40.model_copy(update={"int8_tensor_ops": None}), LLAMA, "q4_0",
                     backend="CUDA", constants=k)
    assert a.linear_flops_per_s > fp32.linear_flops_per_s


def test_the_dp4a_rate_sets_a_quantized_prompt_and_leaves_f16_alone():
    p40 = load_gpu("tesla-p40")
    fast = p40.model_copy(update={"int8_tensor_ops": 2 * p40.int8_tensor_ops})
    k = load_constants()
    q, q2 = (gpu_rates(g, LLAMA, "q4_0", backend="CUDA", constants=k) for g in (p40, fast))
    f, f2 = (gpu_rates(g, LLAMA, "f16", backend="CUDA", constants=k) for g in (p40, fast))
    assert q2.linear_flops_per_s > 1.3 * q.linear_flops_per_s
    assert f2.linear_flops_per_s == f.linear_flops_per_s
    # a higher issue cost per dp4a op is a slower prompt
    slow = gpu_rates(p40, LLAMA, "q4_0", backend="CUDA", constants=_with_c_dp4a(
        2 * k.backends["CUDA"].c_dp4a))
    assert slow.linear_flops_per_s < q.linear_flops_per_s


def test_every_quantized_format_takes_q4_0s_prefill_factor_on_the_path():
    """The P40 ran Q4_0, Q4_1, Q5_0 and Q4_K_S prompts within 7 % of each other (PR
    #4766): a dp4a kernel is issue-bound whatever the format (DP4A_PP_FAMILY)."""
    k = load_constants()
    p40, rtx = load_gpu("tesla-p40"), load_gpu("rtx-3090")
    lin = {(g.name, f): gpu_rates(g, LLAMA, f, backend="CUDA", constants=k).linear_flops_per_s
           for g in (p40, rtx) for f in ("q4_0", "q4_k_m", "q8_0")}
    assert lin["tesla-p40", "q4_k_m"] == lin["tesla-p40", "q8_0"] == lin["tesla-p40", "q4_0"]
    assert pp_family(p40, "CUDA", "kquant") == "q4_0"
    assert pp_family(p40, "CUDA", "f16") == "f16"            # FP32 GEMMs, not dp4a
    assert pp_family(rtx, "CUDA", "kquant") == "kquant"      # not the dp4a path ...
    # ... but today's int8 MMQ (kvsim.latency.prompt_family.MMQ_PP_FAMILY): Q4_0's factor too,
    # where a 2024 cuBLAS build's k-quant prompt took the fitted k-quant factor
    assert lin["rtx-3090", "q4_k_m"] == lin["rtx-3090", "q4_0"]
    old = gpu_rates(rtx, LLAMA, "q4_k_m", backend="CUDA", constants=k, cublas_prompts=True)
    assert old.linear_flops_per_s < lin["rtx-3090", "q4_k_m"]
