"""Link contention, block-state ledger and accuracy multipliers (no simulation)."""

import pytest
import simpy
from pydantic import ValidationError

from kvsim.config.catalog import load_link
from kvsim.core.link import Link, transfer
from kvsim.metrics.accuracy import AccuracyConfig, Outcome, multiplier
from kvsim.policies.blocks import DROPPED, FULL, QUANT, Ledger, locate, seq_remove

GIB = 2**30


def _finish_times(n: int) -> list[float]:
    env = simpy.Environment()
    link = Link(load_link("pcie4-x16"))
    procs = [env.process(transfer(env, link, "h2d", GIB)) for _ in range(n)]
    env.run()
    return [p.value for p in procs]


def test_two_simultaneous_1gib_restores_take_twice_as_long_as_one() -> None:
    spec = load_link("pcie4-x16")
    one = spec.latency_s + GIB / spec.h2d_bytes_per_s  # 7.5 us + 1 GiB / 25 GB/s
    assert _finish_times(1) == pytest.approx([one], rel=1e-12)
    both = _finish_times(2)
    assert max(both) == pytest.approx(2 * one, rel=1e-12)
    assert max(both) / _finish_times(1)[0] == pytest.approx(2.0, rel=1e-9)


def test_opposite_directions_run_together_at_the_duplex_rate() -> None:
    spec = load_link("pcie4-x16")
    link = Link(spec)
    _, d2h_end = link.d2h.reserve(GIB, 0.0)
    _, h2d_end = link.h2d.reserve(GIB, 0.0)
    assert d2h_end == pytest.approx(spec.latency_s + GIB / spec.d2h_bytes_per_s)
    assert h2d_end == pytest.approx(spec.latency_s + GIB / (spec.h2d_bytes_per_s * 0.9))
    assert link.summary()["pcie_h2d_bytes"] == GIB


def test_ledger_marks_exact_intervals_and_sequences_lose_dropped_spans() -> None:
    led = Ledger()
    assert led.mark("a", 10, 30, QUANT, 4) == 20
    assert led.mark("a", 20, 40, DROPPED, only=(FULL,)) == 10  # only 30..40 was FULL
    assert led.iter_states("a", 0, 50) == [(0, 10, FULL, 16.0), (10, 30, QUANT, 4),
                                           (30, 40, DROPPED, 16.0), (40, 50, FULL, 16.0)]
    seq = (("sys/x", 0, 8), ("a", 0, 50))
    assert led.count(seq, (QUANT,)) == 20
    kept = seq_remove(seq, led.dropped_ranges())
    assert kept == (("sys/x", 0, 8), ("a", 0, 30), ("a", 40, 50))
    assert locate(kept, "a", 25, 45) == [(8 + 25, 25, 30), (8 + 30, 40, 45)]


def test_multipliers_follow_the_reference_table() -> None:
    cfg = AccuracyConfig()
    assert multiplier(cfg, Outcome("INTACT"), "exact") == 1.0
    assert multiplier(cfg, Outcome("INTACT", bits=8), "exact") == 1.0  # FP8/INT8 row
    assert multiplier(cfg, Outcome("DEGRADED", bits=4), "exact") == 0.97
    assert multiplier(cfg, Outcome("DEGRADED", bits=2), "exact") == 0.70
    assert multiplier(cfg, Outcome("DEGRADED", bits=2), "gist") == 0.98
    assert multiplier(cfg, Outcome("LOST"), "exact") == 0.10
    assert multiplier(cfg, Outcome("LOST"), "gist") == 0.90
    # "LOST at <= 1/8 kept": 0.0-0.1 exact, 0.5-0.8 gist (midpoints)
    assert multiplier(cfg, Outcome("LOST", kept=1 / 8), "exact") == 0.05
    assert multiplier(cfg, Outcome("LOST", kept=1 / 8), "gist") == 0.65
    assert multiplier(cfg, Outcome("LOST", kept=0.13), "gist") == 0.90
    assert multiplier(cfg, Outcome("COLLAPSE"), "gist") == 0.05
    # RECOVERED exact = p_hit * m(full) + (1 - p_hit) * m(LOST) = 0.95 + 0.05 * 0.1
    assert multiplier(cfg, Outcome("RECOVERED"), "exact") == pytest.approx(0.955)
    assert multiplier(cfg, Outcome("RECOVERED"), "gist") == 1.0


@pytest.mark.parametrize("bad,msg", [
    ({"exact": {"lost": 1.5}}, r"exact\.lost\s+Input should be less than or equal to 1"),
    ({"gist": {"collapse": -0.1}},
     r"gist\.collapse\s+Input should be greater than or equal to 0"),
    ({"p_hit": 2}, r"p_hit\s+Input should be less than or equal to 1"),
])
def test_multipliers_outside_unit_interval_are_refused(bad, msg) -> None:
    with pytest.raises(ValidationError, match=msg):
        AccuracyConfig.model_validate(bad)


def test_demoted_kv_pays_the_roofline_dequant_cost_per_byte() -> None:
    # roofline.py: dequantizing costs kv_dequant_factor (0.25) x the time to read those
    # bytes at the GPU's sustained KV bandwidth.  Under the spec-sheet roofline
    # (latency.rates=peak) on the quickstart GPU, RTX 4060 Ti 16GB, 288 GB/s
    # (docs/reference/gpus.csv) x 0.85 (GpuSpec bandwidth_efficiency) = 244.8e9 B/s:
    #   0.25 / 244.8e9 = 1.0212418e-12 s per byte
    from types import SimpleNamespace

    from kvsim.api import scenario_budget
    from kvsim.core.build import PoolSizing, make_scheduler
    from kvsim.latency.factory import make_latency_model
    from kvsim.policies.build import wire_policies
    from tests.policies.helpers import scenario

    sc = scenario("policies=[{kind: recoverable_eviction, window_tokens: 1024, "
                  "cache_type: q4_0}]", "latency.rates=peak")
    assert sc.gpu.name == "rtx-4060-ti-16gb"
    b = scenario_budget(sc)
    sizing = PoolSizing.from_budget(b)
    rt = make_scheduler(sc.engine, sizing, link=sc.link, host=sc.host,
                        wiring=wire_policies(sc, sizing, make_latency_model(sc, b))).policy
    assert rt.dequant_s_per_byte == pytest.approx(0.25 / 244.8e9, rel=1e-12)
    assert rt.dequant_s_per_byte == pytest.approx(1.0212418e-12, rel=1e-7)
    # a known demotion: tokens 0..1024 of session "s" in slot 0 demoted to q4_0.
    # Llama-3.1-8B f16 KV is 131,072 B/token (docs/reference/models.csv); q4_0 stores 18/32 B per
    # element against f16's 2 (docs/reference/engines.md §0): ratio 0.5625 / 2 = 9/32, so the
    # demoted tokens hold   1024 x 131,072 x 9/32 = 37,748,736 B
    # and each step of that slot's request dequantizes them:
    #   37,748,736 x 0.25 / 244.8e9 = 9,437,184 / 244.8e9 = 38.5506 us
    slot = rt.slots[0]
    slot.cache, slot.n_tokens = [("s", 0, 2048)], 2048
    rt.slot_session[0] = "s"
    assert rt.ledger("s").mark("s", 0, 1024, QUANT, 4) == 1024
    plan = SimpleNamespace(items=(SimpleNamespace(req=SimpleNamespace(slot_id=0)),))
    assert rt.steady_extra_s(plan) == pytest.approx(9_437_184 / 244.8e9, rel=1e-12)
    assert rt.steady_extra_s(plan) == pytest.approx(3.85506e-5, rel=1e-5)
    # the step the scheduler plans for that request carries the same stall as extra_s
    from kvsim.core.step import StepPlan
    from kvsim.latency.base import BatchShape

    req = SimpleNamespace(request_id="s-0", slot_id=0)
    step = StepPlan((SimpleNamespace(req=req),), BatchShape(decode_context=(2048,)))
    out = rt.after_schedule(step, 0.0)
    assert out.extra_s == pytest.approx(9_437_184 / 244.8e9, rel=1e-12)
    # a request in no slot pays nothing
    idle = SimpleNamespace(items=(SimpleNamespace(req=SimpleNamespace(slot_id=-1)),))
    assert rt.steady_extra_s(idle) == 0.0
