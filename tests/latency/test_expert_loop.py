"""The host's loop over the experts (kvsim.latency.expert_loop): which parts take it, from
how many tokens, what it adds to a step, the same on every step path, and what it does to
the published Volta / P100 MoE prompts."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.latency.backend import gpu_rates
from kvsim.latency.base import BatchShape
from kvsim.latency.expert_loop import EXPERT_CALL_S, EXPERT_MATMULS, loop_tokens
from kvsim.latency.rates import experts_used_fraction
from kvsim.validate.predict import Setup, latency_for
from kvsim.validate.run import validate
from kvsim.validate.shared import read_shared_csv

MOE, DENSE = load_model("qwen3-30b-a3b"), load_model("llama-2-7b")
COMMUNITY = Path(__file__).resolve().parents[2] / "docs" / "reference" / \
    "measurements-community" / "multi-gpu.csv"


@pytest.mark.parametrize(("gpu", "backend", "family", "model", "start"), [
    ("tesla-v100-pcie-16gb", "CUDA", "q4_k", MOE, 64),   # MMQ below 64 tokens only
    ("tesla-v100-sxm2-32gb", "CUDA", "q8_0", MOE, 64),
    ("tesla-p100-16gb", "CUDA", "q4_k", MOE, 9),         # no dp4a: never MMQ
    ("tesla-p40", "CUDA", "q4_k", MOE, 0),               # dp4a: MMQ at every size
    ("rtx-3090", "CUDA", "q4_k", MOE, 0),                # int8 tensor cores: MMQ
    ("tesla-v100-pcie-16gb", "CUDA", "q4_k", DENSE, 0),  # no MUL_MAT_ID
    ("tesla-v100-pcie-16gb", "CUDA", "f16", MOE, 0),     # not a quantized expert
    ("tesla-v100-pcie-16gb", "Vulkan", "q4_k", MOE, 0),  # ggml-cuda's rule only
])
def test_which_parts_loop_and_from_how_many_tokens(gpu, backend, family, model, start):
    assert loop_tokens(load_gpu(gpu), backend, family, model) == start


def _model(gpu: str, fmt: str = "q4_k_m", loop: bool = True):
    s = Setup(load_gpu(gpu), MOE, fmt, "CUDA", True)
    r = gpu_rates(s.gpu, s.model, s.weight_format, backend="CUDA")
    return latency_for(s, rates=r if loop else replace(r, expert_loop_tokens=0))


def _prompt(tokens: int) -> BatchShape:
    return BatchShape(prefill_tokens=(tokens,), prefill_context=(0,))


def test_a_prompt_ubatch_pays_one_call_per_used_expert_and_product():
    with_loop, without = _model("tesla-v100-sxm2-32gb"), _model("tesla-v100-sxm2-32gb",
                                                                 loop=False)
    pick = MOE.num_experts_active / MOE.num_experts
    for tokens in (64, 512):
        calls = EXPERT_MATMULS * MOE.num_layers * MOE.num_experts \
            * experts_used_fraction(tokens, pick)
        added = with_loop.step_time_s(_prompt(tokens)) - without.step_time_s(_prompt(tokens))
        assert added == pytest.approx(EXPERT_CALL_S * calls, rel=1e-12)
    # 63 tokens still take MMQ: no loop
    assert with_loop.step_time_s(_prompt(63)) == without.step_time_s(_prompt(63))
    # 512 tokens of its 128 experts top-8 reach nearly all: 3 x 48 x 128 calls, ~0.29 s
    assert EXPERT_CALL_S * EXPERT_MATMULS * 48 * 128 == pytest.approx(0.2949, abs=1e-4)


def test_decode_paths_agree_with_the_step_path_where_the_loop_runs():
    m = _model("tesla-v100-sxm2-32gb")
    for n in (8, 64, 96):   # below and above Volta's 64-token start
        ctx = np.arange(1000, 1000 + n)
        step = [m.step_time_s(BatchShape(decode_context=tuple(int(c) + j for c in ctx)))
                for j in range(3)]
        assert np.allclose(m.decode_steps_s(ctx, 3), step, rtol=1e-12, atol=0)
        assert np.allclose(m.decode_steps_list(list(ctx), 3), step, rtol=1e-12, atol=0)
    assert m.decode_steps_s(np.arange(64), 1)[0] > _model(
        "tesla-v100-sxm2-32gb", loop=False).decode_steps_s(np.arange(64), 1)[0]


def test_published_volta_and_p100_moe_prompts_of_one_ubatch():
    """The two Volta pp512 rows set EXPERT_CALL_S; the P100 and Gemma 4 rows check it.
    Without the loop they were +18 … +303 % (too fast)."""
    meas, _ = read_shared_csv(COMMUNITY.read_text(encoding="utf-8"), COMMUNITY.name)
    rows = {r["id"]: float(r["rel_err"]) for r in validate(meas).rows}
    setting = ("CMM053", "CMM069")
    check = ("CMM057", "CMM061", "CMM077", "CMM081", "CMM085", "CMM091")
    assert all(abs(rows[i]) < 0.15 for i in setting)
    assert all(abs(rows[i]) < 0.25 for i in check)
