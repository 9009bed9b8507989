"""A k-quant prompt on today's CUDA takes Q4_0's prefill factor (kvsim.latency.backend
.MMQ_PP_FAMILY); a 2024 cuBLAS-era build keeps the fitted k-quant factor."""

from pathlib import Path

from kvsim.config.catalog import load_gpu, load_model
from kvsim.latency.backend import gpu_rates, load_constants
from kvsim.latency.prompt_family import prompt_family
from kvsim.validate.shared import read_shared_csv

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "docs" / "reference" / "measurements" / "speed-vs-load.csv"  # shared copy


def test_which_parts_and_builds_take_q4_0s_factor():
    ada, volta, p40 = (load_gpu(g) for g in ("rtx-4090", "tesla-v100-pcie-16gb",
                                            "tesla-p40"))
    assert prompt_family(ada, "CUDA", "kquant") == "q4_0"            # int8 MMQ
    assert prompt_family(ada, "CUDA", "kquant", cublas=True) == "kquant"  # a 2024 build
    assert prompt_family(volta, "CUDA", "kquant") == "kquant"        # no int8 MMQ: cuBLAS
    assert prompt_family(p40, "CUDA", "kquant") == "q4_0"            # the dp4a path's rule
    assert prompt_family(ada, "ROCm", "kquant") == "kquant"
    assert prompt_family(ada, "CUDA", "q8_0") == "q8_0"              # fitted on its own
    assert prompt_family(ada, "CUDA", "f16") == "f16"


def test_the_factor_reaches_a_prompts_rate_and_not_decodes_bandwidth():
    k, g, m = load_constants(), load_gpu("rtx-4090"), load_model("llama-3.1-8b")
    now, old, q4 = (gpu_rates(g, m, f, backend="CUDA", constants=k, cublas_prompts=c)
                    for f, c in (("q4_k_m", False), ("q4_k_m", True), ("q4_0", False)))
    assert now.linear_flops_per_s == q4.linear_flops_per_s
    ratio = k.format_factors("CUDA", "q4_0")[1] / k.format_factors("CUDA", "kquant")[1]
    assert now.linear_flops_per_s / old.linear_flops_per_s == ratio > 1.2
    assert now.weight_bytes_per_s == old.weight_bytes_per_s


def test_the_fitted_k_quant_rows_are_read_as_cublas_builds():
    # XiongjieDai's May 2024 rows, the only fitted CUDA k-quant prompts, say their build
    # flag (LLAMA_CUBLAS, renamed LLAMA_CUDA in 2024-03): they keep the factor fitted on them
    meas, _ = read_shared_csv(SHARED.read_text(encoding="utf-8"), SHARED.name)
    flagged = {m.id for m in meas if m.cublas_prompts}
    assert len(flagged) == 38
    assert {"SL0275", "SL0327"} <= flagged
    assert not any(m.cublas_prompts for m in meas if m.id.startswith("SL00"))
