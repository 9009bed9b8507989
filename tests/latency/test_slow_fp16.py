"""Parts without fast FP16 (GP102/GP104 Pascal: GTX 1080 / 1080 Ti, Tesla P40) run their
16-bit GEMMs and attention in FP32, as ggml does (kvsim.latency.rates.matmul_flops), and
their quantized weights on the dp4a path (tests/latency/test_dp4a.py); and across the
whole catalogue a dense model's predicted speeds stay physically possible."""

import pytest

from kvsim.config.catalog import list_names, load_gpu, load_model
from kvsim.latency.backend import gpu_rates, matrix_rate
from kvsim.latency.rates import SLOW_FP16, matmul_flops
from kvsim.validate.predict import predicted_tps, setup_weights, setup_with
from kvsim.validate.records import Measurement

PASCAL_GP10X = ("gtx-1080", "gtx-1080-ti", "tesla-p40")
DEFAULT_BACKEND = {"nvidia": "CUDA", "amd": "ROCm", "apple": "Metal", "intel": "Vulkan"}


def _tps(gpu: str, metric: str, backend: str = "CUDA", model: str = "llama-2-7b",
         fmt: str = "q4_0") -> float:
    m = Measurement(id="x", gpu=gpu, backend=backend, model=model, weight_format=fmt,
                    metric=metric, value=1.0, n_prompt=512 if metric == "pp_tps" else 0,
                    n_gen=128 if metric == "tg_tps" else 0, flash_attn=False)
    s = setup_with(m, load_gpu(gpu), load_model(model))
    return predicted_tps(m, s)


@pytest.mark.parametrize("slug", PASCAL_GP10X)
def test_gp10x_gemms_and_attention_run_at_fp32(slug):
    g = load_gpu(slug)
    assert g.fp16_tensor_flops < SLOW_FP16 * g.fp32_flops  # 1/64 of FP32 on the sheet
    for quantized in (True, False):
        assert matrix_rate(g, "CUDA", quantized) == g.fp32_flops
    r = gpu_rates(g, load_model("llama-3.1-8b"), "q4_0", backend="CUDA")
    fast = gpu_rates(g.model_copy(update={"fp16_tensor_flops": g.fp32_flops}),
                     load_model("llama-3.1-8b"), "q4_0", backend="CUDA")
    assert (r.linear_flops_per_s, r.attention_flops_per_s) == \
        (fast.linear_flops_per_s, fast.attention_flops_per_s)


def test_fast_fp16_parts_keep_their_16_bit_rate():
    for slug in ("rtx-3090", "tesla-p100-16gb", "tesla-v100-sxm2-32gb", "apple-m1-7c"):
        g = load_gpu(slug)
        assert matmul_flops(g, g.fp16_tensor_flops) == g.fp16_tensor_flops


def test_p40_within_reach_of_its_published_llama_bench():
    # ggml-org/llama.cpp PR #4766 (JohannesGaessler's table, 2024-01): Tesla P40, llama 7B
    # Q4_0, pp512 912-935 t/s and tg128 56.3-56.8 t/s; kvsim read the sheet's FP16 rate
    # (0.18 TFLOP/s) and predicted 10 and 8.8 t/s before. These rows fit c_dp4a
    # (docs/reference/measurements-pascal); priced at the FP32 rate the prompt was 516 t/s
    assert _tps("tesla-p40", "tg_tps") == pytest.approx(56.3, rel=0.15)
    assert 0.9 * 912 < _tps("tesla-p40", "pp_tps") < 1.1 * 935


@pytest.mark.parametrize("slug", list_names("gpus"))
def test_every_card_predicts_a_possible_dense_llama(slug):
    g = load_gpu(slug)
    backend = DEFAULT_BACKEND.get(g.vendor.lower())
    if backend is None:
        pytest.skip(f"{slug}: no GPU backend for vendor {g.vendor}")
    tg, pp = _tps(slug, "tg_tps", backend), _tps(slug, "pp_tps", backend)
    m = Measurement(id="x", gpu=slug, backend=backend, model="llama-2-7b", weight_format="q4_0",
                    metric="tg_tps", value=1.0, n_gen=128)
    roof = g.memory_bandwidth_bytes_per_s / setup_weights(
        setup_with(m, g, load_model("llama-2-7b"))).total_bytes
    # decode streams every weight once a token: at most the bandwidth bound, and no card
    # published anywhere reaches below a sixth of it once the backend's fixed per-step
    # time is paid (a card of 5 TB/s launching kernel by kernel is bound by the launches)
    fixed = gpu_rates(g, load_model("llama-2-7b"), "q4_0", backend=backend).overhead_s
    assert 1 / (6 / roof + fixed) < tg <= roof, (tg, roof, fixed)
    assert pp > 2 * tg
