"""vLLM's start-up arithmetic by release, against published start-up logs.

The figures are those of ../shared/measurements/engine-memory-logs.csv rows vllm-001 and
vllm-002 (vllm-project/vllm issue #10517, an RTX 3090 with Llama-3.1-8B in bf16 at
gpu_memory_utilization 0.90, a V0 release): total_gpu_memory 23.58 GiB, weights 14.9888
GiB, peak torch memory 17.06 GiB at max_model_len 20000 and 17.98 GiB at 29000,
non-torch 0.35 GiB; 1952 GPU blocks (start-up OK) and 1478 (start-up FAILED: 29000 >
23648 tokens).
"""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.config.device_memory import reported_total_bytes
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu, resolve_engine
from kvsim.engines.vllm_releases import batch_budget, parse_vllm_version, vllm_release
from kvsim.errors import InputError

GIB, MIB = 2**30, 2**20


def _budget(gpu: str, model: str, weights: str, **knobs):
    g, m = load_gpu(gpu), load_model(model)
    e = engine_for_gpu({"preset": "vllm", **knobs}, g, m, weights)
    return e, memory_budget(g, m, weights, e)


def test_v0_profiles_a_whole_max_model_len_so_activations_grow_with_it():
    e20, b20 = _budget("rtx-3090", "llama-3.1-8b", "bf16", version="0.6.4",
                       context_tokens=20000, gpu_memory_utilization=0.9)
    e29, b29 = _budget("rtx-3090", "llama-3.1-8b", "bf16", version="0.6.4",
                       context_tokens=29000, gpu_memory_utilization=0.9)
    assert (e20.max_num_batched_tokens, e29.max_num_batched_tokens) == (20000, 29000)
    # measured peak torch less weights: 17.06 - 14.9888 and 17.98 - 14.9888 GiB
    assert b20.activation_bytes / GIB == pytest.approx(17.06 - 14.9888, rel=0.01)
    assert b29.activation_bytes / GIB == pytest.approx(17.98 - 14.9888, rel=0.01)
    assert b20.num_gpu_blocks == pytest.approx(1952, rel=0.015) and b20.fits
    assert b29.num_gpu_blocks == pytest.approx(1478, rel=0.015)
    assert not b29.fits and "max seq len (29000) is larger" in b29.failure


def test_the_share_is_of_the_total_the_driver_reports():
    g = load_gpu("rtx-3090")
    assert reported_total_bytes(g) / GIB == pytest.approx(23.58, abs=0.005)
    _, b = _budget("rtx-3090", "llama-3.1-8b", "bf16", version="0.6.4",
                   context_tokens=20000, gpu_memory_utilization=0.9)
    assert b.extra["share_bytes"] == int(0.9 * g.cuda_total_bytes)
    assert b.device_bytes == g.cuda_total_bytes


def test_rule_for_cards_without_a_measured_total():
    # GDDR6X/GDDR6/GDDR7: 2 % kept (RTX 4090 measured 24080 of 24576 MiB = 2.0 %)
    assert reported_total_bytes(load_gpu("rtx-5090")) == int(32 * GIB * 0.98)
    # HBM: 1 % (an 80 GB card printed 79.22 GiB)
    assert reported_total_bytes(load_gpu("h100-sxm5-80gb")) / GIB == pytest.approx(79.2)
    # unified memory: the GPU's default limit, unchanged
    mac = load_gpu("apple-m3-max")
    assert reported_total_bytes(mac) == mac.usable_memory_bytes
    # AMD's ROCm reports the whole card: ollama-007 saw 24.0 GiB free on an idle 24 GiB
    # RX 7900 XTX-class card, where 2 % kept would leave 23.5 GiB
    amd = load_gpu("rx-7900-xtx")
    assert reported_total_bytes(amd) == amd.memory_bytes == 24 * GIB


def test_every_engine_lays_a_discrete_card_out_in_what_the_driver_reports():
    # llama.cpp prints its breakdown's total as CUDA reports it: 24,080 MiB on a 4090
    # (llamacpp-004), 8,107 MiB on a GTX 1080 (llamacpp-002); kvsim's slot engines now lay
    # the card out in that, not the marketed 24 / 8 GiB
    for gpu, total in (("rtx-4090", 24_080 * MIB), ("gtx-1080", 8_107 * MIB)):
        g = load_gpu(gpu)
        assert g.usable_memory_bytes == g.reported_memory_bytes == total
        llama = memory_budget(g, load_model("llama-3.1-8b"), "q4_k_m",
                              engine_for_gpu({"preset": "llama.cpp", "ctx_size": 4096}, g,
                                             load_model("llama-3.1-8b")))
        assert llama.device_bytes == total


def test_v1_budget_is_the_chunked_prefill_budget_whatever_the_context():
    e, b = _budget("rtx-3090", "llama-3.1-8b", "bf16", version="0.10.1",
                   context_tokens=20000, gpu_memory_utilization=0.9)
    assert (e.max_num_batched_tokens, e.max_num_seqs) == (2048, 256)
    _, b29 = _budget("rtx-3090", "llama-3.1-8b", "bf16", version="0.10.1",
                       context_tokens=29000, gpu_memory_utilization=0.9)
    # the profiling pass's peak is its sampler's, the same at both: 256 rows x 128,256 x
    # 38 B + 2048 x 4096 x 2 B of hidden states (V0's 20000-token forward: 2.06 GiB)
    assert b.activation_bytes == b29.activation_bytes == 1_264_451_584
    assert b.num_gpu_blocks > 2400  # V1 keeps ~0.9 GiB more for KV than V0 did at 20000


def test_graphs_come_out_of_the_share_from_0_21():
    _, old = _budget("rtx-3090", "llama-3.1-8b", "bf16", version="0.20.0",
                     context_tokens=8192, gpu_memory_utilization=0.9)
    _, new = _budget("rtx-3090", "llama-3.1-8b", "bf16", version="0.21.0",
                     context_tokens=8192, gpu_memory_utilization=0.9)
    graphs = resolve_engine("vllm").cuda_graph_bytes
    assert old.extra["kv_pool_bytes"] - new.extra["kv_pool_bytes"] == graphs
    assert new.total_bytes == old.total_bytes - (old.kv_reserved_bytes - new.kv_reserved_bytes)


def test_v0_long_context_turns_chunked_prefill_on_and_v0_has_no_null_block():
    v0 = vllm_release("0.7.3")
    assert batch_budget(v0, 32768, None) == (32768, 256)
    assert batch_budget(v0, 32769, None) == (512, 256)
    assert batch_budget(vllm_release("0.8.0"), 32769, load_gpu("h100-sxm5-80gb")) == (8192, 1024)
    assert batch_budget(vllm_release("0.8.0"), 32769, load_gpu("a100-80gb-sxm4")) == (2048, 256)
    from kvsim.engines import engine_for
    vllm = engine_for("vllm")
    assert not vllm.null_block(resolve_engine({"preset": "vllm", "version": "0.7.3"}))
    assert vllm.null_block(resolve_engine({"preset": "vllm", "version": "0.8.0"}))


def test_an_explicit_knob_wins_over_the_release():
    e = resolve_engine({"preset": "vllm", "version": "0.6.4", "context_tokens": 20000,
                        "max_num_batched_tokens": 4096, "gpu_memory_utilization": 0.8})
    assert (e.max_num_batched_tokens, e.gpu_memory_utilization) == (4096, 0.8)


@pytest.mark.parametrize("text,want", [("0.6.4", (0, 6, 4)), ("v0.10.1.dev101+gbda9d0535",
                                       (0, 10, 1)), ("0.19", (0, 19, 0))])
def test_release_names(text, want):
    assert parse_vllm_version(text) == want


def test_a_release_newer_than_kvsim_describes_is_refused():
    # the newest described (VLLM_LATEST 0.24.0) and a dev build of it are known; 0.24.1 and
    # 0.25 are not, and are no longer taken as 0.24.0
    assert resolve_engine({"preset": "vllm", "version": "0.24.0.dev3"}).version == "0.24.0.dev3"
    for newer in ("0.24.1", "0.25", "1.0.0"):
        with pytest.raises(InputError) as exc:
            resolve_engine({"preset": "vllm", "version": newer})
        assert str(exc.value) == (
            f"engine.version: '{newer}' — a vLLM release kvsim describes: V0 up to 0.7.3, V1 "
            "from 0.8.0, V1 from 0.21.0 (CUDA graphs in the budget), up to 0.24.0 "
            "(docs/reference/engines.md §1.9); a newer release's start-up arithmetic is not "
            "described")


@pytest.mark.parametrize("spec,match", [
    ({"preset": "vllm", "version": "V1"}, "engine.version.*MAJOR.MINOR"),
    ({"preset": "vllm", "version": 0.6}, "engine.version"),
    ({"preset": "sglang", "version": "0.4.6"}, "version.*one SGLang release"),
])
def test_bad_releases(spec, match):
    with pytest.raises(InputError, match=match):
        resolve_engine(spec)


def _rank_peak(gpus: str, model: str, weights: str, tp: int, **knobs) -> int:
    g, m = load_gpu(gpus), load_model(model)
    e = engine_for_gpu({"preset": "vllm", "tensor_parallel_size": tp, **knobs}, g, m,
                       weights, more_gpus=(g,) * (tp - 1))
    b = memory_budget(g, m, weights, e, more_gpus=(g,) * (tp - 1))
    peaks = {d.compute_bytes for d in b.devices} if b.devices else {b.activation_bytes}
    assert len(peaks) == 1  # NOTE: every tensor rank runs the sampler on the whole vocabulary
    return peaks.pop()


def test_the_sampler_pass_sets_the_peak_of_a_large_vocabulary():
    # vLLM PR #21429's debug line (rank 2 of Qwen3-235B-A22B-FP8 at TP 4 on H200s, V1's
    # defaults above 70 GiB: 8,192 batched tokens, 1,024 sequences): "torch peak memory
    # increase: 5.62GiB" — 1,024 rows x 151,936 x 38 B + 8,192 x 4,096 x 2 B; the MoE
    # forward (its experts 1/4 wide on each rank) is far less
    peak = _rank_peak("h200-sxm-141gb", "qwen3-235b-a22b", "fp8", 4, context_tokens=40960,
                      version="0.10.0")
    assert peak == 1024 * 151_936 * 38 + 8192 * 4096 * 2
    assert peak / GIB == pytest.approx(5.62, rel=0.01)  # 38.4 B a logit, kept whole


def test_the_sampler_pass_peak_holds_on_a_v0_log_it_was_not_taken_from():
    # vllm-020 (PR #10511's check, a V0 build, one 80 GB card, Meta-Llama-3-8B at 8192):
    # "PyTorch activation peak memory=1.26GiB"; V0's 8,192-token forward (0.84 GiB) is
    # below its sampler over 256 rows x 128,256
    peak = _rank_peak("h100-sxm5-80gb", "llama-3-8b", "bf16", 1, context_tokens=8192,
                      version="0.6.4", gpu_memory_utilization=0.9)
    assert peak == 256 * 128_256 * 38 + 8192 * 4096 * 2
    assert peak / GIB == pytest.approx(1.26, rel=0.04)
