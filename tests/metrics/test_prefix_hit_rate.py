"""prefix_hit_rate is over the prompts the engine looked up (audit: rejected prompts
counted in the denominator; vLLM's prefix-cache queries count looked-up requests only,
docs/reference/engines.md §1.8)."""

import math

import pandas as pd

from kvsim.api import simulate
from kvsim.core.build import PoolSizing
from kvsim.metrics.summary import looked_up, prefix_hit_rate
from kvsim.scenario import load_scenario, resolve_scenario
from kvsim.workload.schema import Session, Turn

NAN = math.nan


def _rows(*rows) -> pd.DataFrame:
    cols = ["first_scheduled_s", "status", "failed", "prompt_tokens", "truncated_prompt_tokens",
            "cached_tokens"]
    return pd.DataFrame(rows, columns=cols)


def test_only_requests_the_engine_scheduled_count() -> None:
    req = _rows((0.0, "finished", False, 1000, 0, 800),      # looked up
                (NAN, "failed", True, 9000, 0, 0),           # rejected at entry
                (1.0, "failed", True, 500, 0, 300),          # failed after its lookup
                (2.0, "unfinished", False, 400, 0, 100),     # running at the stop
                (NAN, "unfinished", False, 700, 0, 0),       # waiting at the stop
                (3.0, "finished", False, 1200, 200, 600))    # truncated by the engine
    assert list(looked_up(req)) == [True, False, True, True, False, True]
    # (800 + 300 + 100 + 600) / (1000 + 500 + 400 + (1200 − 200)) = 1800 / 2900
    assert prefix_hit_rate(req) == 1800 / 2900


def test_a_measured_replay_has_no_scheduling_times_and_counts_what_finished() -> None:
    req = _rows((NAN, "finished", False, 1000, 0, 600), (NAN, "failed", True, 500, 0, 0))
    assert prefix_hit_rate(req.drop(columns="status")) == 600 / 1000


def test_a_prompt_over_the_context_is_not_in_the_denominator() -> None:
    """vLLM, max_model_len 4096, 16-token blocks: session s (100-token prompt, 5 out,
    then 10 more tokens) and one 5,000-token prompt that vLLM rejects at entry."""
    sc = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b",
                           "engine": {"preset": "vllm", "context_tokens": 4096},
                           "latency": {"kind": "constant", "step_s": 0.01}, "workload": {}})
    sessions = [Session(session_id="s", turns=(
        Turn(start_s=0.0, input_tokens=100, output_tokens=5),
        Turn(think_s=2.0, input_tokens=10, output_tokens=3))),
        Session(session_id="long", turns=(Turn(start_s=0.5, input_tokens=5000,
                                               output_tokens=3),))]
    sizing = PoolSizing(kv_pool_tokens=8192, slot_tokens=4096, kv_reserved_bytes=8192 * 1000,
                        num_gpu_blocks=512, block_tokens=16, static_device_bytes=10**9,
                        device_bytes=2 * 10**9)
    res = simulate(sc, sessions=sessions, sizing=sizing)
    r = res.requests.set_index("request_id")
    assert r.loc["long#0", "failure_reason"] == "maximum context length exceeded"
    # turn 1's prompt 100 + 5 + 10 = 115; the KV held 104 tokens = 6 full blocks = 96
    assert r.loc["s#1", "cached_tokens"] == 96
    # 96 / (100 + 115), not 96 / (100 + 115 + 5000)
    assert res.summary["prefix_hit_rate"] == 96 / 215


def test_quickstart_leaves_out_its_one_rejected_prompt() -> None:
    """The bundled day: one 16,789-token prompt is over the 16,384-token context
    ("exceed_context_size_error", never given a slot); two more fail in the pool after
    their lookup (one with 15,095 tokens cached) and still count.  (At the time of
    writing 575,984 / 674,273 = 0.854; 0.833 with the rejected prompt counted.)"""
    res = simulate(load_scenario("quickstart"))
    req = res.requests
    rejected = req[req.failed & req.first_scheduled_s.isna()]
    assert list(rejected.failure_reason) == ["exceed_context_size_error"]
    assert list(rejected.prompt_tokens) == [16_789]
    kept = req.drop(index=rejected.index)
    assert res.summary["prefix_hit_rate"] == \
        kept.cached_tokens.sum() / (kept.prompt_tokens.sum() - kept.truncated_prompt_tokens.sum())
