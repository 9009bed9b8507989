"""Engine calibration's probing against the fake one-slot server.

The fake reuses the longest common prefix held in its slot, so every point's context
and token counts are known by hand (its times are just its own response times).
"""

from dataclasses import replace

import pytest

from kvsim.calibrate.engine import (
    EngineGrid,
    calibrate_engine,
    fit_grid,
    measure_engine,
    ram_cache_link,
)
from kvsim.calibrate.engine_noise import decode_spread, prefill_spread
from kvsim.calibrate.engine_samples import (
    DecodeSample,
    EngineSamples,
    PrefillSample,
    engine_artifact,
)
from kvsim.calibrate.wire import TokenSpace
from kvsim.errors import InputError
from kvsim.latency.artifact import FEATURES, FeatureRange, LatencyFit

from .fake_llama import FakeLlama

GRID = EngineGrid(prompt_tokens=(8, 32), contexts=(0, 64), batches=(1, 2), decode_tokens=5, idle_s=0.0,
                  repeats=2, space=TokenSpace(low=300, high=900))


def test_points_use_the_servers_cache_and_prompt_counts() -> None:
    with FakeLlama(slot_tokens=200) as srv:
        art = calibrate_engine(srv.url, GRID)
    pre = [(p.context, p.tokens, p.steps) for p in art.points if p.kind == "prefill"]
    # cached context C reused, P computed, as the server reported them
    assert pre == [(0, 8, 1), (0, 32, 1), (64, 8, 1), (64, 32, 1)]
    dec = [(p.batch, p.context, p.steps) for p in art.points if p.kind == "decode"]
    # the fake has one slot, so batch 2 is skipped; 5 tokens → 4 decode steps
    assert dec == [(1, 1, 4), (1, 64, 4)]
    assert all(0 < p.measured_s < 5 for p in art.points)
    assert art.source == "engine" and set(art.fits) == {"f16"}
    assert art.settings["slots"] == 1


def test_grid_larger_than_the_slot_is_refused() -> None:
    with FakeLlama(slot_tokens=50) as srv, pytest.raises(InputError, match="larger -c"):
        calibrate_engine(srv.url, GRID)


def test_default_contexts_shrink_to_the_slot() -> None:
    # 60 cells: 32-token prompts + 5 decoded leave 23 cached tokens at most
    with FakeLlama(slot_tokens=60) as srv:
        art = calibrate_engine(srv.url, GRID, fit_contexts=True)
    assert art.grid["context"] == [0, 23]
    pre = sorted({(p.context, p.tokens) for p in art.points if p.kind == "prefill"})
    assert pre == [(0, 8), (0, 32), (23, 8), (23, 32)]


def test_fit_grid_keeps_what_fits_and_rounds_the_largest_to_256() -> None:
    grid = EngineGrid(prompt_tokens=(32, 128, 512), contexts=(0, 512, 1536))
    assert fit_grid(grid, 2048).contexts == (0, 512, 1280)   # 2048 - 512 - 48 = 1488
    assert fit_grid(grid, 4096) is grid                        # it fits as it is
    assert fit_grid(grid, 500) is grid                         # prompts alone overflow


def test_ram_cache_link_from_the_measured_cost() -> None:
    with FakeLlama(slot_tokens=200) as srv:
        art = calibrate_engine(srv.url, GRID)
    # the fake keeps no RAM cache: nothing measured, and no link can be made
    assert "ram_cache_s_per_token" not in art.settings
    with pytest.raises(InputError, match="no RAM-cache cost"):
        ram_cache_link(art, 3072)
    # a round trip of 2 µs per token of 3072 bytes, split evenly: 1 µs each way
    measured = art.model_copy(update={"settings": {"ram_cache_s_per_token": 2e-6}})
    link = ram_cache_link(measured, 3072)
    assert link.h2d_bytes_per_s == pytest.approx(3072 / 1e-6)
    assert link.d2h_bytes_per_s == pytest.approx(3072 / 1e-6)
    # measured separately: save 3 µs/token (d2h), restore 0.5 µs/token (h2d)
    both = art.model_copy(update={"settings": {"ram_cache_save_s_per_token": 3e-6,
                                               "ram_cache_restore_s_per_token": 5e-7,
                                               "ram_cache_fixed_s": 0.004}})
    link = ram_cache_link(both, 3072)
    assert link.d2h_bytes_per_s == pytest.approx(3072 / 3e-6)
    assert link.h2d_bytes_per_s == pytest.approx(3072 / 5e-7)
    assert link.latency_s == 0.004  # the fixed cost per copy


def test_rounds_visit_every_point_before_repeating_one() -> None:
    with FakeLlama(slot_tokens=200) as srv:
        calibrate_engine(srv.url, GRID)
    # measured requests (the warm-up asks 2 tokens, context fills ask 1 token of a
    # prompt that the next one extends): prompt length and n_predict, in order
    sent = [(len(b["prompt"]), b["n_predict"]) for b in srv.bodies[1:]]
    round_len = len(sent) // 2
    # both rounds send the same sequence: 4 prefill points (2 with a 64-token fill
    # first), then the two batch-1 decodes of 5 tokens, each decode_repeats times
    assert sent[:round_len] == [(8, 1), (32, 1), (64, 1), (72, 1), (64, 1), (96, 1),
                                (1, 5), (1, 5), (1, 5), (64, 5), (64, 5), (64, 5)]
    assert sent[round_len:] == sent[:round_len]


def test_samples_of_separate_rounds_pool_into_one_fit() -> None:
    one = replace(GRID, repeats=1)
    with FakeLlama(slot_tokens=200) as srv:
        first = measure_engine(srv.url, one)
        pooled = first.extend(measure_engine(srv.url, one))
        art = engine_artifact(pooled, one)
    assert pooled.rounds == 2 and art.settings["repeats"] == 2
    assert [p.repeats for p in art.points] == [2, 2, 2, 2, 6, 6]
    # the fake streams a token every 2.5 ms on its own clock: 4 steps take 10 ms
    dec = [p.measured_s for p in art.points if p.kind == "decode"]
    assert dec == pytest.approx([0.010, 0.010])


def test_decode_spread_is_each_gap_over_the_fitted_step() -> None:
    coef = {"step": 1e-3, "prefill_seq": 0.0, "prefill_token": 0.0, "prefill_attn": 0.0,
            "prefill_attn_small": 0.0, "decode_seq": 2e-4, "decode_kv": 1e-6}
    fit = LatencyFit(cache_type="f16", coefficients_s=coef, mape=0.0, max_ape=0.0, points=1,
                     valid={n: FeatureRange(min=0.0, max=1.0) for n in FEATURES[1:]},
                     max_context=100, max_batch=2)

    def fitted(b: int, ctx: int) -> float:  # one decode step by hand
        return 1e-3 + b * 2e-4 + b * 1e-6 * ctx

    # batch 1 from 10 cached tokens: four warm-up gaps (left out, however slow), then
    # gaps at contexts 14..17 measured at 1.0, 2.0, 1.0 and 0.5 times the fit (its point's
    # median ratio 1.0); batch 2 from an empty context (counted as 1): after its
    # warm-up, gaps at contexts 5 and 6 measured at 3.0 and 3.0 times the fit — a fit
    # error the prediction carries already: divided by the point's median, both are 1.0
    warm = (9.0,) * 4
    samples = EngineSamples(props={}, decode={
        (1, 10): [DecodeSample(0.0, 8, warm + (fitted(1, 14), 2.0 * fitted(1, 15),
                                               fitted(1, 16), 0.5 * fitted(1, 17)))],
        (2, 0): [DecodeSample(0.0, 6, warm + (3.0 * fitted(2, 5), 3.0 * fitted(2, 6)))]})
    spread = decode_spread(samples, fit)
    # ratios 0.5, 1.0, 1.0, 1.0, 1.0, 2.0 at 101 quantiles (inverted_cdf: q·6 rounded up)
    assert len(spread) == 101
    assert (spread[0], spread[16], spread[17], spread[83], spread[84], spread[100]) == \
        pytest.approx((0.5, 0.5, 1.0, 1.0, 2.0, 2.0))


def test_decode_spread_leaves_out_how_fast_each_round_ran() -> None:
    coef = {"step": 1e-3, "prefill_seq": 0.0, "prefill_token": 0.0, "prefill_attn": 0.0,
            "prefill_attn_small": 0.0, "decode_seq": 0.0, "decode_kv": 0.0}
    fit = LatencyFit(cache_type="f16", coefficients_s=coef, mape=0.0, max_ape=0.0, points=1,
                     valid={n: FeatureRange(min=0.0, max=1.0) for n in FEATURES[1:]},
                     max_context=100, max_batch=1)
    warm = (9.0,) * 4
    # the fit says 1 ms a step; round 0 measured 1, 1, 2 ms, round 1 (a machine running
    # 1.5x slower) 1.5, 1.5, 3 ms: within each round the gaps are 1, 1, 2 times its median
    rounds = [DecodeSample(0.0, 7, warm + (1e-3, 1e-3, 2e-3), round=0),
              DecodeSample(0.0, 7, warm + (1.5e-3, 1.5e-3, 3e-3), round=1)]
    spread = decode_spread(EngineSamples(props={}, decode={(1, 10): rounds}), fit)
    assert (spread[0], spread[66], spread[67], spread[100]) == pytest.approx(
        (1.0, 1.0, 2.0, 2.0))
    # rounds pooled with extend keep apart: the second call's round 0 becomes round 1
    first = EngineSamples(props={}, decode={(1, 10): rounds[:1]}, rounds=1)
    second = EngineSamples(props={}, decode={(1, 10): [replace(rounds[1], round=0)]}, rounds=1)
    pooled = first.extend(second)
    assert [v.round for v in pooled.decode[(1, 10)]] == [0, 1]
    assert decode_spread(pooled, fit) == spread


def test_prefill_spread_over_each_points_and_rounds_median() -> None:
    # two points, two rounds; round 1 ran 2x slower throughout.  Point (0, 16): 10 and
    # 20 ms; point (0, 64): 30 and 60 ms.  Each over its point's median (15 / 45 ms) then
    # over its round's median: every ratio is 1 — the drift is not spread
    s = EngineSamples(props={}, prefill={
        (0, 16): [PrefillSample(0.010, 0, 16, 0), PrefillSample(0.020, 0, 16, 1)],
        (0, 64): [PrefillSample(0.030, 0, 64, 0), PrefillSample(0.060, 0, 64, 1)]})
    assert prefill_spread(s) == pytest.approx((1.0,) * 101)
    # one round: point (0, 16) at 10 and 20 ms, point (0, 64) at 40 and 10 ms
    s.prefill[(0, 16)] = [PrefillSample(0.010, 0, 16, 0), PrefillSample(0.020, 0, 16, 0)]
    s.prefill[(0, 64)] = [PrefillSample(0.040, 0, 64, 0), PrefillSample(0.010, 0, 64, 0)]
    got = prefill_spread(s)
    # point medians 15 and 25 ms: ratios 0.667, 1.333, 1.6, 0.4; round median 1.0
    assert (got[0], got[100]) == pytest.approx((0.4, 1.6))


def _cli(srv: FakeLlama, out, *flags: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "kvsim", "calibrate", "engine", "--url",
                           srv.url, "--prompts", "8,32", "--batches", "1", "--decode-tokens",
                           "5", "--repeats", "1", "--token-range", "300:900", *flags,
                           "-o", str(out)], capture_output=True, text=True, timeout=120,
                          check=False)


def test_the_cli_fits_its_default_contexts_but_not_the_users(tmp_path) -> None:
    import json

    with FakeLlama(slot_tokens=600) as srv:
        r = _cli(srv, tmp_path / "e.json")
        mine = _cli(srv, tmp_path / "mine.json", "--contexts", "0,1536")
    # 600 - 32 - 5 = 563 cached tokens fit: 0 and 512 kept, 1536 becomes 512 (256s)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "e.json").read_text())["grid"]["context"] == [0, 512]
    assert "note: cached contexts 0,512 (the default grid's, shrunk" in r.stderr
    assert mine.returncode == 2 and "larger -c" in mine.stderr
    assert not (tmp_path / "mine.json").exists()
