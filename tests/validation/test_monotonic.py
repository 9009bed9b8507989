"""Monotonicity: more memory never hurts; prefix caching never adds prompt compute."""

import pytest

from kvsim.api import scenario_budget, simulate
from kvsim.scenario import load_scenario, resolve_scenario
from kvsim.workload.schema import Session, Turn

CARDS = ("rtx-3060-12gb", "rtx-4060-ti-16gb", "rtx-4090", "rtx-5090")  # 12, 16, 24, 32 GiB


def _sessions(n: int) -> list[Session]:
    out = []
    for i in range(n):
        ts = [Turn(start_s=i * 0.5, input_tokens=1500, output_tokens=300)]
        ts += [Turn(think_s=1.0, input_tokens=1500, output_tokens=300) for _ in range(4)]
        out.append(Session(session_id=f"s{i}", system_prompt_id="assistant",
                           system_prompt_tokens=500, turns=tuple(ts)))
    return out


def _vllm(gpu: str, context: int = 16384, **engine):
    # 16,384 > the longest request of _sessions (turn 4: prompt 500 + 5·1500 + 4·300 =
    # 9,200, plus 300 output = 9,500): no request fails on the context length
    return resolve_scenario({"gpu": gpu, "model": "llama-3.1-8b", "weights": "q4_k_m",
                             "engine": {"preset": "vllm", "context_tokens": context, **engine},
                             "workload": {}})


# KV pools of Llama-3.1-8B q4_k_m under vLLM on the four cards, in 16-token blocks (the
# memory budget, tests/model/test_budget.py); everything below is reasoned from these.
BLOCKS = {"rtx-3060-12gb": 2082, "rtx-4060-ti-16gb": 3928, "rtx-4090": 7619, "rtx-5090": 11314}


def test_more_memory_never_more_preemptions_or_failures() -> None:
    """Ten requests at t=0, each a 160-token prompt and 6,240 output tokens.

    The ten prompts (1,600 tokens ≤ the 2,048-token step budget, 10 blocks each) are
    admitted in the first step, so the ten decode in lockstep; a request never holds
    more than ceil((160 + 6240 − 1)/16) = 400 blocks.  When the r running requests all
    need block m and r·m > B, the last admitted is preempted (recompute) and goes to
    the head of the waiting queue; it needs m blocks back while the survivors leave
    only B − (r−1)·m < m, and the survivors only grow, so it waits for them to finish
    (together, in lockstep) — and so do later victims behind it.  Hence one preemption
    per r with r·400 > B, stopping at the first r with r·400 ≤ B, and the victims
    (r ≤ that many, 400 blocks each) then run together without another:

    - 3060, B = 2082: r = 10, 9, 8, 7, 6 overflow (6·400 = 2400 > 2082; 5·400 = 2000
      fits): 5 preemptions, of s9, s8, s7, s6, s5 (5 victims ≤ 5 that fit);
    - 4060 Ti, B = 3928: 10·400 = 4000 > 3928, 9·400 = 3600 fits: 1 preemption (s9);
    - 4090 / 5090: 10·400 = 4000 ≤ 7619 ≤ 11314: none.

    No request fails: 6,400 tokens < the 8,192-token context, and vLLM preempts rather
    than failing on memory.
    """
    sessions = [Session(session_id=f"s{i}", turns=(
        Turn(start_s=0.0, input_tokens=160, output_tokens=6240),)) for i in range(10)]
    pre, fail, victims = {}, {}, {}
    for g in CARDS:
        sc = _vllm(g, context=8192)
        assert scenario_budget(sc).num_gpu_blocks == BLOCKS[g]
        res = simulate(sc, sessions=sessions)
        pre[g], fail[g] = res.summary["preemptions"], res.summary["failed_requests"]
        rq = res.requests.set_index("request_id")
        victims[g] = sorted(rq.index[rq["preemptions"] > 0])
        assert (rq["preemptions"] <= 1).all()
        assert not rq["failed"].any() and (rq["output_tokens"] == 6240).all()
        assert (rq.loc[victims[g], "recomputed_tokens"] > 0).all()
    assert pre == {"rtx-3060-12gb": 5, "rtx-4060-ti-16gb": 1, "rtx-4090": 0, "rtx-5090": 0}
    assert victims == {"rtx-3060-12gb": ["s5#0", "s6#0", "s7#0", "s8#0", "s9#0"],
                       "rtx-4060-ti-16gb": ["s9#0"], "rtx-4090": [], "rtx-5090": []}
    assert fail == dict.fromkeys(CARDS, 0)
    # the monotone relation: more memory, never more preemptions
    counts = [pre[g] for g in CARDS]
    assert counts == sorted(counts, reverse=True)


@pytest.mark.parametrize("gpu", ["rtx-3060-12gb", "rtx-4090"])
def test_prefix_caching_never_increases_computed_prompt_tokens(gpu: str) -> None:
    on = simulate(_vllm(gpu), sessions=_sessions(8)).summary
    off = simulate(_vllm(gpu, enable_prefix_caching=False), sessions=_sessions(8)).summary
    assert off["cached_tokens"] == 0
    assert on["computed_prompt_tokens"] <= off["computed_prompt_tokens"]
    assert on["cached_tokens"] > 0


def test_same_seed_gives_byte_identical_summary(tmp_path) -> None:
    sc = load_scenario("quickstart", ["workload.max_sessions=12"])
    a = simulate(sc).save(tmp_path / "a")
    b = simulate(sc).save(tmp_path / "b")
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()
    other = simulate(load_scenario("quickstart", ["workload.max_sessions=12", "seed=1"]))
    assert other.summary != simulate(sc).summary
