"""SGLang's ``--max-total-tokens`` caps the KV pool (docs/reference/engines.md §2.1): the pool is
min(profiled, cap), aligned down to whole pages; a cap above the profiled pool changes
nothing (SGLang warns "max_total_tokens=… is larger than the profiled value … Use the
profiled value instead.", sglang srt/model_executor/model_runner.py).

Needs kvsim.engines._paged_layout.paged_budget to apply the cap (the lead's patch).
"""

from __future__ import annotations

from kvsim.api import scenario_budget
from kvsim.config.catalog import load_gpu, load_model
from kvsim.core.build import PoolSizing, make_scheduler
from kvsim.engines.budget import memory_budget
from kvsim.engines.resolve import engine_for_gpu
from kvsim.scenario import load_scenario

GPU, MODEL = load_gpu("rtx-4090"), load_model("llama-3.1-8b")
F16_TOKEN = 32 * 8 * (128 * 2 + 128 * 2)  # §0: Llama-3.1-8B f16 = 128 KiB per token


def _budget(**knobs):
    eng = engine_for_gpu({"preset": "sglang", "context_tokens": 8192, **knobs}, GPU, MODEL)
    return memory_budget(GPU, MODEL, "bf16", eng)


def test_a_cap_below_the_profiled_pool_sizes_it():
    profiled = _budget()
    assert profiled.kv_pool_tokens > 20000 and F16_TOKEN == 131_072
    capped = _budget(max_total_tokens=20000)
    assert (capped.kv_pool_tokens, capped.num_gpu_blocks) == (20000, 20000)
    assert capped.kv_reserved_bytes == 20000 * F16_TOKEN == 2_621_440_000
    assert capped.log_lines[0] == "mem_fraction_static=0.847, max_total_tokens=20000, " \
                                  "page_size=1"
    assert capped.fits and capped.total_bytes < profiled.total_bytes


def test_the_cap_is_aligned_down_to_whole_pages():
    b = _budget(max_total_tokens=20000, block_tokens=64)
    assert (b.kv_pool_tokens, b.num_gpu_blocks) == (19968, 312)  # 20000 // 64 * 64


def test_a_cap_above_the_profiled_pool_keeps_the_profiled_pool():
    profiled = _budget()
    above = _budget(max_total_tokens=10**8)
    assert (above.kv_pool_tokens, above.kv_reserved_bytes) == (
        profiled.kv_pool_tokens, profiled.kv_reserved_bytes)


def test_a_simulated_run_gets_the_capped_pool():
    engine = "engine={preset: sglang, context_tokens: 16384, max_total_tokens: 20000}"
    s = load_scenario("family-4-vllm", [engine])
    sizing = PoolSizing.from_budget(scenario_budget(s))
    assert sizing.kv_pool_tokens == 20000
    assert make_scheduler(s.engine, sizing).pool.num_free == 20000
