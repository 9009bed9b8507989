"""llama.cpp runs one step's batch as ubatches, one graph each (kvsim.engines.llama_cpp.
llama_ubatches): a decode beside another slot's prompt, or decoding slots whose ids are
not consecutive, run as several graphs on per-slot streams, and a calibrated model prices
each graph as the one-graph step of its shape."""

import pytest
from core_helpers import req

from kvsim.core.slot_scheduler import SlotScheduler
from kvsim.engines import engine_for
from kvsim.engines.llama_cpp import llama_ubatches
from kvsim.latency.artifact import FEATURES, FeatureRange, LatencyFit
from kvsim.latency.base import BatchShape
from kvsim.latency.calibrated import CalibratedLatencyModel


def test_per_slot_streams_split_by_consecutive_sequence_ids() -> None:
    """llama-batch.cpp split_equal(n_ubatch, sequential=true): a ubatch takes the
    sequences of consecutive ids from the first one with tokens left, the same number of
    tokens of each (the fewest any has left, at most n_ubatch in all)."""
    # slots 0-2 decode, slot 3 prompts 490 tokens: one token of each, then the prompt's rest
    assert llama_ubatches([(0, 1), (1, 1), (2, 1), (3, 490)], 512, unified=False) == [
        [(0, 1), (1, 1), (2, 1), (3, 1)], [(3, 489)]]
    # slots 0, 2, 3 decode, slot 1 prompts: {0, 1}, then {2, 3} (3 is not 1 + 1), then 1
    assert llama_ubatches([(0, 1), (2, 1), (3, 1), (1, 490)], 512, unified=False) == [
        [(0, 1), (3, 1)], [(1, 1), (2, 1)], [(3, 489)]]
    # two prompts beside two decodes: 256 of each fill a ubatch (2 x 256 = 512), then the
    # 43 slot 2 has left beside 43 of slot 3, then slot 3's last 190
    assert llama_ubatches([(0, 1), (1, 1), (2, 300), (3, 490)], 512, unified=False) == [
        [(0, 1), (1, 1), (2, 1), (3, 1)], [(2, 256), (3, 256)], [(2, 43), (3, 43)],
        [(3, 190)]]
    # decoding slots 0 and 2: two graphs; 0, 1, 2: one
    assert llama_ubatches([(0, 1), (2, 1)], 512, unified=False) == [[(0, 1)], [(1, 1)]]
    assert llama_ubatches([(0, 1), (1, 1), (2, 1)], 512, unified=False) == [
        [(0, 1), (1, 1), (2, 1)]]
    assert llama_ubatches([(1, 600)], 512, unified=False) == [[(0, 512)], [(0, 88)]]


def test_one_stream_splits_every_n_ubatch_tokens_in_batch_order() -> None:
    """split_simple (-kvu): the batch's tokens in order, n_ubatch to a ubatch."""
    assert llama_ubatches([(0, 1), (2, 1), (3, 490)], 512, unified=True) == [
        [(0, 1), (1, 1), (2, 490)]]
    assert llama_ubatches([(0, 1), (1, 2000)], 512, unified=True) == [
        [(0, 1), (1, 511)], [(1, 512)], [(1, 512)], [(1, 465)]]


def _four_slots(unified: bool = False) -> SlotScheduler:
    cfg = type("Cfg", (), {"n_ubatch": 512, "allocator": "unified" if unified else "slots"})
    return SlotScheduler(parallel=4, slot_tokens=4096, pool_cells=4 * 4096, unified=unified,
                         bytes_per_token=10, reserved_bytes=10 * 4 * 4096, n_batch=2048,
                         cache_ram_bytes=0,
                         ubatch_split=engine_for("llama.cpp").ubatch_split(cfg))


def _decoding(s: SlotScheduler, names: str, now: float = 0.0) -> float:
    """Each named session's 100-token prompt computed (one slot each, in order): they
    decode from the next step on."""
    for name in names:
        s.add_request(req(f"{name}#0", [(name, 100)], out=50), now)
    plan = s.schedule(now)
    s.complete(plan, now + 0.01)
    return now + 0.01


def test_a_decode_step_beside_a_prompt_is_two_graphs() -> None:
    s = _four_slots()
    now = _decoding(s, "ABC")
    s.add_request(req("D#0", [("D", 490)], out=5), now)
    plan = s.schedule(now)
    # slots 0-2 decode at 101 tokens (100 prompt + the token sampled from it), slot 3
    # computes its 490-token prompt: a graph of 3 decodes + the prompt's first token,
    # then one of the other 489 on the 1 already computed
    assert plan.batch.ubatches == (
        BatchShape(prefill_tokens=(1,), prefill_context=(0,), decode_context=(100, 100, 100)),
        BatchShape(prefill_tokens=(489,), prefill_context=(1,)))
    assert (plan.batch.prefill_tokens, plan.batch.decode_context) == ((490,), (100, 100, 100))
    assert s.decode_stretch_limit(plan) == 0  # not a decode-only plan anyway
    # on one stream (-kvu) the same 493 tokens are one ubatch
    u = _four_slots(unified=True)
    now = _decoding(u, "ABC")
    u.add_request(req("D#0", [("D", 490)], out=5), now)
    assert u.schedule(now).batch.ubatches == ()


def test_decoding_slots_not_consecutive_run_as_two_graphs_step_by_step() -> None:
    s = _four_slots()
    now = _decoding(s, "ABC")
    s.pool.slots[1].req.max_output_tokens = 1  # B stops after its first token
    s.complete(s.schedule(now), now + 0.01)
    plan = s.schedule(now + 0.01)  # slots 0 and 2 decode
    assert plan.batch.decode_context == (101, 101)
    assert plan.batch.ubatches == (BatchShape(decode_context=(101,)),
                                   BatchShape(decode_context=(101,)))
    assert s.decode_stretch_limit(plan) == 0  # a stretch prices one graph per step


def _fit(step_s: float = 0.004) -> LatencyFit:
    coef = dict.fromkeys(FEATURES, 0.0) | {"step": step_s, "prefill_token": 1e-5,
                                           "decode_seq": 1e-4, "decode_kv": 1e-8}
    return LatencyFit(cache_type="f16", coefficients_s=coef, mape=0.0, max_ape=0.0,
                      points=1, max_context=8192, max_batch=4,
                      valid={n: FeatureRange(min=0, max=1e12) for n in FEATURES})


def test_a_calibrated_step_pays_its_constant_once_per_graph() -> None:
    model = CalibratedLatencyModel(_fit())
    one = BatchShape(prefill_tokens=(490,), prefill_context=(0,), decode_context=(100,) * 3)
    two = BatchShape(prefill_tokens=(490,), prefill_context=(0,), decode_context=(100,) * 3,
                     ubatches=(BatchShape((1,), (0,), (100,) * 3), BatchShape((489,), (1,))))
    # 4 ms + 490 x 10 us + 3 x 100 us + 300 KV tokens x 10 ns = 9.203 ms; a second graph
    # adds the 4 ms constant
    assert model.step_time_s(one) == pytest.approx(0.009203)
    assert model.step_time_s(two) == pytest.approx(0.013203)


def test_each_graph_is_priced_as_the_one_graph_step_of_its_shape() -> None:
    """A 100-token prompt run as two graphs (60 tokens, then 40 on those 60) pays each
    graph's constant and sequence set-up, and each piece's attention at its own size class
    (both under the 64-token small-chunk tile: 3 us a pair), where the whole step priced as
    one graph took one set-up and the large-chunk rate (1 us a pair) for 100 tokens."""
    coef = dict.fromkeys(FEATURES, 0.0) | {"step": 4e-3, "prefill_seq": 5e-3,
                                           "prefill_token": 1e-5, "prefill_attn": 1e-6,
                                           "prefill_attn_small": 3e-6}
    fit = LatencyFit(cache_type="f16", coefficients_s=coef, mape=0.0, max_ape=0.0, points=1,
                     max_context=8192, max_batch=4, small_chunk_tokens=64,
                     valid={n: FeatureRange(min=0, max=1e12) for n in FEATURES})
    model = CalibratedLatencyModel(fit)
    whole = BatchShape(prefill_tokens=(100,), prefill_context=(0,))
    split = BatchShape(prefill_tokens=(100,), prefill_context=(0,),
                       ubatches=(BatchShape((60,), (0,)), BatchShape((40,), (60,))))
    # one graph: 4 + 5 + 100 x 0.01 + 100 x 50 pairs x 1 us = 15 ms
    assert model.step_time_s(whole) == pytest.approx(0.015)
    # 4 + 5 + 0.6 + 60 x 30 x 3 us (5.4) = 15 ms, then 4 + 5 + 0.4 + 40 x 80 x 3 us (9.6)
    # = 19 ms
    assert model.step_time_s(split) == pytest.approx(0.034)
    assert model.clamped_steps == 0


def test_a_step_is_counted_clamped_once_whatever_its_graphs() -> None:
    fit = _fit().model_copy(update={"valid": {n: FeatureRange(min=0, max=100)
                                              for n in FEATURES}})
    model = CalibratedLatencyModel(fit)
    split = BatchShape(prefill_tokens=(300,), prefill_context=(0,),
                       ubatches=(BatchShape((150,), (0,)), BatchShape((150,), (150,))))
    # each graph's 150 tokens clamped at the measured 100: 4 ms + 100 x 10 us, twice
    assert model.step_time_s(split) == pytest.approx(2 * 0.005)
    assert model.clamped_steps == 1
