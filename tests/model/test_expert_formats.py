"""Experts-only weight formats: MXFP4 on the routed MoE experts, the rest wider.

Reference: docs/reference/models.csv gpt-oss notes ("Released weights are MXFP4 for MoE experts
(~4.25 bpw): checkpoint ~13 GB (20b) / ~61-65 GB (120b)") and docs/reference/hardware-and-models.md
§2 ("the checkpoints are about 13 GB (20b) and about 61–65 GB (120b)"; GB = 10^9 B there).

Shared derivation (catalogue profiles from docs/reference/models.csv; embeddings untied):
  embedding = output head = vocab 201,088 x hidden 2,880 = 579,133,440 params
  non-repeating (embedding + head)                      = 1,158,266,880 params
  attention per layer: hidden 2,880 x head_dim 64 x (2 x 64 q/o heads + 2 x 8 k/v heads)
                       = 2,880 x 64 x 144               = 26,542,080 params
  MXFP4 17 B / 32 values = 0.53125 B/param; bf16 2 B/param; q8_0 34 B / 32 = 1.0625 B/param

gpt-oss-20b: 20.9e9 params, 24 layers, 32 experts (4 active), 3.6e9 active
  per layer (20,900,000,000 - 1,158,266,880) / 24          = 822,572,213.33 params
  experts by the counts 32 x (20.9e9 - 3.6e9) / 28 / 24     = 823,809,523.81 per layer
  experts by the geometry 822,572,213.33 - 26,542,080       = 796,030,133.33 (the smaller)
gpt-oss-120b: 116.8e9 params, 36 layers, 128 experts (4 active), 5.1e9 active
  per layer (116,800,000,000 - 1,158,266,880) / 36         = 3,212,270,364.44 params
  experts by the counts 128 x (116.8e9 - 5.1e9) / 124 / 36  = 3,202,867,383.51 per layer
  experts by the geometry 3,212,270,364.44 - 26,542,080     = 3,185,728,284.44 (smaller)
"""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu
from kvsim.errors import InputError
from kvsim.model.weights import format_for_file, model_weights, weight_format

GB = 10**9

# mxfp4, gpt-oss-20b:
#   layer  796,030,133.33 x 0.53125 = 422,891,008.33 (experts)
#          + 26,542,080 x 2 = 53,084,160 (attention)      -> int 475,975,168
#   head + embedding 1,158,266,880 x 2                     = 2,316,533,760
#   total 24 x 475,975,168 + 2,316,533,760 = 11,423,404,032 + 2,316,533,760
OSS20_MXFP4 = 13_739_937_792
# mxfp4, gpt-oss-120b:
#   layer  3,185,728,284.44 x 0.53125 = 1,692,418,151.11 + 53,084,160 -> int 1,745,502,311
#   total 36 x 1,745,502,311 + 2,316,533,760 = 62,838,083,196 + 2,316,533,760
OSS120_MXFP4 = 65_154_616_956


def test_gpt_oss_20b_mxfp4_is_experts_at_mxfp4_rest_bf16():
    w = model_weights(load_model("gpt-oss-20b"), "mxfp4")
    assert w.per_layer_bytes == 475_975_168
    assert w.expert_bytes_per_layer == 422_891_008
    assert (w.non_repeating_bytes, w.embedding_bytes) == (2_316_533_760, 1_158_266_880)
    assert w.total_bytes == OSS20_MXFP4
    # the reference's "about 13 GB": within 1 GB (13.74 GB = 12.80 GiB); the old
    # 4.25 bpw everywhere gave 20.9e9 x 0.53125 = 11.10 GB, 1.9 GB short
    assert abs(w.total_bytes - 13 * GB) <= 1 * GB
    assert abs(20.9e9 * 0.53125 - 13 * GB) > 1 * GB


def test_gpt_oss_120b_mxfp4_is_within_the_reference_range():
    w = model_weights(load_model("gpt-oss-120b"), "mxfp4")
    assert w.per_layer_bytes == 1_745_502_311
    assert w.total_bytes == OSS120_MXFP4
    # "about 61-65 GB": 65.15 GB, 65 to the whole GB the reference quotes
    assert 61 <= round(w.total_bytes / GB) <= 65


def test_llama_quantize_mxfp4_moe_keeps_the_rest_at_q8_0():
    # llama.cpp src/llama-quant.cpp, MXFP4_MOE: expert tensors MXFP4, all others Q8_0
    # 20b: layer 422,891,008.33 + 26,542,080 x 1.0625 (28,200,960) -> int 451,091,968
    #      non-repeating 1,158,266,880 x 1.0625 = 1,230,658,560
    #      total 24 x 451,091,968 + 1,230,658,560 = 10,826,207,232 + 1,230,658,560
    w20 = model_weights(load_model("gpt-oss-20b"), "mxfp4-moe")
    assert (w20.format, w20.per_layer_bytes) == ("mxfp4_moe", 451_091_968)
    assert w20.total_bytes == 12_056_865_792
    # 120b: layer 1,692,418,151.11 + 28,200,960 -> int 1,720,619,111
    #       total 36 x 1,720,619,111 + 1,230,658,560 = 61,942,287,996 + 1,230,658,560
    w120 = model_weights(load_model("gpt-oss-120b"), "mxfp4_moe")
    assert w120.total_bytes == 63_172_946_556
    assert 61 * GB <= w120.total_bytes <= 65 * GB


def test_whole_model_formats_of_a_moe_model_are_unchanged():
    # bf16: docs/reference/models.csv weight_gb_bf16 41.8 for gpt-oss-20b (params x 2, int per
    # layer:   24 x int(822,572,213.33 x 2 = 1,645,144,426.67) + 2,316,533,760 = 41,799,999,984)
    w = model_weights(load_model("gpt-oss-20b"), "bf16")
    assert w.total_bytes == 41_799_999_984
    # experts 796,030,133.33 x 2 = 1,592,060,266.67 -> 1,592,060,266
    assert w.expert_bytes_per_layer == 1_592_060_266


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp4_moe"])
def test_a_dense_model_has_nothing_an_experts_only_format_quantises(fmt):
    with pytest.raises(InputError, match="MoE experts only, and llama-3.1-8b has none"):
        model_weights(load_model("llama-3.1-8b"), fmt)
    assert weight_format(fmt).experts_only and not weight_format("q4_k_m").experts_only


def test_audit_case_fit_on_a_16_gb_card():
    # kvsim fit --gpu rtx-4060-ti-16gb --model gpt-oss-20b --weights mxfp4 --context 65536
    # (llama.cpp: unified pool, 4 slots, f16 KV, flash attention): all 24 layers on the
    # GPU, the token embedding (1,158,266,880 B) in host memory
    g, m = load_gpu("rtx-4060-ti-16gb"), load_model("gpt-oss-20b")
    b = memory_budget(g, m, "mxfp4", engine_for_gpu(
        {"preset": "llama.cpp", "ctx_size": 65536}, g, m))
    assert b.weights_total_bytes == OSS20_MXFP4
    assert b.gpu_layers == 24
    assert b.weights_cpu_bytes == 1_158_266_880
    assert b.weights_gpu_bytes == OSS20_MXFP4 - 1_158_266_880 == 12_581_670_912


def test_fit_names_its_own_flag_for_an_experts_only_format_on_a_dense_model(kvsim_cli):
    rc, err, out = kvsim_cli("fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                             "--weights", "mxfp4")
    assert (rc, out) == (2, "")
    assert err == ("error: --weights: 'mxfp4' — quantises MoE experts only, and llama-3.1-8b "
                   "has none; use a whole-model format (bf16, q8_0, q4_k_m, ...)")


GIB = 2**30


@pytest.mark.parametrize(("model", "printed_gib", "fmt"), [
    # llama-bench's size column for ggml-org's GGUFs (../shared/measurements/
    # speed-vs-load.csv SL0011, SL0021): 11.27 GiB is 12,101,014,487 B, 0.4 % above the
    # q8_0-beside-the-experts total (12,056,865,792) and 12 % below the bf16 one
    ("gpt-oss-20b", 11.27, "mxfp4_moe"),
    ("gpt-oss-120b", 59.02, "mxfp4_moe"),
    # a file of the bf16 layout (e.g. a converter's F16 output): 13.74 GB = 12.80 GiB
    ("gpt-oss-20b", 12.80, "mxfp4"),
])
def test_the_printed_file_size_says_what_sits_beside_the_experts(model, printed_gib, fmt):
    m = load_model(model)
    for named in ("mxfp4", "mxfp4_moe"):
        assert format_for_file(m, named, int(printed_gib * GIB)) == fmt


def test_a_whole_model_format_or_a_dense_model_keeps_its_format():
    assert format_for_file(load_model("gpt-oss-20b"), "q4_0", 11 * GIB) == "q4_0"
    assert format_for_file(load_model("llama-3.1-8b"), "q4_k_m", 4 * GIB) == "q4_k_m"
    assert format_for_file(load_model("llama-3.1-8b"), "mxfp4", 4 * GIB) == "mxfp4"
