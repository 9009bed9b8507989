"""GGUF files as llama-quantize lays them out (kvsim.model.gguf_mix), checked rule by rule
and against every file size llama-bench printed in the repository's measurements."""

import csv
from pathlib import Path

import pytest

from kvsim.config.catalog import load_model
from kvsim.model.gguf_mix import head_type, stored_type, use_more_bits
from kvsim.model.weights import model_weights
from kvsim.validate.predict import Skipped, setup_for
from kvsim.validate.records import Measurement
from kvsim.validate.run import read_file

REF = Path(__file__).resolve().parents[2] / "docs" / "reference"
GIB = 2**30


@pytest.mark.parametrize("asked,row,stored", [
    ("q6_k", 2688, "q8_0"),     # Nemotron-3-Nano's hidden width: 10.5 blocks of 256
    ("q4_k", 1856, "q5_0"),     # its experts' width
    ("q5_k", 1408, "q5_1"),     # DeepSeek-V2-Lite's experts
    ("iq4_xs", 2880, "iq4_nl"),  # gpt-oss's hidden width
    ("q4_k", 4096, "q4_k"),
    ("q8_0", 2880, "q8_0"),     # 32-value blocks fit 2,880
    ("q6_k", 100, "f16"),       # neither 256 nor the fallback's 32 divide it
])
def test_a_row_that_is_not_whole_blocks_falls_back(asked, row, stored):
    assert stored_type(asked, row) == stored


def test_more_bits_layers_are_the_ends_and_every_third_between():
    assert [i for i in range(32) if use_more_bits(i, 32)] == [
        0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_the_head_is_q6_k_unless_the_file_is_q8_0_or_its_rows_do_not_fit():
    assert head_type("q4_k_m", 4096) == head_type("q4_0", 4096) == "q6_k"
    assert head_type("q8_0", 4096) == "q8_0"
    assert head_type("q4_k_m", 2880) == head_type("q4_0", 2880) == "q8_0"


def test_nemotron_nano_q6_k_is_stored_almost_whole_in_q8_0():
    # hidden 2,688 and expert width 1,856 are not multiples of 256: every tensor but the
    # Mamba out-projections and attention outputs (rows of 4,096) falls back to Q8_0,
    # so its Q6_K file is the size of its Q8_0 one (31.58e9 x 8.5 / 8 = 33.55 GB)
    m = load_model("nemotron-3-nano-30b-a3b")
    q6, q8 = model_weights(m, "q6_k"), model_weights(m, "q8_0")
    assert q6.total_bytes == pytest.approx(q8.total_bytes, rel=2e-3)
    assert q8.total_bytes == pytest.approx(m.params_total * 8.5 / 8, rel=1e-6)
    # a model whose widths are whole blocks keeps Q6_K's 6.5625 bpw
    llama = load_model("llama-3.1-8b")
    assert model_weights(llama, "q6_k").total_bytes == pytest.approx(
        llama.params_total * 6.5625 / 8, rel=1e-6)


def test_released_mxfp4_experts_stay_mxfp4_in_a_k_quant_file():
    m = load_model("gpt-oss-20b")
    w = model_weights(m, "q4_k_m")
    assert w.expert_bits == pytest.approx(4.25)
    assert w.bits_per_weight > 4.25     # attention and the rest in Q5_0 / Q8_0 fallbacks


# Files whose layout is not llama-quantize's own mix, named as their rows say
NOT_LLAMA_QUANTIZE = {
    ("gemma-3-12b", "q8_0"): "gemma-3-12b-it-UD-Q8_K_XL: Unsloth's dynamic mix, printed Q8_0",
    ("qwen3-4b", "q4_k_m"): "Qwen3-4B-UD-Q4_K_XL: Unsloth's dynamic mix, printed Q4_K - Medium",
    ("gemma-3-4b", "q4_0"): "gemma-3-4b-it-qat: Google's quantization-aware Q4_0 file",
    ("gemma-2-27b", "q6_k"): "a June 2024 file (llama.cpp issue #8186), 3.5 GiB over the Q6_K "
                             "layout: which tensors are wider is not printed",
}


def _printed_sizes() -> dict[tuple[str, str], int]:
    """(model, format) -> the file size llama-bench printed, over every measurement
    file in docs/reference whose rows resolve to a catalogued model."""
    out: dict[tuple[str, str], int] = {}
    for path in sorted(REF.glob("measurements*/*.csv")):
        rows, _ = read_file(path)
        for m in rows:
            if not isinstance(m, Measurement) or not m.model_size_bytes:
                continue
            s = setup_for(m)
            if not isinstance(s, Skipped):
                out[(s.model.name, s.weight_format)] = m.model_size_bytes
    return out


def test_every_printed_llama_quantize_file_size_within_one_percent():
    sizes = _printed_sizes()
    assert len(sizes) >= 25 and set(NOT_LLAMA_QUANTIZE) <= set(sizes)
    errors = {k: model_weights(load_model(k[0]), k[1]).total_bytes / v - 1
              for k, v in sizes.items() if k not in NOT_LLAMA_QUANTIZE}
    off = {k: f"{e:+.1%}" for k, e in errors.items() if abs(e) > 0.01}
    assert off == {}
    # the flat-bpw sizing these replaced was -8 % (DeepSeek-V2-Lite Q4_K_M), -7 %
    # (Gemma-2-2B Q4_K_M), -5.5 % (Llama-3.2-3B Q4_0) and +9 % (gpt-oss-20b Q4_K_M)
    for key in (("deepseek-v2-lite", "q4_k_m"), ("gemma-2-2b", "q4_k_m"),
                ("llama-3.2-3b", "q4_0"), ("gpt-oss-20b", "q4_k_m")):
        assert abs(errors[key]) < 0.01, key
    print(f"{len(errors)} files, largest |error| {max(map(abs, errors.values())):.2%}")


def test_published_file_sizes_of_other_models_within_one_percent():
    # quantizers' own tables (docs/reference/gguf-file-sizes.csv): Mixtral-8x22B (8
    # experts: V and K in Q8_0, O in Q5_K) and Llama-3.1-70B in five and seven file types
    with (REF / "gguf-file-sizes.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12
    off = {}
    for r in rows:
        got = model_weights(load_model(r["model"]), r["weight_format"]).total_bytes / 1e9
        if abs(got / float(r["file_gb"]) - 1) > 0.01:
            off[(r["model"], r["weight_format"])] = (round(got, 2), r["file_gb"])
    assert off == {}
