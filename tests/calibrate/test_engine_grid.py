"""``EngineGrid`` checks its own fields, so a library caller of ``measure_engine`` gets
the one line ``kvsim calibrate engine`` prints, before anything connects."""

from __future__ import annotations

import pytest

from kvsim.calibrate.engine import EngineGrid
from kvsim.errors import InputError

CTK = "the server's -ctk, one of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"


@pytest.mark.parametrize("kwargs, expected", [
    ({"prompt_tokens": ()}, "--prompts: () — one or more integers >= 1"),
    ({"prompt_tokens": (32, 0)}, "--prompts: (32, 0) — one or more integers >= 1"),
    ({"contexts": (0, -1)}, "--contexts: (0, -1) — one or more integers >= 0"),
    ({"contexts": (0, 1.5)}, "--contexts: (0, 1.5) — one or more integers >= 0"),
    ({"batches": (1, True)}, "--batches: (1, True) — one or more integers >= 1"),
    ({"batches": 4}, "--batches: 4 — one or more integers >= 1"),
    ({"decode_tokens": 1}, "--decode-tokens: 1 — an integer >= 2"),
    ({"repeats": 0}, "--repeats: 0 — an integer >= 1"),
    ({"decode_repeats": -2}, "--decode-repeats: -2 — an integer >= 1"),
    ({"n_batch": 0}, "n_batch: 0 — an integer >= 1"),
    ({"n_ubatch": 0}, "n_ubatch: 0 — an integer >= 1"),
    ({"small_chunk_tokens": -1}, "--small-chunk-tokens: -1 — an integer >= 0"),
    ({"cache_type": "q9"}, f"--cache-type: 'q9' — {CTK}"),
    ({"idle_s": float("nan")}, "idle_s: nan — a finite number of seconds >= 0"),
    ({"idle_s": -0.5}, "idle_s: -0.5 — a finite number of seconds >= 0"),
])
def test_a_bad_field_is_named(kwargs, expected):
    with pytest.raises(InputError) as exc:
        EngineGrid(**kwargs)
    assert str(exc.value) == expected


def test_lists_become_tuples_and_the_defaults_pass():
    grid = EngineGrid(prompt_tokens=[16, 80], contexts=[0], batches=[1], decode_tokens=2,
                      small_chunk_tokens=0, idle_s=0)
    assert (grid.prompt_tokens, grid.contexts, grid.batches) == ((16, 80), (0,), (1,))
    assert EngineGrid().cache_type == "f16"


URL = "http://127.0.0.1:9"  # nothing listens: a flag that passed would fail to connect


@pytest.mark.parametrize("flags, expected", [
    (["--decode-tokens", "1"], "--decode-tokens: 1 — an integer >= 2"),
    (["--repeats", "0"], "--repeats: 0 — an integer >= 1"),
    (["--decode-repeats", "0"], "--decode-repeats: 0 — an integer >= 1"),
    (["--small-chunk-tokens", "-1"], "--small-chunk-tokens: -1 — an integer >= 0"),
])
def test_the_cli_prints_the_grids_line(tmp_path, kvsim_cli, flags, expected):
    rc, err, _ = kvsim_cli("calibrate", "engine", "--url", URL, *flags,
                           "-o", tmp_path / "e.json")
    assert (rc, err) == (2, f"error: {expected}")
    assert not (tmp_path / "e.json").exists()
