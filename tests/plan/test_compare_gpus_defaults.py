"""kvsim compare --gpus: each card gets the defaults a real engine derives from it.

SGLang's mem_fraction_static (docs/reference/engines.md §2.1, TP = PP = 1):
  16 GiB: chunk 2048, cuda-graph bs 8:  reserved 512 + 1.5 x 2048 + 2 x 8 + 128 = 3,728 MiB
          (16,384 - 3,728) / 16,384 = 0.7724 -> 0.772
  24 GiB: chunk 2048, cuda-graph bs 24: reserved 512 + 3,072 + 48 + 128 = 3,760 MiB
          (24,576 - 3,760) / 24,576 = 0.8470 -> 0.847
Ollama's num_ctx from v0.15.5 (§4.1): under 23 GiB 4096, from 23 GiB 32768.
"""

from __future__ import annotations

from kvsim.plan.compare import compare_gpus, on_each_gpu, with_gpu
from kvsim.scenario import load_scenario

CARDS = ["rtx-4060-ti-16gb", "rtx-4090"]
SGLANG = ["engine={preset: sglang, context_tokens: 8192}", "weights=awq"]


def test_each_card_resolves_its_own_engine_defaults() -> None:
    sg = on_each_gpu("quickstart", SGLANG, CARDS)
    assert [sg[g].engine.gpu_memory_utilization for g in CARDS] == [0.772, 0.847]
    ol = on_each_gpu("quickstart", ["engine=ollama"], CARDS)
    assert [ol[g].engine.context_tokens for g in CARDS] == [4096, 32768]
    assert [ol[g].host.name for g in CARDS] == ["desktop-64gb", "desktop-64gb"]


def test_a_resolved_scenario_moved_to_another_card_keeps_the_first_cards_values() -> None:
    # why the CLI builds each card from the user's scenario: with_gpu starts from
    # resolved values, and the 16 GiB card's fraction stays on the 24 GiB one
    base = load_scenario("quickstart", SGLANG)
    assert with_gpu(base, "rtx-4090").engine.gpu_memory_utilization == 0.772


def test_compare_gpus_searches_the_scenarios_it_is_given() -> None:
    seen = {}

    def search(s, constraints, grid):
        seen[s.gpu.name] = s.engine.gpu_memory_utilization
        raise StopIteration  # the search itself is not under test

    base = load_scenario("quickstart", SGLANG)
    try:
        compare_gpus(base, CARDS[1:], None, None, search_fn=search,
                     scenarios=on_each_gpu("quickstart", SGLANG, CARDS[1:]))
    except StopIteration:
        pass
    assert seen == {"rtx-4090": 0.847}
