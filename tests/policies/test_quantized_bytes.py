"""Audit 4: demoted KV priced at its real bytes and scored against what a miss reads.

The fixed document session (tests.policies.helpers): a 400-token system prompt, turn 0
pastes 3000 tokens (50 out), turn 1 adds 2000 (20 out), turn 2 adds 20 (10 out) and
refers back to 16 exact tokens of turn 0's input.  Llama-3.1-8B f16: 131072 B/token.
"""

from fractions import Fraction

import pytest

from kvsim.errors import InputError
from kvsim.metrics.accuracy import AccuracyConfig, Outcome, multiplier
from kvsim.policies.build import _check_eviction
from kvsim.policies.quantization import KiviConfig
from tests.policies.helpers import doc_session, references, run, scenario

BPT = 131072
IDLE = ["engine.cache_idle_slots=false"]


def test_a_recall_of_a_quant_backed_span_never_scores_below_leaving_it_demoted() -> None:
    cfg = AccuracyConfig()  # p_hit 0.95; exact: DEGRADED(4) 0.97, (2) 0.70, LOST 0.10
    # a miss reads the low-bit GPU copy: p·m(f16) + (1 − p)·m(QUANT at miss_bits)
    assert multiplier(cfg, Outcome("RECOVERED", miss_bits=8), "exact") == pytest.approx(1.0)
    assert multiplier(cfg, Outcome("RECOVERED", miss_bits=4), "exact") \
        == pytest.approx(0.95 + 0.05 * 0.97)  # 0.9985 > 0.97
    assert multiplier(cfg, Outcome("RECOVERED", miss_bits=2), "exact") \
        == pytest.approx(0.95 + 0.05 * 0.70)  # 0.985 > 0.70
    # an OFFLOADED span has no GPU copy: a miss is LOST, 0.95 + 0.05·0.10
    assert multiplier(cfg, Outcome("RECOVERED"), "exact") == pytest.approx(0.955)


def test_recoverable_eviction_to_q8_0_recovers_at_full_score() -> None:
    # the 16-token span was demoted to q8_0 (INTACT if read as is): 0.95·1 + 0.05·1 = 1.0;
    # the recall moves one 16-token page at f16: 16 × 131072 = 2097152 bytes
    _, res = run("policies=[{kind: recoverable_eviction, window_tokens: 1024, "
                 "cache_type: q8_0}]")
    [(label, m, _, nbytes)] = references(res)
    assert (label, m, nbytes) == ("RECOVERED", 1.0, 16 * BPT)


def test_kivi_bytes_follow_the_group_size() -> None:
    # b/8 + 4/G bytes (fp16 scale + zero per group): 2/8 + 4/128 = 9/32 B = 2.25 bits;
    # G=32: 2/8 + 4/32 = 3/8 B = 3 bits; over f16's 2 bytes: 9/64 and 3/16
    assert KiviConfig(bits=2, group_tokens=128).bytes_per_element() == Fraction(9, 32)
    assert KiviConfig(bits=2).bytes_per_element() == Fraction(3, 8)
    engine = scenario().engine
    assert _check_eviction(0, KiviConfig(bits=2, group_tokens=128), engine, 16384) \
        == (Fraction(9, 64), 2.0)
    # end of turn 2 the slot holds 3400+50+2000+20+20+10 − 1 = 5499 tokens; sealed groups
    # of 128 beyond the 128-token residual: (5499 − 128) // 128 × 128 = 5248 quantized,
    # at 131072 × 9/64 = 18432 B each = 96731136 B
    _, res = run("policies=[{kind: kivi, bits: 2, group_tokens: 128}]")
    assert res.summary["quantized_tokens"] == 5248
    assert res.memory["kv_quant_bytes"].iloc[-1] == 5248 * 18432 == 96731136


def test_idle_offload_of_a_kivi_slot_moves_its_quantized_bytes() -> None:
    # think 30 s > idle 10 s: the slot is offloaded after turns 0 and 1, restored by h2d.
    # After turn 0: 3449 tokens, (3449 − 128) // 32 × 32 = 3296 at 3/16 of 131072 B
    # (= 618 tokens' worth) + 153 at f16 → 771 × 131072 = 101056512 B (f16: 3449 × 131072).
    # After turn 1: 5469 tokens, 5312 quantized (996 tokens' worth) + 157 → 1153 × 131072.
    _, res = run(*IDLE, "policies=[{kind: idle_offload, idle_after_s: 10}, "
                 "{kind: kivi, bits: 2}]", sessions=[doc_session(think_s=30.0)])
    ev = res.events
    assert ev[ev["kind"] == "offload"]["bytes"].tolist() == [771 * BPT, 1153 * BPT]
    assert ev[ev["kind"] == "restore"]["bytes"].tolist() == [771 * BPT, 1153 * BPT]
    assert res.summary["offload_bytes"] == res.summary["restore_bytes"] == 1924 * BPT


def test_idle_drop_counts_the_dropped_tokens_as_evicted() -> None:
    # dropped after turn 0 (3449 tokens) and turn 1 (3450 + 2000 prompt + 19 out = 5469)
    _, res = run(*IDLE, "policies=[{kind: idle_offload, idle_after_s: 10, mode: drop}]",
                 sessions=[doc_session(think_s=30.0)])
    assert res.summary["evicted_tokens"] == 3449 + 5469 == 8918


def test_recoverable_eviction_needs_flash_attention_for_its_quantized_v() -> None:
    with pytest.raises(InputError, match=r"^policies\.0\.cache_type: 'q4_0' .*flash_attn"):
        run("engine.flash_attn=false",
            "policies=[{kind: recoverable_eviction, window_tokens: 1024}]")
