"""Era A's compute-graph estimate (kvsim.engines._ollama_graph): Ollama's per-architecture
``GraphSize`` beside the figures its logs print, and how the estimator charges the two
graphs (``llm/memory.go``)."""
import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines._ollama_graph import graph_sizes
from kvsim.engines._ollama_place import era_a_graphs, estimate_layers
from kvsim.engines.budget import memory_budget
from kvsim.engines.ollama_releases import ollama_arch
from kvsim.engines.resolve import resolve_engine
from kvsim.model.weights import model_weights

MIB, GIB = 2**20, 2**30


def _graphs(name: str, ctx: int, weights: str = "q4_k_m", parallel: int = 1,
            flash_attn: bool = False, kv: int = 0) -> tuple[int, int]:
    m = load_model(name)
    return graph_sizes(m, ollama_arch(m), model_weights(m, weights), kv, ctx * parallel, 512,
                       parallel, flash_attn)


def test_qwen2_graphs_are_what_ollama_printed():
    # ollama/ollama issue #5913 (engine-memory-logs.csv ollama-007): dolphin-qwen2 72B,
    # ctx 2048, batch 512 printed memory.graph.full=313.0 MiB, memory.graph.partial=1.3 GiB.
    # qwen2 case, e 8192, h 64, vocab 152,064:
    #   full    max(4b(e+v), 4b(1+2e+c+c h)) = max(328,204,288, 306,186,240) = 313.0 MiB exactly
    #   partial 4b(e+v) + e v 105/128 = 328,204,288 + 1,021,870,080 = 1,350,074,368 (1.26 GiB)
    partial, full = _graphs("qwen2-72b", 2048, "q4_k_s")
    assert full == 328_204_288 == 313 * MIB
    assert partial == 1_350_074_368 and f"{partial / GIB:.1f}" == "1.3"


def test_llama_graphs_grow_with_the_context_above_the_vocabulary_floor():
    # llama case, Llama 3 8B (e 4096, h 32, hkv 8, head 128, vocab 128,256), b 512:
    #   c 8192: full 4b(1 + 4e + c(1+h)) = 587,204,608 (560.0 MiB);
    #   partial 4b e + max(4b(1+e+c) + e e 9/16 + 4c(b h + 128 x 8) = 605,030,400,
    #                      4b(e+v) + e v 105/128 = 701,997,056) = 710,385,664 (677.5 MiB)
    assert _graphs("llama-3-8b", 8192) == (710_385_664, 587_204_608)
    assert (round(587_204_608 / MIB, 1), round(710_385_664 / MIB, 1)) == (560.0, 677.5)
    # c 2048: the vocabulary floor 4b(e + v) binds the full graph (PR #6260's, for Llama 3.1)
    assert _graphs("llama-3-8b", 2048)[1] == 4 * 512 * (4096 + 128_256)
    # four slots of 8192 are one context of 32,768 cells
    assert _graphs("llama-3-8b", 8192, parallel=4) == _graphs("llama-3-8b", 32_768)


def test_an_architecture_without_a_case_takes_the_fallback_for_both():
    # qwen3 has no GraphSize case: GQA x KV / 6 (llm/memory.go)
    kv = 36 * 4096 * 256 * 8 * 2
    assert _graphs("qwen3-8b", 4096, kv=kv) == (32 // 8 * kv // 6,) * 2


def test_gpt_oss_doubles_the_fallback_or_takes_a_flat_size_with_flash_attention():
    kv = 10 * GIB
    assert _graphs("gpt-oss-20b", 8192, "mxfp4_moe", kv=kv) == (2 * 64 // 8 * kv // 6,) * 2
    # flash attention: (4 x parallel + c / 1024 + 110) MiB
    assert _graphs("gpt-oss-20b", 8192, "mxfp4_moe", parallel=2, flash_attn=True, kv=kv) == \
        ((8 + 16 + 110) * MIB,) * 2


def test_mixtral_prices_its_expert_tensor():
    # the llama case's ffn_gate_exps branch: 3 x the gate tensor (a third of the layer's
    # routed experts) + 4b(2 ff + hkv + e + c + 128 hkv), against the attention term
    m = load_model("mixtral-8x7b")
    ws = model_weights(m, "q4_k_m")
    gate, ff, c, b = ws.expert_bytes_per_layer // 3, m.moe_intermediate_size \
        or m.ffn_intermediate_size, 4096, 512
    partial, full = _graphs("mixtral-8x7b", c)
    assert partial == max(3 * gate + 4 * b * (2 * ff + 8 + 4096 + c + 128 * 8),
                          4 * (c * b * 32 + c * 128 * 8 + b * 1024 + 128 * 8 * b))
    assert full == max(4 * b * (1 + 4 * 4096 + c * 33), 4 * b * (4096 + 32_000))  # llama's


def test_metal_charges_the_full_graph_and_a_box_the_partial_one():
    m = load_model("qwen2-72b")
    eng = resolve_engine({"preset": "ollama", "context_tokens": 2048, "ollama_version": "0.5.7"})
    ws = model_weights(m, "q4_k_s")
    partial, full = era_a_graphs(m, eng, ws, 0, 1, False)
    assert era_a_graphs(m, eng, ws, 0, 1, True) == (full, full)
    assert era_a_graphs(m, eng, ws, 0, 2, False) == (partial, partial)


def test_the_full_graph_is_charged_only_when_every_layer_found_a_gpu():
    # 8 layers of 1 GiB and a 1 GiB head; graphs (partial 2 GiB, full 1 GiB): placing keeps
    # the larger one free, the charge is the full one only when all 8 and the head fit
    big = estimate_layers([20 * GIB], GIB, GIB, (2 * GIB, GIB), 0, 0, 8)
    assert big.fully_loaded and big.allocations == (GIB + 8 * GIB + GIB + GIB,)
    small = estimate_layers([9 * GIB], GIB, GIB, (2 * GIB, GIB), 0, 0, 8)
    assert not small.fully_loaded and small.counts == (5,)  # 1 + 5 + 1 + 2 (larger) <= 9
    assert small.allocations == (GIB + 5 * GIB + 2 * GIB,)
    # num_gpu = 8 leaves the head out: not fully loaded (the partial graph charged), and
    # the head counted as overflow (llm/memory.go since its vision-tower rework)
    some = estimate_layers([20 * GIB], GIB, GIB, (2 * GIB, GIB), 0, 0, 8, requested=8)
    assert not some.fully_loaded and some.overflow_bytes == GIB and some.output == -1
    assert some.allocations == (GIB + 8 * GIB + 2 * GIB,)


def test_an_era_a_start_up_prints_both_graphs():
    eng = resolve_engine({"preset": "ollama", "context_tokens": 2048, "ollama_version": "0.5.7"})
    b = memory_budget(load_gpu("rx-7900-xtx"), load_model("qwen2-72b"), "q4_k_s", eng)
    est = b.estimate
    assert (est.graph_full_bytes, est.graph_partial_bytes) == (328_204_288, 1_350_074_368)
    assert est.graph_bytes == est.graph_partial_bytes  # 72B does not fit 24 GiB: partial
    assert "memory.graph.full=313.00 MiB memory.graph.partial=1.26 GiB" in b.log_lines[0]


@pytest.mark.parametrize("name", ["qwen2-72b", "llama-3-8b", "gemma-2-9b", "command-r-v01"])
def test_each_case_prices_a_longer_context_no_cheaper(name):
    short, long = _graphs(name, 2048), _graphs(name, 32_768)
    assert long[0] >= short[0] and long[1] >= short[1] and long[1] > short[1]


def test_gemma3_and_gpt_oss_size_their_sliding_layers_apart():
    # GraphSize's own cases: gemma3's sliding layers hold parallel x window + batch cells
    # (Gemma 3 27B, 8192 tokens: 10 global layers x 64 MiB + 52 x (1024 + 512) x 256 x 16
    # x 2 B = 640 + 624 MiB), gpt-oss's parallel x 4096 + batch (20B: 12 x 16 MiB + 12 x
    # 4608 x 128 x 8 x 2 B = 192 + 108 MiB); its graph is twice the fallback of the KV
    # summed before those cases (24 x 16 MiB: 16 x 384 MiB / 6 = 1024 MiB)
    from kvsim.engines._ollama_graph import estimated_kv

    eng = resolve_engine({"preset": "ollama", "context_tokens": 8192, "ollama_version": "0.9.0",
                          "parallel": 1})
    assert estimated_kv(load_model("gemma-3-27b"), eng, "f16") == (640 + 624) * MIB
    oss = load_model("gpt-oss-20b")
    assert estimated_kv(oss, eng, "f16") == (192 + 108) * MIB
    assert estimated_kv(oss, eng, "f16", windows=False) == 24 * 16 * MIB
    b = memory_budget(load_gpu("rtx-3090"), oss, "mxfp4_moe", eng)
    assert b.estimate.kv_bytes == 300 * MIB
    assert (b.estimate.graph_partial_bytes, b.estimate.graph_full_bytes) == (1024 * MIB,) * 2
    assert not any("under-counts" in n for n in b.notes)  # f16: no cache type to blame


def test_gemma3s_vision_tower_goes_with_the_output_layer():
    # VisionGraphSize: the tower's "v." tensors (matrices 16-bit, biases and norms f32:
    # 795.9 MiB for Gemma 3's SigLIP, its projector's "mm." tensors not among them) and
    # one image's graph, 4 x (896² x 3 + 1152 x 14 + 4096² x 16) = 1.0 GiB; Ollama places
    # them with the output layer, so a card that holds every layer but not the three
    # offloads 48 of 49 (ollama-001's figures: tests/validate/test_memlogs_unnamed.py)
    from kvsim.engines._ollama_graph import projector_sizes

    m = load_model("gemma-3-12b")
    weights, graph = projector_sizes(m, "gemma3")
    assert (weights, graph) == (834_531_264, 1_083_440_128)
    assert f"{weights / MIB:.1f}" == "795.9" and f"{graph / GIB:.1f}" == "1.0"
    assert projector_sizes(load_model("llama-3.1-8b"), "llama") == (0, 0)
    eng = resolve_engine({"preset": "ollama", "context_tokens": 8192, "ollama_version": "0.9.0",
                          "parallel": 1})
    others = 12 * GIB - round(11.1 * GIB)  # ollama-001's 11.1 GiB free of 12
    b = memory_budget(load_gpu("rtx-3060-12gb"), m, "q4_k_m", eng, display_reserve_bytes=others)
    est = b.estimate
    assert (est.projector_weights_bytes, est.projector_graph_bytes) == (weights, graph)
    head = model_weights(m, "q4_k_m").head_bytes
    assert est.gpu_layers == 48 and est.split == (48,)  # the last layer stays off: it
    assert est.full_bytes - est.total_bytes == head + weights + graph  # overflowed whole
    assert any("vision tower" in n for n in b.notes)
    whole = memory_budget(load_gpu("rtx-4060-ti-16gb"), m, "q4_k_m", eng).estimate
    assert whole.gpu_layers == 48 and whole.full_bytes == whole.total_bytes  # all 49 fit


def test_each_layer_costs_its_own_kv():
    # llm/memory.go of 2025 sizes layer i as its weights plus kv[i]: Gemma 3's global
    # layers (every sixth) hold the whole context, its sliding ones a window; the buffer
    # charged up front is layer 0's
    from kvsim.engines._ollama_graph import kv_by_layer

    eng = resolve_engine({"preset": "ollama", "context_tokens": 8192, "ollama_version": "0.9.0",
                          "parallel": 1})
    kv = kv_by_layer(load_model("gemma-3-12b"), eng, "f16")
    assert len(kv) == 48 and sum(kv) == 992 * MIB
    assert {i for i, k in enumerate(kv) if k == 64 * MIB} == set(range(5, 48, 6))
    assert kv[0] == 12 * MIB
    assert kv_by_layer(load_model("llama-3.1-8b"), eng, "f16") == [32 * MIB] * 32
    # one size a layer: 9 GiB free holds the 1 GiB buffer (layer 0), then, the 2 GiB
    # graph kept free, layers 7, 6, 5 (1 GiB each) and 4 (2 GiB: 6 + 2 + 2 = 10 > 9 only
    # for the next): layer 3 (2 GiB) does not fit, so it and layers 2..0 overflow
    sized = estimate_layers([9 * GIB], [GIB, GIB, GIB, 2 * GIB, 2 * GIB, GIB, GIB, GIB], 0,
                            (2 * GIB, GIB), 0, 0, 8)
    assert sized.counts == (4,) and sized.overflow_bytes == 2 * GIB + 3 * GIB


def test_an_output_layer_the_estimate_left_off_stays_on_the_cpu_and_slows_decode():
    # Ollama's engine gives the GPU the output layer only with -ngl above the layer count
    # (ml/backend/ggml: gpuRangeStop = min(start + NumGPULayers, blocks + 1)): with the
    # estimate at 48 of Gemma 3 12B's 49, its tied output tensor (the 262k-token table)
    # stays in host memory, and every decode step reads it there
    from dataclasses import replace

    from kvsim.core.build import scenario_budget
    from kvsim.latency.base import BatchShape
    from kvsim.latency.factory import make_latency_model
    from kvsim.scenario import resolve_scenario

    sc = resolve_scenario({"name": "g", "gpu": "rtx-3060-12gb", "model": "gemma-3-12b",
                           "weights": "q4_k_m", "display_reserve_bytes": "0.9 GiB",
                           "engine": {"preset": "ollama", "ollama_version": "0.9.0",
                                      "context_tokens": 8192, "parallel": 1},
                           "workload": {}})
    b = scenario_budget(sc)
    ws = model_weights(load_model("gemma-3-12b"), "q4_k_m")
    assert (b.gpu_layers, b.head_on_gpu) == (48, False)
    assert b.weights_gpu_bytes == 48 * ws.per_layer_bytes
    step = BatchShape(decode_context=(1000,))
    off = make_latency_model(sc, b).step_time_s(step)
    on = make_latency_model(sc, replace(b, head_on_gpu=True)).step_time_s(step)
    assert off - on > ws.head_bytes / sc.host.memory_bandwidth_bytes_per_s / 2


def test_the_vision_tower_loads_where_the_output_layer_is():
    # ml/backend/ggml creates the "v." / "mm." tensors on the output layer's buffer type:
    # with the output layer on a 24 GB card, the GPU holds the 48 layers, the tied output
    # table's copy and the tower's 795.9 MiB; with it left off (11.1 GiB free of a 12 GB
    # card), the host holds the tower beside the token table
    from kvsim.engines._ollama_graph import projector_sizes

    m = load_model("gemma-3-12b")
    ws, tower = model_weights(m, "q4_k_m"), projector_sizes(m, "gemma3")[0]
    eng = resolve_engine({"preset": "ollama", "context_tokens": 8192, "ollama_version": "0.9.0",
                          "parallel": 1})
    whole = memory_budget(load_gpu("rtx-4090"), m, "q4_k_m", eng)
    assert whole.head_on_gpu and whole.weights_gpu_bytes == \
        48 * ws.per_layer_bytes + ws.head_bytes + tower
    assert whole.weights_cpu_bytes == ws.embedding_bytes
    off = memory_budget(load_gpu("rtx-3060-12gb"), m, "q4_k_m", eng,
                        display_reserve_bytes=12 * GIB - round(11.1 * GIB))
    assert not off.head_on_gpu and off.weights_cpu_bytes == ws.embedding_bytes + tower
    # llama.cpp serving the same GGUF loads no tower (its mmproj is a separate file)
    cpp = memory_budget(load_gpu("rtx-4090"), m, "q4_k_m",
                        resolve_engine({"preset": "llama.cpp", "ctx_size": 8192}))
    assert cpp.weights_gpu_bytes == 48 * ws.per_layer_bytes + ws.head_bytes
