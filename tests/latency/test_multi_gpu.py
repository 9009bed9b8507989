"""Step times on a box of several GPUs (kvsim.latency.multi_gpu, kvsim.latency.box):
each card's share at its own rates, the link between the cards, and the stretch path
agreeing with the per-step one."""

import numpy as np
import pytest

from kvsim.engines.budget import box_reserves, memory_budget
from kvsim.latency.base import BatchShape
from kvsim.latency.factory import make_latency_model
from kvsim.scenario import load_scenario

BASE = {"name": "box", "seed": 0, "model": "qwen3-32b",
        "workload": {"preset": "family-2", "days": 1},
        "latency": {"kind": "roofline", "rates": "peak"}}
PCIE4_HOST = (12.92e9, 15e-6)   # hardware_profiles/gpu_links/pcie4-x16-host.yaml
HIDDEN = 5120                    # qwen3-32b


def _context(engine: str, tokens: int) -> dict:
    """llama.cpp's -c (all slots' cells) is ctx_size; Ollama's num_ctx is context_tokens."""
    return {"ctx_size" if engine == "llama.cpp" else "context_tokens": tokens}


def _model(tmp_path, gpu, engine, weights, **knobs):
    import yaml
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**BASE, "gpu": gpu, "weights": weights,
                                 "engine": {"preset": engine, **_context(engine, 16384),
                                            **knobs}}))
    s = load_scenario(str(p))
    b = memory_budget(s.gpu, s.model, s.weights, s.engine, **box_reserves(s))
    return s, b, make_latency_model(s, b)


DECODE = BatchShape(decode_context=(3000,))


def test_two_equal_cards_in_a_layer_split_add_one_activation_copy(tmp_path):
    # llama.cpp runs the two halves one after the other: a memory-bound decode step reads
    # the same weights and KV as one card would (33 layers here, 31 and the head there),
    # so it takes one card's time plus one f32 hidden state (5120 x 4 B) over the link:
    # 15 us + 20,480 B / 12.92 GB/s.  -c 12288: one 3090 (23.58 GiB as CUDA reports it)
    # then holds every layer too (at 16384 its --fit leaves one on the CPU)
    _, b, box = _model(tmp_path, "2x rtx-3090", "llama.cpp", "q4_k_m", ctx_size=12288)
    _, o, one = _model(tmp_path, "rtx-3090", "llama.cpp", "q4_k_m", ctx_size=12288)
    assert o.gpu_layers == o.num_layers == 64
    assert b.split == "layer" and [d.layers for d in b.devices] == [33, 31]
    copy = PCIE4_HOST[1] + HIDDEN * 4 / PCIE4_HOST[0]
    assert box.step_time_s(DECODE) == pytest.approx(one.step_time_s(DECODE) + copy, rel=1e-12)
    assert "2x rtx-3090 (layer split, pcie4-x16-host)" in box.provenance


def test_tensor_ranks_halve_the_reads_and_pay_two_all_reduces_per_layer(tmp_path):
    # vLLM TP 2: each rank reads half of every matrix and 4 of the 8 KV heads, so its
    # part is half of one card's; the 64 layers add 2 ring all-reduces of the 16-bit
    # hidden state each (2 ranks: 2 x (15 us + 10,240 B / 2 / 12.92 GB/s)) and the last
    # gathers the sampled row's logits (151,936 x 2 B, half from the other rank)
    _, b, box = _model(tmp_path, "2x rtx-3090", "vllm", "awq")
    _, _, one = _model(tmp_path, "rtx-3090", "vllm", "awq")
    lat, bw = PCIE4_HOST[1], PCIE4_HOST[0]
    all_reduce = 2 * (lat + HIDDEN * 2 / 2 / bw)
    gather = lat + 151_936 * 2 / 2 / bw
    overhead = one.overhead_s
    want = overhead + (one.step_time_s(DECODE) - overhead) / 2 + 128 * all_reduce + gather
    assert b.split == "tensor"
    assert box.step_time_s(DECODE) == pytest.approx(want, rel=1e-12)


def test_the_slower_card_paces_its_own_layers(tmp_path):
    # a 3090 and a 3060 12 GB: each reads the weights it holds at its own bandwidth
    # (936 GB/s vs 360 GB/s x the same efficiency), so the 3060's 20 layers and head
    # cost about as much as the 3090's 44
    s, b, box = _model(tmp_path, "rtx-3090+rtx-3060-12gb", "llama.cpp", "q4_k_m")
    _, _, pair = _model(tmp_path, "2x rtx-3090", "llama.cpp", "q4_k_m")
    assert [d.layers for d in b.devices] == [44, 20]
    reads = [d.weights_bytes / (g.memory_bandwidth_bytes_per_s * g.bandwidth_efficiency)
             for d, g in zip(b.devices, s.gpus, strict=True)]
    assert reads[1] > 0.9 * reads[0]
    assert box.step_time_s(DECODE) > 1.4 * pair.step_time_s(DECODE)


def test_a_prompt_pipelines_its_ubatches_over_the_stages(tmp_path):
    # 2048 prompt tokens = 4 ubatches of 512: after the first has passed both GPUs, each
    # further one adds only the slower stage, so the step takes between 5/8 and 6/8 of
    # running the 4 ubatches through both stages one by one
    _, _, box = _model(tmp_path, "2x rtx-3090", "llama.cpp", "q4_k_m")
    ub = box.step_time_s(BatchShape(prefill_tokens=(512,), prefill_context=(0,)))
    whole = box.step_time_s(BatchShape(prefill_tokens=(2048,), prefill_context=(0,)))
    serial = 4 * (ub - box.overhead_s)
    assert 5 / 8 * serial < whole - box.overhead_s < 6 / 8 * serial


@pytest.mark.parametrize("engine, weights, knobs", [
    ("llama.cpp", "q4_k_m", {}), ("llama.cpp", "q4_k_m", {"split_mode": "row"}),
    ("ollama", "q4_k_m", {}), ("vllm", "awq", {"pipeline_parallel_size": 2}),
    ("sglang", "awq", {})])
def test_stretches_agree_with_steps(tmp_path, engine, weights, knobs):
    _, _, box = _model(tmp_path, "2x rtx-3090", engine, weights, **knobs)
    ctx = np.array([1000, 2500, 7000])
    stretch = box.decode_steps_s(ctx, 5)
    steps = [box.step_time_s(BatchShape(decode_context=tuple(int(c) + j for c in ctx)))
             for j in range(5)]
    assert np.array_equal(stretch, np.array(steps))


def test_a_moe_prompt_pays_its_experts_tiles_on_every_card(tmp_path):
    # kvsim.latency.rates.expert_tile_excess (the fitted CUDA rates): a 512-token prompt
    # of Qwen3-30B-A3B, compute-bound on both halves of a layer split, costs what it costs
    # on one card (plus the hidden state's copies): each card's experts tile their own
    # tokens (32 a used expert, 58 -> 79 ms here) and re-read its own weights per token
    # (GpuRates.reread_s_per_byte_token, +9 ms)
    import yaml
    docs = {}
    for gpu in ("2x rtx-3090", "rtx-3090"):
        p = tmp_path / "s.yaml"
        p.write_text(yaml.safe_dump({**BASE, "model": "qwen3-30b-a3b", "gpu": gpu,
                                     "weights": "q4_k_m", "latency": {"kind": "roofline"},
                                     "engine": {"preset": "llama.cpp", "ctx_size": 16384}}))
        s = load_scenario(str(p))
        docs[gpu] = make_latency_model(s, memory_budget(s.gpu, s.model, s.weights, s.engine,
                                                        **box_reserves(s)))
    prompt = BatchShape(prefill_tokens=(512,), prefill_context=(0,))
    one, box = docs["rtx-3090"], docs["2x rtx-3090"]
    assert one.rates.expert_tiles and one.gpu_expert_flops_per_token > 0
    assert one.reread_s * 512 * one.weight_bytes(512)[0] > 0.05 * one.step_time_s(prompt)
    assert box.step_time_s(prompt) == pytest.approx(one.step_time_s(prompt), rel=0.01)
