"""A prompt longer than the model's maximum context fails (or is truncated) as its engine
does, and the run goes on — it used to abort the whole run.

qwen3-8b's maximum is 40,960 tokens.  vLLM / SGLang refuse a max_model_len above it and
Ollama clamps num_ctx to it, so their own limit already covers such a prompt;
llama-server accepts ``-c`` above it but caps every slot at the training context
("the slot context (N) exceeds the training context of the model (M) - capping"), so a
prompt of 40,960 tokens or more gets HTTP 400 ``exceed_context_size_error`` there too.
"""

import pytest

from kvsim.api import simulate
from kvsim.core.build import PoolSizing
from kvsim.scenario import load_scenario, resolve_scenario
from kvsim.workload.schema import Session, Turn

MOST = 40_960  # qwen3-8b


def _one(sid: str, start: float, tokens: int, out: int = 8) -> Session:
    return Session(session_id=sid, turns=(Turn(start_s=start, input_tokens=tokens,
                                               output_tokens=out),))


def _run(engine: dict, sessions: list[Session], pool_tokens: int, slot_tokens: int):
    sc = resolve_scenario({"gpu": "rtx-4090", "model": "qwen3-8b", "weights": "q4_k_m",
                           "engine": engine, "latency": {"kind": "constant", "step_s": 0.01},
                           "workload": {}})
    sizing = PoolSizing(kv_pool_tokens=pool_tokens, slot_tokens=slot_tokens,
                        kv_reserved_bytes=pool_tokens * 100, num_gpu_blocks=pool_tokens // 16,
                        block_tokens=16, static_device_bytes=10**9, device_bytes=2 * 10**9)
    return simulate(sc, sessions=sessions, sizing=sizing)


def test_quickstart_with_qwen3_keeps_running_past_the_long_prompt() -> None:
    """The audit's case: quickstart (llama.cpp -c 16384, unified) on qwen3-8b, a
    42,042-token prompt — one HTTP 400, the other session is served."""
    sc = load_scenario("quickstart", ["model=qwen3-8b"])
    res = simulate(sc, sessions=[_one("long", 0.0, 42_042), _one("next", 1.0, 500)])
    req = res.requests.set_index("request_id")
    assert req.loc["long#0", "failure_reason"] == "exceed_context_size_error"
    assert req.loc["long#0", "prompt_tokens"] == 42_042
    assert req.loc["next#0", "failure_reason"] == "" and req.loc["next#0", "output_tokens"] == 8
    fail = res.events[res.events.kind == "fail"]
    assert list(fail.detail) == [
        "request (42042 tokens) exceeds the available context size (16384 tokens)"]


@pytest.mark.parametrize("allocator, parallel", [("unified", 2), ("slots", 1)])
def test_llama_cpp_context_above_the_training_context_caps_the_slot(allocator,
                                                                     parallel) -> None:
    # -c 65,536 on a 40,960-token model: each slot holds at most 40,960 tokens
    engine = {"preset": "llama.cpp", "context_tokens": 65_536 * parallel,
              "parallel": parallel, "allocator": allocator}
    sessions = [_one("over", 0.0, 42_042), _one("at", 100.0, MOST),
                _one("under", 200.0, 40_000), _one("edge", 300.0, 40_900, out=100)]
    res = _run(engine, sessions, 65_536 * parallel, 65_536 * (parallel if
                                                                allocator == "unified" else 1))
    req = res.requests.set_index("request_id")
    assert req.loc["over#0", "failure_reason"] == req.loc["at#0", "failure_reason"] \
        == "exceed_context_size_error"
    assert set(res.events[res.events.kind == "fail"].detail) == {
        f"request ({n} tokens) exceeds the available context size ({MOST} tokens)"
        for n in (42_042, MOST)}
    assert req.loc["under#0", "failure_reason"] == ""
    assert req.loc["under#0", "output_tokens"] == 8
    # generation stops at the capped slot's end (stop_type limit): 40,960 − 40,900
    assert req.loc["edge#0", "output_tokens"] == MOST - 40_900
    assert bool(req.loc["edge#0", "truncated"])
    # the KV pool keeps every -c cell: only the per-slot limit is capped
    assert res.summary["peak_kv_reserved_bytes"] == 65_536 * parallel * 100


def test_vllm_fails_the_long_prompt_with_its_own_reason() -> None:
    engine = {"preset": "vllm"}  # max_model_len unset = the model's maximum
    res = _run(engine, [_one("long", 0.0, 42_042), _one("next", 1.0, 500)], 65_536, MOST)
    req = res.requests.set_index("request_id")
    assert req.loc["long#0", "failure_reason"] == "maximum context length exceeded"
    assert req.loc["next#0", "failure_reason"] == ""
    assert list(res.events[res.events.kind == "fail"].detail) == [
        f"prompt 42042 tokens >= max_model_len {MOST}"]


def test_ollama_truncates_the_long_prompt() -> None:
    # num_ctx above the training length is clamped to it (docs/reference/engines.md §4.1)
    engine = {"preset": "ollama", "context_tokens": 65_536, "parallel": 1}
    sc = resolve_scenario({"gpu": "rtx-4090", "model": "qwen3-8b", "engine": engine,
                           "workload": {}})
    assert sc.engine.context_tokens == MOST
    res = _run(engine, [_one("long", 0.0, 42_042)], MOST, MOST)
    req = res.requests.set_index("request_id")
    assert req.loc["long#0", "failure_reason"] == ""
    # fitted to num_ctx − 1: old tokens dropped, the rest read by the engine
    long = req.loc["long#0"]
    assert long.cached_tokens + long.computed_prompt_tokens == MOST - 1
    assert list(res.events[res.events.kind == "truncate_prompt"].request_id) == ["long#0"]
