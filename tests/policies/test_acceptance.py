"""Acceptance tests of the KV policies (docs/policies.md) on fixed scenarios
(one document session, llama.cpp).

The session: a 400-token system prompt, turn 0 pastes 3000 tokens, turn 1 adds
2000, turn 2 refers back to 16 exact tokens at offset 96 of turn 0's input — more
than 5000 tokens before it, i.e. farther back than a 1024-token window.
"""

from fractions import Fraction

import pytest

from kvsim.api import scenario_budget
from kvsim.model.geometry import kv_geometry
from tests.policies.helpers import SPAN, doc_session, references, run, scenario

WINDOW = ["policies=[{kind: sliding_window, window_tokens: 1024}]"]
RECOVER = ["policies=[{kind: recoverable_eviction, window_tokens: 1024, cache_type: q4_0}]"]


def test_q8_0_vs_f16_bytes_ratio_is_exactly_34_over_64_and_capacity_rises_64_over_34() -> None:
    f16, q8 = scenario(), scenario("engine.cache_type_k=q8_0", "engine.cache_type_v=q8_0")
    g16, g8 = kv_geometry(f16.model), kv_geometry(q8.model, "q8_0", "q8_0")
    # llama.cpp q8_0 = 34 bytes per 32 values vs f16 64 bytes (docs/reference/engines.md §0)
    assert Fraction(g8.kv_bytes_per_token, g16.kv_bytes_per_token) == Fraction(34, 64)
    b16, b8 = scenario_budget(f16), scenario_budget(q8)
    assert b16.kv_pool_tokens == b8.kv_pool_tokens == 16384
    assert Fraction(b8.kv_reserved_bytes, b16.kv_reserved_bytes) == Fraction(34, 64)
    # the same KV bytes hold 64/34 times the tokens (to one token of flooring)
    tokens8 = b16.kv_reserved_bytes // g8.kv_bytes_per_token
    assert abs(tokens8 - b16.kv_pool_tokens * Fraction(64, 34)) < 1


def test_no_eviction_and_enough_memory_is_intact() -> None:
    _, res = run()
    assert references(res) == [("INTACT", 1.0, 0.0, 0)]
    assert res.summary["recall_mean"] == 1.0 and res.summary["reference_events"] == 1


def test_sliding_window_loses_an_exact_reference_beyond_the_window() -> None:
    _, res = run(*WINDOW)
    assert references(res) == [("LOST", 0.10, 0.0, 0)]  # kv-policies §6.4 LOST exact
    assert res.summary["evicted_tokens"] > 0 and res.summary["recall_collapse_events"] == 0
    # turn 2 computed a prompt without the dropped middle: pinned head + window + new input.
    # Rule (eviction.py): after a step with n > pin + W + chunk = 400 + 1024 + 256 = 1680,
    # drop everything in [pin, n − W) except each message's first 4 tokens.
    # Turn 0: 3400-token prompt in n_batch 2048 steps → n = 2048 then 1428 + 1352 = 2780,
    #   each time cut back to 400 + 4 (turn-0 input pin) + 1024 = 1428 tokens.
    # Turn 1: 1428 + 49 answer tokens in KV = 1477 cached, + 2001 new (last answer token
    #   + 2000 input) in one step → n = 3478: the window (last 1024) lies inside turn 1's
    #   input, so 400 + pins of turn 0 input / turn 0 answer / turn 1 input (3 × 4 = 12)
    #   + 1024 survive = 1436; dropped 3478 − 1436 = 2042.  Turn 1's 20 answer tokens
    #   never cross 1680 again (1436 + 20).
    # Turn 2 prompt = 400 + 12 + 1024 + 20 (turn 1 answer) + 20 (new input) = 1476.
    turn2 = res.requests.set_index("turn").loc[2]
    assert turn2.prompt_tokens == 400 + 12 + 1024 + 20 + 20 == 1476
    assert turn2.cached_tokens == 1476 - 21  # all but the last answer token and new input
    assert res.summary["evicted_tokens"] == 620 + 1352 + 2042


def test_a_reference_lost_with_little_context_kept_scores_lower() -> None:
    # the same session under a 128-token window: turn 2 reads its prompt (pinned head,
    # message pins, the window and the new tokens) out of a context of that plus every
    # evicted token, at most 1/8 of it: kv-policies §6.4 "LOST at <= 1/8 kept"
    _, res = run("policies=[{kind: sliding_window, window_tokens: 128}]")
    turn2 = res.requests.set_index("turn").loc[2]
    kept = turn2.prompt_tokens / (turn2.prompt_tokens + res.summary["evicted_tokens"])
    assert kept <= 1 / 8
    assert references(res) == [("LOST", 0.05, 0.0, 0)]


def test_gist_reference_lost_scores_the_gist_multiplier() -> None:
    _, res = run(*WINDOW, sessions=[doc_session(content="gist")])
    assert references(res) == [("LOST", 0.90, 0.0, 0)]


def test_recoverable_eviction_recovers_paying_bytes_over_the_link() -> None:
    sc, res = run(*RECOVER)
    [(label, m, added, nbytes)] = references(res)
    # a QUANT_BACKED span: a selector miss still reads its q4_0 copy on the GPU
    # (kv-policies §6.2), so m = p_hit·m(f16) + (1 − p_hit)·m(DEGRADED 4) = 0.95 + 0.05·0.97
    # = 0.9985 — above leaving it demoted (0.97)
    assert label == "RECOVERED" and m == pytest.approx(0.9985)
    bpt = kv_geometry(sc.model).kv_bytes_per_token  # f16: 128 KiB per token
    assert nbytes == (SPAN[1] - SPAN[0]) * bpt  # one 16-token page at full precision
    expected = nbytes / sc.link.h2d_bytes_per_s + sc.link.latency_s
    assert added == pytest.approx(expected, rel=0.01)
    assert res.summary["recall_latency_added_s"] == pytest.approx(expected, rel=0.01)
    assert res.summary["pcie_d2h_bytes"] > 0  # the full copies written to host
    mem = res.memory
    assert mem["kv_quant_bytes"].max() > 0 and mem["host_kv_bytes"].max() > 0


def test_recoverable_eviction_frees_gpu_bytes_exactly() -> None:
    sc, base = run()
    _, rec = run(*RECOVER)
    # the 16-token referenced span was recalled and promoted back to f16 (kv-policies §6.3)
    assert rec.summary["promoted_tokens"] == SPAN[1] - SPAN[0]
    q = rec.summary["quantized_tokens"] - rec.summary["promoted_tokens"]
    bpt = kv_geometry(sc.model).kv_bytes_per_token
    q4 = kv_geometry(sc.model, "q4_0", "q4_0").kv_bytes_per_token
    assert q > 0 and q4 * 64 == bpt * 18
    # after the last turn, the slot holds the same tokens; q of them at 18/64 of the bytes
    last_b, last_r = base.memory.iloc[-1], rec.memory.iloc[-1]
    assert last_b.kv_allocated_bytes - last_r.kv_allocated_bytes == q * (bpt - q4)
    assert last_r.kv_quant_bytes == q * q4


def test_dropping_a_pinned_block_collapses_and_defaults_never_do() -> None:
    _, res = run("policies=[{kind: sliding_window, window_tokens: 1024, sink_tokens: 0, "
                 "pin_system_prompt: false}]")
    assert references(res) == [("COLLAPSE", 0.05, 0.0, 0)]
    for pol in (WINDOW, RECOVER, ["policies=[{kind: score_eviction, budget_tokens: 1024}]"],
                ["policies=[{kind: kivi, bits: 2}]"], ["policies=[{kind: idle_offload}]"]):
        _, ok = run(*pol)
        assert ok.summary["recall_collapse_events"] == 0, pol


def test_kivi_degrades_old_tokens_to_its_bit_width() -> None:
    _, res = run("policies=[{kind: kivi, bits: 2}]")
    assert references(res) == [("DEGRADED(2)", 0.70, 0.0, 0)]
    _, res4 = run("policies=[{kind: kivi, bits: 4}]")
    assert references(res4) == [("DEGRADED(4)", 0.97, 0.0, 0)]


def test_score_eviction_drops_dormant_spans_first() -> None:
    _, res = run("policies=[{kind: score_eviction, budget_tokens: 1024}]")
    assert references(res) == [("LOST", 0.10, 0.0, 0)]  # never referenced before: dormant


def test_static_q4_0_cache_degrades_every_reference() -> None:
    _, res = run("engine.cache_type_k=q4_0", "engine.cache_type_v=q4_0")
    assert references(res) == [("DEGRADED(4)", 0.97, 0.0, 0)]


def test_resumed_turn_ttft_between_still_on_gpu_and_recompute() -> None:
    sessions = [doc_session(think_s=60.0)]
    off = ["engine.cache_ram_bytes=0"]  # no engine RAM cache: the policy decides alone
    _, gpu = run(*off, sessions=sessions)
    _, restored = run("policies=[{kind: idle_offload, idle_after_s: 10, restore: always}]",
                      sessions=sessions)
    _, recompute = run(*off, "policies=[{kind: idle_offload, idle_after_s: 10, mode: drop}]",
                       sessions=sessions)
    t = [r.requests.set_index("turn").loc[1].ttft_s for r in (gpu, restored, recompute)]
    assert t[0] < t[1] < t[2]
    assert restored.summary["restore_bytes"] > 0 and restored.summary["pcie_h2d_bytes"] > 0
