"""The shipped speed constants against the held-out pull-request tables
(docs/reference/measurements-prs): rows no fit has seen, on cards and settings beyond the
shared files. Each bound is the figure docs/validation.md reports, with a few points of
room: a change to the speed model that loses them has to say so there."""
from pathlib import Path

import pytest

from kvsim.latency.backend import load_constants
from kvsim.latency.dp4a import HELD_OUT_MEDIAN_ABS_ERR
from kvsim.latency.speed_band import band_from_errors
from kvsim.validate.run import Validation, validate
from kvsim.validate.shared import read_shared_csv

PRS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "measurements-prs" \
    / "llamacpp-prs.csv"

BOUNDS = {  # (kind, backend, metric): (median, p90) |relative error|, docs/validation.md
    ("single", "CUDA", "tg_tps"): (0.18, 0.80),
    ("single", "CUDA", "pp_tps"): (0.30, 1.25),
    ("single", "ROCm", "tg_tps"): (0.15, 0.27),
    ("single", "ROCm", "pp_tps"): (0.30, 0.60),
    ("single", "Vulkan", "tg_tps"): (0.20, 1.2),
    ("single", "Vulkan", "pp_tps"): (0.34, 3.4),
    ("depth", "CUDA", "pp_tps"): (0.22, 2.2),
    ("depth", "ROCm", "pp_tps"): (0.36, 0.90),
}


@pytest.fixture(scope="module")
def held_out() -> Validation:
    meas, skipped = read_shared_csv(PRS.read_text(encoding="utf-8"), PRS.name)
    v = validate(meas)
    assert skipped == [] and v.skipped == [] and len(v.rows) == 355
    return v


@pytest.fixture(scope="module")
def summary(held_out: Validation) -> dict[tuple[str, str, str], dict]:
    return {(s["kind"], s["backend"], s["metric"]): s for s in held_out.summary()}


@pytest.mark.parametrize("key", sorted(BOUNDS))
def test_held_out_errors_stay_within_what_the_docs_report(summary, key):
    median, p90 = BOUNDS[key]
    s = summary[key]
    assert s["median_abs_rel_err"] <= median and s["p90_abs_rel_err"] <= p90, s


@pytest.mark.parametrize(("backend", "bound"), [("ROCm", 0.21), ("CUDA", 0.40)])
def test_steps_of_a_few_tokens_take_the_matrix_vector_price(backend, bound):
    """The micro-batch sweeps' 2-8-token prompt steps (GpuRates.small_flops_per_s):
    median |error| 19 % on ROCm (29 rows) and 35 % on CUDA (38), where the tiled-path
    price gave 21.5 % and 42.7 % (docs/design/speed-model.md)."""
    meas, _ = read_shared_csv(PRS.read_text(encoding="utf-8"), PRS.name)
    small = [m for m in meas if m.backend == backend and m.metric == "pp_tps"
             and 1 < m.n_ubatch <= 8]
    errs = sorted(abs(float(r["rel_err"])) for r in validate(small).rows)
    assert len(errs) >= 25 and errs[len(errs) // 2] <= bound, errs


def test_the_band_a_user_is_shown_holds_two_in_three_held_out_rows(held_out):
    """kvsim.latency.speed_band's 10th-90th percentile band (leave-one-device-out on the
    fitted files) against the held-out one-sequence rows: 212 of 296 inside it (72 %,
    where 80 % would be a band as wide as these rows need; CUDA decode 8 of 17: MoE decode
    on 2025 builds). docs/design/speed-model.md says so; a refit that narrows the band
    has to keep it."""
    errors, inside, n = load_constants().errors, 0, 0
    for r in held_out.rows:
        band = band_from_errors(errors, str(r["backend"])) if r["kind"] == "single" else None
        if band is None:
            continue
        ends = band.decode if r["metric"] == "tg_tps" else band.prompt
        # NOTE: a row's rel_err is kvsim's speed over the measured, minus 1: the step-time
        # factor it implies is 1 + rel_err
        n += 1
        inside += ends[0] <= 1 + float(r["rel_err"]) <= ends[1]
    assert n == 296 and inside / n >= 0.62, (inside, n)


COMMUNITY = PRS.parents[1] / "measurements-community" / "community.csv"


def test_community_rows_are_all_predicted_and_metal_k_quant_prompts_hold():
    """docs/reference/measurements-community: 85 rows users posted for their own card,
    every one predicted; the Metal k-quant prompts (M1 Ultra, M3 Ultra, M4) within the
    10.2 / 14.0 % docs/validation.md reports (25.8 / 29.0 % before Metal's k-quant prompts
    took its Q4_0 factor, kvsim.latency.prompt_family.PP_FALLBACK_ON)."""
    meas, skipped = read_shared_csv(COMMUNITY.read_text(encoding="utf-8"), COMMUNITY.name)
    v = validate(meas)
    assert skipped == [] and v.skipped == [] and len(v.rows) == 85
    s = {(x["kind"], x["backend"], x["metric"]): x for x in v.summary()}
    metal = s[("single", "Metal", "pp_tps")]
    assert metal["n"] == 4 and metal["median_abs_rel_err"] <= 0.12
    assert metal["p90_abs_rel_err"] <= 0.16, metal


def test_multi_gpu_rows_are_laid_out_on_their_boxes_or_say_why():
    """docs/reference/measurements-community/multi-gpu.csv: 135 llama-bench rows from
    boxes of 2-4 GPUs (kvsim.validate.box_predict): 108 predicted on their boxes (the
    4x RTX 4090 "llama 70B (Llama 3.x 70B inferred)" rows as Llama 3.1 70B: the 3.x
    narrows the model type to two models of one shape); the rest name a model type the
    catalogue lacks or llama.cpp's tensor split, which kvsim does not lay out, or are
    boxes kvsim's layout with every layer on the GPUs (-ngl 99) finds short of loading,
    where the real runs loaded (docs/validation.md): the R9700 pair by 0.1 GiB, and the
    4x RTX 4090 rows at 65,536 tokens of depth by 0.1-0.8 GiB of the 24,080 MiB CUDA
    reports, their -fa not shown and so off (llama-bench's default before it took auto),
    which puts an 8.3 GiB KQ buffer on every card."""
    f = COMMUNITY.with_name("multi-gpu.csv")
    meas, skipped = read_shared_csv(f.read_text(encoding="utf-8"), f.name)
    v = validate(meas)
    assert skipped == [] and len(v.rows) == 108 and len(v.skipped) == 27
    assert {r["gpu"] for r in v.rows} >= {"2x rx-7900-xtx", "2x radeon-ai-pro-r9700",
                                          "3x tesla-v100-pcie-16gb", "rtx-4070-ti+rtx-a4000",
                                          "4x rtx-4090"}
    assert all(s.reason.startswith(("split mode 'tensor'", "unknown: ",
                                    "kvsim cannot lay this box out: "))
               for s in v.skipped), {s.reason for s in v.skipped}
    short = sorted(s.id for s in v.skipped if s.reason.startswith("kvsim cannot lay"))
    assert short == ["CMM033", "CMM034", "CMM113", "CMM114", "CMM116", "CMM117", "CMM119",
                     "CMM120"]


def test_pascal_prompts_take_the_dp4a_price():
    """Held-out dense prompts on Pascal cards (Tesla P40, GTX 1060 6GB) at micro-batches of
    16+ tokens, from the community and pull-request files: 14 rows of builds from 2024
    to 2026. Priced at the fitted c_dp4a (one P40 table of 2024-01 fitted,
    docs/reference/measurements-pascal), each format at Q4_0's prefill factor, their
    median |error| is 12 % (21 % with the tensor-core path's k-quant factor); at the FP32
    rate kvsim used before, 58 % (every one too slow). docs/validation.md, "Held-out
    community rows"."""
    rows = []
    for f in (PRS, COMMUNITY):
        meas, _ = read_shared_csv(f.read_text(encoding="utf-8"), f.name)
        rows += [m for m in meas if m.metric == "pp_tps" and m.n_ubatch >= 16
                 and m.weight_format.lower() != "f16" and m.model.startswith(("Llama", "Qwen"))
                 and ("P40" in m.gpu or "GTX 1060" in m.gpu)]
    errs = sorted(abs(float(r["rel_err"])) for r in validate(rows).rows)
    assert len(errs) == 14 and (errs[6] + errs[7]) / 2 <= 0.14, errs
    # the figure the speed note cites (kvsim.cli._speed_band_output.dp4a_words)
    assert (errs[6] + errs[7]) / 2 == pytest.approx(HELD_OUT_MEDIAN_ABS_ERR, abs=0.01)


def test_modern_cuda_k_quant_prompts_take_q4_0s_factor():
    """Held-out CUDA k-quant prompts of 2025-2026 builds on single cards (an RTX 3090's
    and an RTX 5060 Ti's Qwen2.5-7B, an RTX PRO 6000 Blackwell's Llama 3.3 70B): at the
    fitted k-quant factor, which May 2024 cuBLAS-era rows set, they came out 24-30 % too
    slow; at Q4_0's factor, as MMQ runs them (kvsim.latency.prompt_family.MMQ_PP_FAMILY), within
    13 % (docs/validation.md, "The k-quant prompt on CUDA")."""
    rows = []
    for f in (PRS, COMMUNITY):
        meas, _ = read_shared_csv(f.read_text(encoding="utf-8"), f.name)
        rows += [m for m in meas if m.id in ("PRC133", "PRC135", "CMN019")]
    errs = {r["id"]: float(r["rel_err"]) for r in validate(rows).rows}
    assert len(errs) == 3 and all(-0.14 < e < 0 for e in errs.values()), errs
