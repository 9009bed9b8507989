"""KV geometry against docs/reference/models.csv and docs/reference/engines.md §0, exactly."""

import csv
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsim.config.catalog import list_names, load_model
from kvsim.errors import InputError
from kvsim.model.dtypes import bytes_per_element, cache_type
from kvsim.model.geometry import kv_geometry

REFERENCE = Path(__file__).parents[2] / "docs" / "reference"
with open(REFERENCE / "models.csv", encoding="utf-8") as _fh:
    ROWS = list(csv.DictReader(_fh))
BY_DISPLAY = {load_model(n).display_name: load_model(n) for n in list_names("models")}


def test_every_csv_row_has_a_profile():
    # the catalogue also holds models added from HF config.json (scripts/gen_models_added.py)
    assert len(ROWS) == 31
    assert {r["name"] for r in ROWS} <= set(BY_DISPLAY)


# models.csv writes a Mamba layer's convolution window with d_conv = 4 columns; llama.cpp
# (llama_hparams::n_embd_r) and vLLM keep d_conv - 1 = 3, so kvsim holds one column fewer per
# layer: Jamba 28 layers x d_inner 8192 x 2 B, Mamba-2-2.7B 64 x (5120 + 2 x 128) x 2 B.
WINDOW_COLUMN_F16 = {"Jamba-v0.1 (52B; same geometry as Jamba-1.5-Mini)": 28 * 8192 * 2,
                     "Mamba-2-2.7B (pure SSM reference)": 64 * (5120 + 2 * 128) * 2}


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_f16_bytes_equal_reference_columns(row):
    geo = kv_geometry(BY_DISPLAY[row["name"]], "f16", "f16", state_dtype="f16")
    assert geo.full_bytes_per_token == int(row["kv_bytes_per_token_fp16"])
    assert geo.windowed_bytes_per_token == int(row["windowed_kv_bytes_per_token_fp16"])
    assert geo.windowed_cap_bytes_per_seq == int(row["windowed_kv_cap_bytes_per_seq"])
    assert geo.recurrent_bytes_per_seq == int(row["recurrent_state_bytes_per_seq_fp16"]) \
        - WINDOW_COLUMN_F16.get(row["name"], 0)


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_32k_worked_example(row):
    # docs/reference/models.csv: full*32768 + windowed*min(32768, window) + recurrent, in GiB (3
    # decimals)
    geo = kv_geometry(BY_DISPLAY[row["name"]], "f16", "f16", state_dtype="f16")
    assert (geo.bytes_for_tokens(32768) + WINDOW_COLUMN_F16.get(row["name"], 0)) / 2**30 \
        == pytest.approx(float(row["kv_gib_at_32k_ctx_fp16"]), abs=6e-4)


@pytest.mark.parametrize("dtype,expected", [
    ("f16", 131072), ("q8_0", 69632), ("q4_0", 36864), ("fp8", 65536),
    ("q5_1", 48 * 1024), ("q5_0", 44 * 1024), ("q4_1", 40 * 1024), ("iq4_nl", 36 * 1024),
    ("f32", 262144), ("bf16", 131072)])
def test_llama_3_1_8b_per_token(dtype, expected):
    # docs/reference/engines.md §0 worked example: f16 128 KiB, q8_0 68, q5_1 48, q5_0 44, q4_1 40,
    # q4_0 36
    geo = kv_geometry(load_model("llama-3.1-8b"), dtype, dtype)
    assert geo.kv_bytes_per_token == expected


def test_fp8_scales_are_fixed_per_layer_not_per_token():
    # one fp32 k_scale and v_scale per layer: 32 layers * 2 * 4 B
    geo = kv_geometry(load_model("llama-3.1-8b"), "fp8", "fp8")
    assert geo.fixed_bytes == 256
    assert geo.bytes_for_tokens(1000) == 65536 * 1000


@pytest.mark.parametrize("name,frac", [
    ("q8_0", Fraction(34, 32)), ("q5_1", Fraction(24, 32)), ("q5_0", Fraction(22, 32)),
    ("q4_1", Fraction(20, 32)), ("q4_0", Fraction(18, 32)), ("iq4_nl", Fraction(18, 32)),
    ("exl2_q8", Fraction(17, 16)), ("exl2_q4", Fraction(9, 16)),
    ("mlx_8bit", Fraction(17, 16)), ("mlx_4bit", Fraction(9, 16)),
    ("kivi_int4", Fraction(5, 8)), ("kivi_int2", Fraction(3, 8)), ("fp8_e5m2", Fraction(1))])
def test_bytes_per_element(name, frac):
    assert bytes_per_element(name) == frac


def test_exl2_q6_stores_8bit_k_and_4bit_v():
    assert bytes_per_element("exl2_q6", role="k") == Fraction(17, 16)
    assert bytes_per_element("exl2_q6", role="v") == Fraction(9, 16)
    geo = kv_geometry(load_model("llama-3.1-8b"), "exl2_q6", "exl2_q6")
    assert geo.kv_bytes_per_token == 32 * 8 * (136 + 72)


def test_mixed_k_and_v_types():
    geo = kv_geometry(load_model("llama-3.1-8b"), "q8_0", "q4_0")
    assert geo.kv_bytes_per_token == 32 * 8 * (136 + 72)


def test_kivi_residual_window_stays_f16():
    geo = kv_geometry(load_model("llama-3.1-8b"), "kivi_int2", "kivi_int2")
    assert geo.residual_tokens == 128
    assert geo.bytes_for_tokens(100) == 100 * 131072
    assert geo.bytes_for_tokens(1128) == 128 * 131072 + 1000 * 24576


def test_sliding_window_caps_and_mla_latent():
    g = kv_geometry(load_model("gemma-2-9b"))
    assert g.bytes_for_tokens(10000) == 172032 * 10000 + 172032 * 4096 + 0
    mla = kv_geometry(load_model("deepseek-v3"), "q8_0", "q8_0")
    assert mla.kv_bytes_per_token == 61 * 18 * 34      # 576 values = 18 q8_0 blocks


def test_recurrent_state_is_f32_by_default():
    # Mamba-2-2.7B, 64 layers of 80 x 64 x 128 = 655,360 SSM state elements + a convolution
    # window of (4 - 1) x (5120 + 2 x 1 x 128) = 16,128 (llama.cpp n_embd_s + n_embd_r)
    # = 671,488 elements x 4 B x 64 = 171,900,928 B per sequence
    g = kv_geometry(load_model("mamba-2-2.7b"))
    assert g.recurrent_bytes_per_seq == 64 * 671_488 * 4 == 171_900_928
    assert g.bytes_for_tokens(1) == g.bytes_for_tokens(100000) == 171_900_928


def test_unknown_cache_type_names_closest():
    with pytest.raises(InputError, match="closest: q8_0"):
        cache_type("q8_1")


@given(st.integers(0, 300000), st.integers(0, 300000))
def test_bytes_for_tokens_is_monotone_and_subadditive(a, b):
    g = kv_geometry(load_model("gemma-3-12b"), "q8_0", "q8_0")
    lo, hi = sorted((a, b))
    assert g.bytes_for_tokens(lo) <= g.bytes_for_tokens(hi)
    assert g.bytes_for_tokens(hi) - g.bytes_for_tokens(lo) <= g.kv_bytes_per_token * (hi - lo)
