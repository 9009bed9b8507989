"""Engine calibration's probing against the fake one-slot server.

The fake reports prompt_ms = 1 + prompt length and predicted_ms = 2 per token, and
reuses the longest common prefix held in its slot, so every point's context / tokens
and time are known by hand.
"""

import pytest

from kvsim.calibrate.engine import EngineGrid, calibrate_engine
from kvsim.calibrate.wire import TokenSpace
from kvsim.errors import InputError

from .fake_llama import FakeLlama

GRID = EngineGrid(prompt_tokens=(8, 32), contexts=(0, 64), batches=(1, 2), decode_tokens=5,
                  repeats=2, space=TokenSpace(low=300, high=900))


def test_points_use_the_servers_cache_and_prompt_counts() -> None:
    with FakeLlama(slot_tokens=200) as srv:
        art = calibrate_engine(srv.url, GRID)
    pre = [(p.context, p.tokens, p.measured_s) for p in art.points if p.kind == "prefill"]
    # cached context C reused, P computed; prompt_ms = 1 + C + P
    assert pre == [(0, 8, 0.009), (0, 32, 0.033), (64, 8, 0.073), (64, 32, 0.097)]
    dec = [(p.batch, p.context, p.steps, p.measured_s) for p in art.points if p.kind == "decode"]
    # the fake has one slot, so batch 2 is skipped; 5 tokens → 4 decode steps, 10 ms
    assert dec == [(1, 64, 4, 0.010)]
    assert art.source == "engine" and set(art.fits) == {"f16"}
    assert art.settings["slots"] == 1


def test_grid_larger_than_the_slot_is_refused() -> None:
    with FakeLlama(slot_tokens=50) as srv, pytest.raises(InputError, match="larger -c"):
        calibrate_engine(srv.url, GRID)
