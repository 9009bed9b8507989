"""The engine command plan prints carries the pool knobs a scenario set: SGLang's
--max-total-tokens (docs/reference/engines.md §2.1), vLLM's --kv-cache-memory and
--num-gpu-blocks-override (§1.1) — else the real engine sizes another pool."""

from kvsim.plan.flags import engine_flags
from kvsim.scenario import resolve_scenario


def flags(preset: str, **knobs) -> str:
    return engine_flags(resolve_scenario({
        "gpu": "rtx-4090", "model": "llama-3.1-8b", "weights": "bf16",
        "engine": {"preset": preset, "context_tokens": 8192, **knobs},
        "workload": {"preset": "family-4", "days": 0.1}}))


def test_sglang_pool_cap_is_passed_on():
    assert flags("sglang", max_total_tokens=20000).endswith(
        "--kv-cache-dtype auto --max-total-tokens 20000")
    assert "--max-total-tokens" not in flags("sglang")


def test_vllm_pool_overrides_are_passed_on():
    assert flags("vllm", kv_cache_memory_bytes=2**31).endswith(
        "--kv-cache-dtype auto --kv-cache-memory 2147483648")
    assert flags("vllm", num_gpu_blocks_override=500).endswith(
        "--kv-cache-dtype auto --num-gpu-blocks-override 500")
    assert flags("vllm").endswith("--kv-cache-dtype auto")
