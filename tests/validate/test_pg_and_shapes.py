"""llama-bench's ``-pg`` test priced as its two halves, and model_types that name several
catalogue models of one shape ("llama 8B": Llama 3 8B and 3.1 8B)."""

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.latency.base import BatchShape
from kvsim.validate.llamabench import read_bench
from kvsim.validate.predict import Setup, one_shape, predicted_tps, setup_for, step_batches
from kvsim.validate.records import Measurement

PASTED = """\
ggml_cuda_init: found 1 CUDA devices:
  Device 0: NVIDIA GeForce RTX 3090, compute capability 8.6, VMM: yes
| model                          |       size |     params | backend    | ngl | fa |            test |                  t/s |
| ------------------------------ | ---------: | ---------: | ---------- | --: | -: | --------------: | -------------------: |
| llama 8B Q4_K - Medium         |   4.58 GiB |     8.03 B | CUDA       |  99 |  1 |           pp512 |       4500.00 ± 3.00 |
| llama 8B Q4_K - Medium         |   4.58 GiB |     8.03 B | CUDA       |  99 |  1 |           tg128 |        125.00 ± 0.10 |
| llama 8B Q4_K - Medium         |   4.58 GiB |     8.03 B | CUDA       |  99 |  1 |    pp4096+tg128 |       1100.00 ± 2.00 |
| llama 7B Q4_0                  |   3.56 GiB |     6.74 B | CUDA       |  99 |  1 |           tg128 |        150.00 ± 0.10 |
"""  # hand-made: llama-bench's markdown layout, numbers invented


def _m(metric: str, **shape) -> Measurement:
    return Measurement(id="x", gpu="rtx-3090", backend="CUDA", model="llama-3.1-8b",
                       weight_format="q4_k_m", metric=metric, value=1.0, flash_attn=True,
                       **shape)


def _setup() -> Setup:
    return Setup(load_gpu("rtx-3090"), load_model("llama-3.1-8b"), "q4_k_m", "CUDA", True)


def test_pg_is_the_prompt_then_the_decode_after_it_over_all_their_tokens():
    s = _setup()
    pp = predicted_tps(_m("pp_tps", n_prompt=4096), s)
    tg = predicted_tps(_m("tg_tps", n_gen=128, depth=4096), s)
    pg = predicted_tps(_m("pg_tps", n_prompt=4096, n_gen=128), s)
    assert pg == pytest.approx((4096 + 128) / (4096 / pp + 128 / tg), rel=1e-12)
    assert tg < pg < pp
    # at a depth, both halves start after it
    pp_d = predicted_tps(_m("pp_tps", n_prompt=512, depth=1000), s)
    tg_d = predicted_tps(_m("tg_tps", n_gen=64, depth=1512), s)
    pg_d = predicted_tps(_m("pg_tps", n_prompt=512, n_gen=64, depth=1000), s)
    assert pg_d == pytest.approx(576 / (512 / pp_d + 64 / tg_d), rel=1e-12)


def test_pg_steps_are_the_prompts_micro_batches_then_one_decode_step_a_token():
    steps = step_batches(_m("pg_tps", n_prompt=1100, n_gen=3, depth=10))
    assert steps == [BatchShape(prefill_tokens=(512,), prefill_context=(10,)),
                     BatchShape(prefill_tokens=(512,), prefill_context=(522,)),
                     BatchShape(prefill_tokens=(76,), prefill_context=(1034,)),
                     BatchShape(decode_context=(1110,)), BatchShape(decode_context=(1111,)),
                     BatchShape(decode_context=(1112,))]


def test_a_pasted_pg_row_is_predicted_and_llama_8b_is_either_llama_3_8b():
    ms, skipped = read_bench(PASTED, origin="post")
    assert skipped == []
    assert [m.metric for m in ms] == ["pp_tps", "tg_tps", "pg_tps", "tg_tps"]
    setups = [setup_for(m) for m in ms]
    # "llama 8B" at 8.03e9 parameters: Llama 3 8B and 3.1 8B, one shape, so either (the
    # longer context taken)
    assert [getattr(s, "model", None) and s.model.name for s in setups[:3]] == \
        ["llama-3.1-8b"] * 3
    assert predicted_tps(ms[1], setups[1]) == pytest.approx(
        predicted_tps(ms[1], Setup(setups[1].gpu, load_model("llama-3-8b"), "q4_k_m",
                                   "CUDA", True, file_bytes=setups[1].file_bytes)), rel=1e-5)
    # "llama 7B" with its parameter count is Llama 2 7B; without it or the file size,
    # Llama 2 7B or a Mistral 7B (8 KV heads): not one shape, still skipped
    assert setups[3].model.name == "llama-2-7b"
    bare = setup_for(Measurement(
        id="bare", gpu="rtx-3090", backend="CUDA", model="llama 7B Q4_0", weight_format="",
        metric="tg_tps", value=150.0, n_gen=128))
    assert bare.id == "bare" and bare.reason.startswith("ambiguous: llama.cpp model_type")


def test_one_shape_needs_two_models_of_the_same_geometry():
    # the same geometry: the one whose context holds a test at depth (131,072 > 8,192)
    assert one_shape(("llama-3-8b", "llama-3.1-8b")).name == "llama-3.1-8b"
    assert one_shape(("llama-2-7b", "mistral-7b-v0.1")) is None
    assert one_shape(("mistral-7b-v0.1", "mistral-7b-v0.3")) is None  # 32,000 / 32,768 vocab
    assert one_shape(("llama-3-8b",)) is None
