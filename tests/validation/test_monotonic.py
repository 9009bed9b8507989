"""Monotonicity: more memory never hurts; prefix caching never adds prompt compute."""

import pytest

from kvsim.api import simulate
from kvsim.config.scenario import load_scenario, resolve_scenario
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


def _vllm(gpu: str, **engine):
    return resolve_scenario({"gpu": gpu, "model": "llama-3.1-8b", "weights": "q4_k_m",
                             "engine": {"preset": "vllm", "context_tokens": 9000, **engine},
                             "workload": {}})


def test_more_memory_never_more_preemptions_or_failures() -> None:
    rows = [simulate(_vllm(g), sessions=_sessions(10)).summary for g in CARDS]
    pre = [r["preemptions"] for r in rows]
    fail = [r["failed_requests"] for r in rows]
    assert pre[0] > 0, "the smallest card must be under pressure for the test to mean anything"
    assert pre == sorted(pre, reverse=True)
    assert fail == sorted(fail, reverse=True)
    assert pre[-1] == 0


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
