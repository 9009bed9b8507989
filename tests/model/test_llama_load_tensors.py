"""llama.cpp's load_tensors lines as `kvsim fit` prints them for one GPU."""

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import resolve_engine

MIB = 2**20


def _lines(**engine):
    eng = resolve_engine({"preset": "llama.cpp", "context_tokens": 8192, "parallel": 1,
                          **engine})
    b = memory_budget(load_gpu("rtx-4090"), load_model("llama-3.1-8b"), "q4_k_m", eng)
    return b, [x for x in b.log_lines if x.startswith("load_tensors:")]


def test_a_full_offload_counts_the_output_layer_and_maps_the_embedding():
    # Llama-3.1-8B Q4_K_M (tests/model/test_weights_edges.py): the token embedding
    # (Q4_K, 295,501,824 B = 281.81 MiB) stays in host memory; 32 layers of 130,793,566 B
    # and the Q6_K head, 430,940,160 B: 4,616,334,272 B = 4,402.48 MiB on the GPU
    b, lines = _lines()
    assert lines == ["load_tensors: offloaded 33/33 layers to GPU",
                     "load_tensors: CPU_Mapped model buffer size = 281.81 MiB",
                     "load_tensors: CUDA0 model buffer size = 4402.48 MiB"]
    assert b.weights_gpu_bytes == 32 * 130_793_566 + 430_940_160


def test_an_explicit_layer_count_leaves_the_head_on_the_cpu():
    # -ngl 20 places the output layer last: 20 of the 33 counted layers on the GPU
    b, lines = _lines(gpu_layers=20)
    assert lines[0] == "load_tensors: offloaded 20/33 layers to GPU"
    assert b.weights_gpu_bytes == 20 * 130_793_566
    gpu_mib = b.weights_gpu_bytes / MIB
    assert lines[2] == f"load_tensors: CUDA0 model buffer size = {gpu_mib:.2f} MiB"
    assert b.weights_cpu_bytes == 12 * 130_793_566 + 295_501_824 + 430_940_160
