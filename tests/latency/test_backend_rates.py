"""kvsim.latency.backend: which spec-sheet rates a backend's kernels run at."""
import math

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.latency.backend import (
    MMQ_OPS_PER_UNIT_CLOCK,
    BackendConstants,
    ClassScale,
    SpeedConstants,
    board_power_w,
    default_backend,
    format_family,
    gpu_rates,
    matrix_rate,
    memory_kind,
)

ONE = BackendConstants(bw_eff=0.5, kv_eff=0.25, kv_eff_no_fa=0.125, c_vec=0.0, c_mat=1.0,
                       attn_eff=0.5, attn_eff_no_fa=0.25, overhead_s=1e-3,
                       overhead_per_layer_s=1e-5)


def consts(**kw) -> SpeedConstants:
    kw.setdefault("format_bw", {})
    kw.setdefault("format_pp", {})
    kw.setdefault("backends", {"CUDA": ONE, "Metal": ONE})
    return SpeedConstants(**kw)


def test_cuda_quantized_weights_use_sms_times_clock_and_f16_the_fp16_accumulate_rate():
    g = load_gpu("rtx-4090")
    assert matrix_rate(g, "CUDA", True) == pytest.approx(
        g.compute_units * g.boost_clock_hz * MMQ_OPS_PER_UNIT_CLOCK)
    assert matrix_rate(g, "CUDA", False) == g.fp16_tensor_flops
    # Volta has no int8 MMA: quantized weights are dequantized for FP16 cuBLAS
    assert matrix_rate(load_gpu("tesla-v100-sxm2-32gb"), "CUDA", True) == \
        load_gpu("tesla-v100-sxm2-32gb").fp16_tensor_flops
    # Metal multiplies in FP16 whatever the weights
    m3 = load_gpu("apple-m3-max")
    assert matrix_rate(m3, "Metal", True) == matrix_rate(m3, "Metal", False) == \
        m3.fp16_tensor_flops


def test_rates_follow_the_formula_of_the_docstring():
    g, m = load_gpu("rtx-4090"), load_model("llama-3.1-8b")
    r = gpu_rates(g, m, "f16", backend="CUDA", constants=consts())
    assert r.linear_flops_per_s == pytest.approx(g.fp16_tensor_flops)     # c_mat = 1
    assert r.attention_flops_per_s == pytest.approx(0.5 * g.fp16_tensor_flops)
    assert r.weight_bytes_per_s == pytest.approx(0.5 * g.memory_bandwidth_bytes_per_s)
    assert r.kv_bytes_per_s == pytest.approx(0.25 * g.memory_bandwidth_bytes_per_s)
    assert r.overhead_s == pytest.approx(1e-3 + 32 * 1e-5)
    no_fa = gpu_rates(g, m, "f16", backend="CUDA", flash_attn=False, constants=consts())
    assert no_fa.kv_bytes_per_s == pytest.approx(0.125 * g.memory_bandwidth_bytes_per_s)
    # factors: per backend beats shared; class scales multiply (vendor x architecture)
    k = consts(format_bw={"q4_0": 0.5, "CUDA:q4_0": 0.25}, format_pp={"q4_0": 2.0},
               classes={"CUDA:ada": ClassScale(pp_scale=3.0, bw_scale=2.0),
                        "CUDA:nvidia": ClassScale(pp_scale=0.5)},
               memory_bw={"gddr": 0.5})
    q = gpu_rates(g, m, "q4_0", backend="CUDA", constants=k)
    mat = g.compute_units * g.boost_clock_hz * MMQ_OPS_PER_UNIT_CLOCK
    assert q.linear_flops_per_s == pytest.approx(2.0 * 3.0 * 0.5 * mat)
    assert q.weight_bytes_per_s == pytest.approx(
        g.memory_bandwidth_bytes_per_s * 0.5 * 0.5 * 2.0 * 0.25)


def test_the_power_term_slows_a_low_power_card_with_the_same_units():
    c = ONE.model_copy(update={"c_pow_pj": 2.0})
    k = SpeedConstants(backends={"CUDA": c}, format_bw={}, format_pp={})
    ada6000, ada4090 = load_gpu("rtx-6000-ada"), load_gpu("rtx-4090")
    m = load_model("llama-3.1-8b")
    r6 = gpu_rates(ada6000, m, "f16", backend="CUDA", constants=k).linear_flops_per_s
    expect = 1.0 / (1.0 / ada6000.fp16_tensor_flops + 2e-12 / 300.0)
    assert board_power_w(ada6000) == 300.0 and r6 == pytest.approx(expect)
    assert board_power_w(load_gpu("rtx-4090-laptop")) == 150.0     # "80-150": the top
    assert board_power_w(load_gpu("apple-m3-max")) is None          # no term at all
    assert gpu_rates(ada4090, m, "f16", backend="CUDA", constants=k).linear_flops_per_s < \
        ada4090.fp16_tensor_flops


def test_names_of_backends_formats_and_memories():
    assert default_backend(load_gpu("rtx-3090")) == "CUDA"
    assert default_backend(load_gpu("rx-7900-xtx")) == "ROCm"
    assert default_backend(load_gpu("apple-m2-ultra")) == "Metal"
    assert default_backend(load_gpu("arc-a770-16gb")) == "Vulkan"
    assert [format_family(f) for f in ("Q4_K_M", "q4_k_s", "q6_k", "bf16", "mxfp4_moe",
                                       "iq4_nl", "iq4_xs", "awq")] == \
        ["kquant", "kquant", "kquant", "f16", "mxfp4", "iquant", "iquant", "other"]
    assert [memory_kind(load_gpu(n)) for n in ("h100-sxm5-80gb", "rtx-4090", "apple-m3-max")] \
        == ["hbm", "gddr", "lpddr"]


def test_the_shipped_constants_load_and_cover_every_backend():
    from kvsim.latency.backend import BACKENDS, load_constants
    k = load_constants()
    for b in BACKENDS:
        c = k.backend(b)
        assert 0.3 < c.bw_eff * k.format_factors(b, "q4_0")[0] <= 1.5, b
        assert not math.isnan(c.overhead_s)
    # the fit wrote its leave-one-device-out errors beside the constants
    assert k.errors and all(v["n"] > 0 for v in k.errors.values())


def test_mmq_runs_at_the_int8_rate_per_sm_clock_of_the_spec_sheet_within_mma_sync():
    from kvsim.latency.backend import MMQ_OPS_PER_UNIT_CLOCK_MAX, mmq_ops_per_unit_clock

    # GA100: 624 TOPS dense int8 / (108 SMs x 1.41 GHz) = 4098 ops per SM-clock: capped at
    # 4096, twice a GA10x SM's 2048 (RTX 3090: 284 TOPS / (82 x 1.695 GHz))
    a100 = load_gpu("a100-80gb-pcie")
    assert mmq_ops_per_unit_clock(a100) == MMQ_OPS_PER_UNIT_CLOCK_MAX == 4096.0
    assert matrix_rate(a100, "CUDA", True) == pytest.approx(108 * 1.41e9 * 4096)
    assert mmq_ops_per_unit_clock(load_gpu("rtx-3090")) == pytest.approx(2048, rel=1e-3)
    # H100 PCIe: 1513 TOPS / (114 x 1.755 GHz) = 7562, of which mma.sync reaches 4096
    assert mmq_ops_per_unit_clock(load_gpu("h100-pcie-80gb")) == 4096.0
    # a sheet listing less than the GeForce rate (L40's int8 = its fp16 figure) keeps 2048
    assert mmq_ops_per_unit_clock(load_gpu("l40")) == MMQ_OPS_PER_UNIT_CLOCK


def test_nvidia_vector_rate_is_the_sm_issue_rate_not_the_fp32_lanes():
    from kvsim.latency.backend import vector_rate

    # 4 schedulers x 32 lanes x 2 FLOPs = 256 per SM-clock: an RTX 4090's spec FP32 rate
    # (128 SMs x 2.52 GHz x 256 = 82.6 TFLOPS), twice an A100's 64-lane FP32 figure
    g4090, a100 = load_gpu("rtx-4090"), load_gpu("a100-80gb-pcie")
    assert vector_rate(g4090) == pytest.approx(128 * 2.52e9 * 256)
    assert vector_rate(g4090) == pytest.approx(g4090.fp32_flops, rel=2e-3)
    assert vector_rate(a100) == pytest.approx(2 * a100.fp32_flops, rel=2e-3)
    m3 = load_gpu("apple-m3-max")       # elsewhere: the spec sheet's FP32 rate
    assert vector_rate(m3) == m3.fp32_flops


def test_a_step_of_more_than_one_token_is_launched_kernel_by_kernel_on_cuda():
    from kvsim.latency.backend import cuda_graphs

    k = consts(backends={"CUDA": ONE.model_copy(update={"launch_per_layer_s": 5e-5}),
                         "Metal": ONE.model_copy(update={"launch_per_layer_s": 5e-5})})
    m = load_model("llama-3.1-8b")   # 32 layers
    r = gpu_rates(load_gpu("rtx-4090"), m, "q4_0", backend="CUDA", constants=k)
    assert r.overhead_s == pytest.approx(1e-3 + 32 * 1e-5)           # a one-token graph
    assert r.overhead_batch_s == pytest.approx(1e-3 + 32 * (1e-5 + 5e-5))
    # Pascal replays no graph: every step is launched
    p40 = gpu_rates(load_gpu("tesla-p40"), m, "q4_0", backend="CUDA", constants=k)
    assert not cuda_graphs(load_gpu("tesla-p40"), "CUDA")
    assert p40.overhead_s == p40.overhead_batch_s == pytest.approx(1e-3 + 32 * 6e-5)
    # Metal has no such distinction: the launch constant is not applied
    mac = gpu_rates(load_gpu("apple-m3-max"), m, "q4_0", backend="Metal", constants=k)
    assert mac.overhead_s == mac.overhead_batch_s == pytest.approx(1e-3 + 32 * 1e-5)


def test_shipped_constants_stream_lpddr_like_gddr_and_hbm_slower():
    # the shipped fit gives HBM a factor of its own and LPDDR/DDR none: a card that differs
    # only in its memory type streams weights at the same rate on LPDDR as on GDDR (a fitted
    # LPDDR factor was confounded with the backends: kvsim/validate/fit_space.FITTED_MEMORY_KINDS)
    g, m = load_gpu("rtx-3060-12gb"), load_model("llama-3.1-8b")
    assert memory_kind(g) == "gddr"
    rate = {t: gpu_rates(g.model_copy(update={"memory_type": t}), m, "q4_0",
                         backend="CUDA").weight_bytes_per_s
            for t in ("GDDR6", "LPDDR5X", "DDR5", "HBM2e")}
    assert rate["LPDDR5X"] == rate["DDR5"] == rate["GDDR6"]
    assert rate["HBM2e"] < 0.8 * rate["GDDR6"]


def test_a_prefill_reads_its_weights_again_per_token_at_peak_bandwidth():
    # a tiled matmul re-reads its weight tile once per tile of tokens (pp_reread): the
    # prompt step's compute gains pp_reread x tokens x weight bytes / peak bandwidth; a
    # decode step reads its weights once, as before
    from kvsim.latency.base import BatchShape
    from kvsim.validate.predict import Setup, latency_for

    m = load_model("llama-3.1-8b")
    reread = consts(backends={"CUDA": ONE.model_copy(update={"pp_reread": 0.01})})
    prompt = BatchShape(prefill_tokens=(512,), prefill_context=(0,))
    decode = BatchShape(decode_context=(1000, 2000))
    extra = {}
    for name in ("rtx-3060-12gb", "rtx-3060-8gb"):   # 360 vs 240 GB/s, same SMs
        g = load_gpu(name)
        r0, r1 = (gpu_rates(g, m, "q4_0", backend="CUDA", constants=k)
                  for k in (consts(), reread))
        assert r0.reread_s_per_byte_token == 0.0
        assert r1.reread_s_per_byte_token == 0.01 / g.memory_bandwidth_bytes_per_s
        s = Setup(g, m, "q4_0", "CUDA", True)
        t0, t1 = latency_for(s, rates=r0), latency_for(s, rates=r1)
        weights = t0.weight_bytes(512)[0]
        extra[name] = t1.step_time_s(prompt) - t0.step_time_s(prompt)
        assert extra[name] == pytest.approx(0.01 * 512 * weights / g.memory_bandwidth_bytes_per_s)
        assert t1.step_time_s(decode) == t0.step_time_s(decode)
    assert extra["rtx-3060-8gb"] == pytest.approx(1.5 * extra["rtx-3060-12gb"])


def test_a_moe_prefill_rereads_a_tokens_own_weights_not_every_expert():
    # each expert re-reads its weights once per tile of *its* tokens (t x k/E of them), so
    # a prompt token's re-read is the dense bytes and k/E of the experts'; the one pass
    # over every expert the step reaches stays in the weight read
    from kvsim.latency.base import BatchShape
    from kvsim.validate.predict import Setup, latency_for

    g, m = load_gpu("rtx-3090"), load_model("qwen3-30b-a3b")
    reread = consts(backends={"CUDA": ONE.model_copy(update={"pp_reread": 0.01})})
    r0, r1 = (gpu_rates(g, m, "q4_k_m", backend="CUDA", constants=k)
              for k in (consts(), reread))
    s = Setup(g, m, "q4_k_m", "CUDA", True)
    t0, t1 = latency_for(s, rates=r0), latency_for(s, rates=r1)
    prompt = BatchShape(prefill_tokens=(2048,), prefill_context=(0,))
    own = t0.gpu_dense_bytes + (8 / 128) * t0.gpu_expert_bytes  # top-8 of 128 experts
    assert t0.gpu_weight_bytes == own < 0.2 * t0.weight_bytes(2048)[0]
    assert t1.step_time_s(prompt) - t0.step_time_s(prompt) == pytest.approx(
        0.01 * 2048 * own / g.memory_bandwidth_bytes_per_s)
    # a dense model's own weights are all of them (the test above)
    dense = latency_for(Setup(g, load_model("llama-3.1-8b"), "q4_0", "CUDA", True), rates=r0)
    assert dense.gpu_weight_bytes == dense.weight_bytes(2048)[0]


def test_an_iquant_without_a_prefill_factor_takes_q4_0s():
    # ggml-cuda's MMQ loads IQ4_NL / IQ4_XS tiles as 4-bit values and multiplies them with
    # the legacy quants' int8 product (kvsim.latency.prompt_family.PP_FALLBACK); a fitted iquant
    # factor wins; streaming keeps 1
    k = consts(format_bw={"q4_0": 1.1}, format_pp={"q4_0": 0.7, "CUDA:q4_0": 0.6, "q8_0": 0.5})
    assert k.format_factors("CUDA", "iquant") == (1.0, 0.6)
    assert k.format_factors("Metal", "iquant") == (1.0, 0.7)
    own = consts(format_pp={"q4_0": 0.7, "iquant": 0.9})
    assert own.format_factors("CUDA", "iquant") == (1.0, 0.9)
    assert consts().format_factors("CUDA", "iquant") == (1.0, 1.0)


def test_a_metal_kquant_prompt_without_its_own_factor_takes_metals_q4_0():
    # ggml-metal dequantizes every tile to 16 bits before its simdgroup matmul
    # (kvsim.latency.prompt_family.PP_FALLBACK_ON): Metal's own q4_0 factor before the shared
    # k-quant one (CUDA's MMQ); a fitted Metal k-quant factor wins; other backends and
    # the streaming factor keep the shared ones
    k = consts(format_bw={"kquant": 1.1},
               format_pp={"q4_0": 0.8, "kquant": 0.6, "Metal:q4_0": 0.75, "CUDA:q4_0": 0.9})
    assert k.format_factors("Metal", "kquant") == (1.1, 0.75)
    assert k.format_factors("CUDA", "kquant") == (1.1, 0.6)
    assert k.format_factors("Vulkan", "kquant") == (1.1, 0.6)
    fitted = consts(format_pp={"kquant": 0.6, "Metal:q4_0": 0.75, "Metal:kquant": 0.7})
    assert fitted.format_factors("Metal", "kquant") == (1.0, 0.7)
    assert consts(format_pp={"kquant": 0.6}).format_factors("Metal", "kquant") == (1.0, 0.6)


def test_matrix_vector_and_tile_terms_on_gpu_backends_not_on_cpu():
    """c_small prices a 2-8-token step's linear FLOPs at the vector rate over c_small on
    every GPU backend; tile_tokens reaches the tiled path's rates; ggml-cpu has neither
    switch (kvsim.latency.backend.small_batch_tokens); c_small 0 turns the regime
    off (constants fitted before it)."""
    from kvsim.latency.backend import SMALL_BATCH_TOKENS, vector_rate

    g, m = load_gpu("rtx-3090"), load_model("llama-3.1-8b")
    both = ONE.model_copy(update={"c_small": 2.0, "tile_tokens": 32.0})
    k = consts(backends={"CUDA": both, "ROCm": both, "CPU": both})
    cuda = gpu_rates(g, m, "q4_0", backend="CUDA", constants=k)
    assert cuda.small_flops_per_s == pytest.approx(vector_rate(g) / 2.0)
    assert (cuda.small_tokens, cuda.tile_tokens) == (SMALL_BATCH_TOKENS, 32.0)
    cpu = gpu_rates(g, m, "q4_0", backend="CPU", constants=k)
    assert (cpu.small_tokens, cpu.tile_tokens) == (1, 0.0)
    off = gpu_rates(g, m, "q4_0", backend="CUDA", constants=consts())
    assert (off.small_flops_per_s, off.tile_tokens) == (None, 0.0)
