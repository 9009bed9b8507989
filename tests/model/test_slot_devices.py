"""llama.cpp and Ollama over several GPUs: which GPU holds which layer, its KV buffer,
weights and compute buffer, and --fit / Ollama's placement over the devices
(docs/reference/engines.md §3.8, §4.2-§4.3; kvsim.engines._slot_devices, _slot_box,
_ollama_place)."""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines._ollama_place import estimate_layers, pack_layers
from kvsim.engines._slot_devices import place, slot_homes, split_points
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu
from kvsim.errors import InputError
from kvsim.model.compute_buffer import llama_cpp_compute_bytes, llama_cpp_logits_bytes

MIB, GIB = 2**20, 2**30
RTX3090, RTX3060 = load_gpu("rtx-3090"), load_gpu("rtx-3060-12gb")
QWEN3_32B = load_model("qwen3-32b")   # 64 layers, 8 KV heads x 128: 4,096 B/token/layer f16
DRIVER = 400 * MIB                    # the default CUDA-context reserve per GPU
# qwen3-32b (32.8e9 params, hidden 5120, 64 q / 8 kv heads x 128, vocab 151,936, untied) as
# llama-quantize lays it out (kvsim.model.gguf_mix): a layer (32.8e9 - 2 x 777,912,320) / 64
# = 488,190,240 params: Q, K, O 5120 x (64 + 8 + 64) x 128 = 89,128,960 at the base type;
# V 5,242,880 and ffn_down Q6_K 6.5625 bpw in 32 of 64 layers (use_more_bits), the base
# type in the rest; the FFN 393,818,400 = 2/3 gate/up + 1/3 down; head Q6_K:
#   q4_k_m (Q4_K 4.5): 89,128,960 x 4.5/8 = 50,135,040 + V x 5.53125/8 = 3,624,960
#     + FFN x (2/3 x 4.5 + 1/3 x 5.53125 = 4.84375)/8 = 238,444,734.4 -> 292,204,734 B
#   q5_k_m (Q5_K 5.5): 89,128,960 x 5.5/8 = 61,276,160 + V x 6.03125/8 = 3,952,640
#     + FFN x (2/3 x 5.5 + 1/3 x 6.03125 = 5.677083)/8 = 279,467,484.4 -> 344,696,284 B
#   head 777,912,320 x 6.5625/8 = 638,131,200 B in both
Q4_LAYER, Q4_HEAD = 292_204_734, 638_131_200   # qwen3-32b q4_k_m: a layer, the output head
Q5_LAYER, Q5_HEAD = 344_696_284, 638_131_200   # q5_k_m


def _box(spec, gpus=(RTX3090, RTX3090), weights="q5_k_m", model=QWEN3_32B):
    e = engine_for_gpu({"preset": "llama.cpp", **spec}, gpus[0], model, weights=weights,
                       more_gpus=gpus[1:])
    return memory_budget(gpus[0], model, weights, e, more_gpus=gpus[1:])


def test_split_points_are_float32_upper_bounds():
    # llama.cpp: slot k of 65 (64 layers + output) goes to the first device whose split
    # point exceeds k/65; two equal cards: 32/65 = 0.492 < 0.5 <= 33/65 -> 33 and 32 slots
    homes = slot_homes(split_points([1, 1]), 65)
    assert (homes.count(0), homes.count(1), homes[-1]) == (33, 32, 1)
    # Ollama's counts as the tensor split land exactly (22/65 is the same float32 twice)
    homes = slot_homes(split_points([22, 22, 21]), 65)
    assert [homes.count(d) for d in range(3)] == [22, 22, 21]
    # a device with a 0 share holds nothing; the output layer goes to the last with one
    p = place(split_points([30, 35, 0]), 64, 64, True)
    assert (p.held(2), p.output, len(p.held(0))) == ([], 1, 30)


def test_layer_split_two_rtx_3090_kv_buffers_exact():
    # -c 32768 (4 unified slots), f16: a layer's KV = 32768 x 4,096 = 134,217,728 (128 MiB).
    # Equal free memory: CUDA0 holds layers 0-32 (33), CUDA1 layers 33-63 (31) and the output
    b = _box({"ctx_size": 32768})
    d0, d1 = b.devices
    assert (b.split, d0.layers, d1.layers, d1.holds_output) == ("layer", 33, 31, True)
    assert (d0.kv_bytes, d1.kv_bytes) == (33 * 128 * MIB, 31 * 128 * MIB)  # 4224 / 3968 MiB
    assert (d0.weights_bytes, d1.weights_bytes) == (33 * Q5_LAYER, 31 * Q5_LAYER + Q5_HEAD)
    # each GPU's compute buffer: the masks and hidden states of its layers; the logits
    # (512 x 151,936 x 4 B) only where the output layer is
    whole = llama_cpp_compute_bytes(QWEN3_32B, 512, 32768, True)
    logits = llama_cpp_logits_bytes(QWEN3_32B, 512)
    assert (d0.compute_bytes, d1.compute_bytes) == (whole - logits, whole)
    assert d0.overhead_bytes == d1.overhead_bytes == DRIVER
    assert b.kv_reserved_bytes == 64 * 128 * MIB and b.kv_pool_tokens == 32768
    assert "llama_kv_cache: CUDA0 KV buffer size = 4224.00 MiB" in b.log_lines
    assert "llama_kv_cache: CUDA1 KV buffer size = 3968.00 MiB" in b.log_lines


def test_tensor_split_and_split_modes():
    # --tensor-split 3,1: points 0.75, 1 -> slots 0-48 (48/65 = 0.738) on CUDA0
    b = _box({"ctx_size": 32768, "tensor_split": [3, 1]})
    assert [d.layers for d in b.devices] == [49, 15]
    # row: every matrix split by the cards' total memory (equal: half each); each layer's
    # KV and compute stay on its home device, placed as the layer split places it
    r = _box({"ctx_size": 32768, "split_mode": "row"})
    assert r.split == "row" and [d.kv_bytes for d in r.devices] == [33 * 128 * MIB,
                                                                   31 * 128 * MIB]
    assert [d.weights_bytes for d in r.devices] == [int(0.5 * (64 * Q5_LAYER + Q5_HEAD))] * 2
    # none: --main-gpu 1 holds everything (its --fit leaves 17 layers on the CPU), GPU 0
    # nothing
    n = _box({"ctx_size": 32768, "split_mode": "none", "main_gpu": 1})
    assert n.split == "none" and n.devices[0].total_bytes == 0
    assert n.devices[1].layers == n.gpu_layers == 47


def test_fit_fills_back_to_front_on_a_3090_and_a_3060():
    # -c 65536 q4_k_m: a layer 292,204,734 + KV 65536 x 4,096 = 560,640,190 B.  The default
    # split by free memory (0.671) overfills the 3060, so --fit fills from the last device,
    # each leaving the 1 GiB target free of what CUDA reports (kvsim.config.device_memory):
    #   CUDA1 (12,627,203,850 - 1 GiB = 11,553,462,026): 400 MiB + 17 layers + head
    #     638,131,200 + compute 420,216,832 = 11,008,661,662 (18: 11,569,301,852)
    #   CUDA0 (25,318,832,209 - 1 GiB = 24,245,090,385): 400 MiB + 42 layers + compute
    #     less logits 109,051,904 = 24,075,370,284 (43: 24,636,010,474)
    # and the first 5 layers run on the CPU
    b = _box({"ctx_size": 65536}, gpus=(RTX3090, RTX3060), weights="q4_k_m")
    assert [(d.layers, d.holds_output) for d in b.devices] == [(42, False), (17, True)]
    assert [d.total_bytes for d in b.devices] == [24_075_370_284, 11_008_661_662]
    assert b.gpu_layers == 59 and b.kv_cpu_bytes == 5 * 65536 * 4096
    assert any("only 59/64 layers" in n for n in b.notes)
    # at -c 32768 the default split (44 + 20 layers) keeps both targets: unchanged
    ok = _box({"ctx_size": 32768}, gpus=(RTX3090, RTX3060), weights="q4_k_m")
    assert [d.layers for d in ok.devices] == [44, 20] and not ok.notes


def test_one_gpu_over_its_memory_refuses_the_start_naming_it():
    b = _box({"ctx_size": 131072, "gpu_layers": 64, "tensor_split": [1, 0]})
    assert not b.fits and b.failure.startswith("CUDA0 (rtx-3090): cudaMalloc failed")


def test_ollama_era_a_spreads_layers_round_robin_over_three_gpus():
    # ollama-006 (ollama #10740): 0.6.8, qwen3-32b q6_k, num_ctx 32768, 3 x RTX 3090.
    # llm/memory.go: KV 32768 x 256 x 8 x 2 B = 134,217,728 per layer (8 GiB in all),
    # graph (64 // 8) x 8 GiB // 6 = 11,453,246,122 on each GPU (several GPUs: the partial
    # graph); each GPU is charged 457 MiB and one layer as a buffer; layers 63..0 go to
    # gpus[i % 3] (22 / 21 / 21) and the output layer to gpus[64 % 3] = 1.
    # memory.required.full = 3 x (457 MiB + graph) + 67 layers + head = 72,259,448,290 B
    # = 67.30 GiB: the log printed 67.3 GiB.
    layer = 400_468_556 + 134_217_728
    full = 3 * (457 * MIB + 11_453_246_122) + 67 * layer + 638_131_200
    e = engine_for_gpu({"preset": "ollama", "ollama_version": "0.6.8",
                        "context_tokens": 32768}, RTX3090, QWEN3_32B, weights="q6_k",
                       more_gpus=(RTX3090, RTX3090))
    b = memory_budget(RTX3090, QWEN3_32B, "q6_k", e, more_gpus=(RTX3090, RTX3090))
    est = b.estimate
    assert e.parallel == 1   # auto: 2 slots would not fit whole, so 1 (§4.1)
    assert (est.split, est.kv_bytes, est.graph_bytes) == ((22, 22, 21), 8 * GIB,
                                                          11_453_246_122)
    assert est.full_bytes == est.total_bytes == full == 72_259_448_290
    assert "memory.required.full=67.30 GiB" in b.log_lines[0]
    # the runner lays them out as llama.cpp with --tensor-split 22,22,21
    assert [d.layers for d in b.devices] == [22, 22, 20]


def test_ollama_eras_b_c_pack_onto_the_fewest_gpus():
    # llm/server.go assignLayers: two GPUs hold all 65 layers, so the third gets none; the
    # capacity factor is the smallest that keeps them all (33 and 32 of equal cards)
    a = pack_layers([24 * GIB] * 3, [GIB] * 3, 600 * MIB, 600 * MIB, 64)
    assert (a.split, a.output) == ((33, 32, 0), 1) or (a.split, a.output) == ((32, 33, 0), 1)
    # era A's estimate with too little room places what fits and overflows the rest
    e = estimate_layers([4 * GIB], GIB, GIB, (0, 0), 0, 0, 8)
    assert (e.counts, e.output) == ((2,), -1) and e.overflow_bytes == 6 * GIB + GIB


def test_split_knobs_that_do_not_match_the_box_are_one_line():
    with pytest.raises(InputError, match="one share per GPU: 2 value"):
        _box({"ctx_size": 8192, "tensor_split": [1, 1, 1]})


@pytest.mark.parametrize("shares", [[1e308, 1e308], [-1, 2], [0, 0]])
def test_split_shares_a_32_bit_float_cannot_hold_are_one_line(shares):
    # llama.cpp reads --tensor-split as 32-bit floats and sums them: 1e308 overflowed
    # kvsim's float32 cumulative sum (a RuntimeWarning and a layout of NaN split points)
    with pytest.raises(InputError, match="each from 0 to 1e30, summing to more than 0"):
        _box({"ctx_size": 8192, "tensor_split": shares})
    with pytest.raises(InputError, match="tensor_split.0: inf — Input should be a finite"):
        _box({"ctx_size": 8192, "tensor_split": [float("inf"), 1]})


def test_fit_refuses_a_share_above_1e30(kvsim_cli):
    rc, err, out = kvsim_cli("fit", "--gpu", "2x rtx-3090", "--model", "llama-3.1-8b",
                             "--tensor-split", "1e308,1e308")
    assert (rc, out) == (2, "")
    assert err == ("error: --tensor-split: '1e308,1e308' — one share per GPU from 0 to "
                   "1e30, comma-separated, not all 0 (e.g. '3,1')")
