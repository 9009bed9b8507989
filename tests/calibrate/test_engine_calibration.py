"""Engine calibration's probing against the fake one-slot server.

The fake reuses the longest common prefix held in its slot, so every point's context
and token counts are known by hand (its times are just its own response times).
"""

import pytest

from kvsim.calibrate.engine import EngineGrid, calibrate_engine, ram_cache_link
from kvsim.calibrate.wire import TokenSpace
from kvsim.errors import InputError

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
