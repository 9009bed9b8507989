"""Ollama's silent truncation is visible in the results (docs/reference/engines.md §4.5).

One 1,024-token slot (``num_ctx`` 1024, one parallel slot; prompts are fitted to 1,023
so the slot holds the first sampled token), three sessions one after another:

- ``a``: system 100 + three turns.  t0 prompt 100 + 300 = 400, t1 400 + 100 (answer)
  + 400 = 900 — both fit.  t2 900 + 100 + 300 = 1,300: Ollama drops the oldest message
  (t0/in, 300 tokens) → 1,000 kept, 300 lost;
- ``b``: one 1,500-token message: nothing older to drop, so the runner keeps
  ``num_keep`` = 4 tokens and drops the 477 oldest after them → 1,023 kept; its first
  sampled token fills the slot, so the context also shifts;
- ``c``: a 900-token prompt that fits, but 200 output tokens reach the slot's end:
  a context shift (no prompt token lost before the prompt ran).

A request is ``truncated`` when the engine cut its context (b and a#2 lost prompt
tokens, c a shift), ``prompt_tokens`` is what the client sent, and the engine read
``cached_tokens + computed_prompt_tokens`` of it.
"""

import pytest

from kvsim.api import simulate
from kvsim.scenario import resolve_scenario
from kvsim.workload.schema import Session, Turn

SESSIONS = [
    Session(session_id="a", system_prompt_id="p", system_prompt_tokens=100, turns=(
        Turn(start_s=0.0, input_tokens=300, output_tokens=100),
        Turn(think_s=1.0, input_tokens=400, output_tokens=100),
        Turn(think_s=1.0, input_tokens=300, output_tokens=10))),
    Session(session_id="b", turns=(Turn(start_s=1000.0, input_tokens=1500, output_tokens=4),)),
    Session(session_id="c", turns=(Turn(start_s=2000.0, input_tokens=900,
                                        output_tokens=200),)),
]
# request id: (prompt tokens sent, prompt tokens lost, truncated)
EXPECTED = {"a#0": (400, 0, False), "a#1": (900, 0, False), "a#2": (1300, 300, True),
            "b#0": (1500, 477, True), "c#0": (900, 0, True)}


def _run(fidelity: str):
    sc = resolve_scenario({
        "gpu": "rtx-4090", "model": "llama-3.1-8b", "weights": "q4_k_m",
        "engine": {"preset": "ollama", "context_tokens": 1024, "parallel": 1},
        "latency": {"kind": "constant", "step_s": 0.02}, "workload": {},
        "sim": {"fidelity": fidelity}})
    return simulate(sc, sessions=SESSIONS)


@pytest.fixture(scope="module")
def runs():
    return {f: _run(f) for f in ("fast", "step")}


def test_records_keep_the_prompt_as_sent_and_mark_truncated(runs) -> None:
    req = runs["step"].requests.set_index("request_id")
    assert sorted(req.index) == sorted(EXPECTED)
    for rid, (sent, lost, truncated) in EXPECTED.items():
        row = req.loc[rid]
        assert not row.failed, rid
        assert (row.prompt_tokens, bool(row.truncated)) == (sent, truncated), rid
        assert row.truncated_prompt_tokens == lost, rid
        # the engine read the rest: from its cache or computed
        assert row.cached_tokens + row.computed_prompt_tokens == sent - lost, rid
    assert req.loc["c#0"].output_tokens == 200  # shifted, not stopped


def test_events_name_the_truncations_and_shifts(runs) -> None:
    ev = runs["step"].events
    cut = ev[ev.kind == "truncate_prompt"].set_index("request_id").detail.to_dict()
    assert cut == {"a#2": "dropped 300 tokens of old messages, truncated 0 after 4",
                   "b#0": "dropped 0 tokens of old messages, truncated 477 after 4"}
    assert set(ev[ev.kind == "context_shift"].request_id) == {"b#0", "c#0"}


def test_summary_counts_truncated_requests_and_lost_tokens(runs) -> None:
    s = runs["step"].summary
    assert s["truncated_requests"] == 3
    assert s["truncated_prompt_tokens"] == 300 + 477
    assert s["prompt_tokens"] == sum(sent for sent, _, _ in EXPECTED.values())
    assert s["prompt_tokens"] == (s["cached_tokens"] + s["computed_prompt_tokens"]
                                  + s["truncated_prompt_tokens"])
    # the hit rate is over what the engine looked up, not what it dropped
    looked_up = s["prompt_tokens"] - s["truncated_prompt_tokens"]
    assert s["prefix_hit_rate"] == s["cached_tokens"] / looked_up


def test_fast_and_step_fidelity_agree(runs) -> None:
    fast, step = runs["fast"], runs["step"]
    cols = ["request_id", "prompt_tokens", "cached_tokens", "computed_prompt_tokens",
            "output_tokens", "truncated", "truncated_prompt_tokens", "failed"]
    assert fast.requests[cols].equals(step.requests[cols])
    for key in ("truncated_requests", "truncated_prompt_tokens", "prompt_tokens"):
        assert fast.summary[key] == step.summary[key], key
    assert fast.events.drop(columns="time_s").equals(step.events.drop(columns="time_s"))
