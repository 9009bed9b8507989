"""The scenario keys the fuzz tests draw from, with good, edge and wrong values.

The keys are read from the pydantic models (scenario, engine, workload, latency, accuracy,
sim), so a new knob is fuzzed without editing this file.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from kvsim.config.workload import WorkloadConfig
from kvsim.engines.config import PagedEngineConfig, SlotEngineConfig
from kvsim.latency.config import CalibratedConfig, ConstantConfig, RooflineConfig
from kvsim.metrics.accuracy import AccuracyConfig
from kvsim.scenario import Scenario, SimOptions

BASE: dict[str, Any] = {
    "name": "fuzz", "seed": 0, "gpu": "rtx-4060-ti-16gb", "model": "llama-3.2-1b",
    "weights": "q4_k_m",
    "engine": {"preset": "llama.cpp", "ctx_size": 8192, "parallel": 2},
    "workload": {"preset": "family-2", "days": 1, "max_sessions": 1},
}

GOOD: dict[str, list[Any]] = {
    "gpu": ["rtx-4090", "rtx-3060-12gb", "apple-m2-8c", "no-such-gpu"],
    "model": ["llama-3.1-8b", "gemma-2-2b", "mamba-2-2.7b", "gpt-oss-20b", "no-such-model"],
    "weights": ["bf16", "q8_0", "q4_0", "mxfp4", "awq", "q9_9"],
    "link": ["pcie4-x16", "unified", "pcie9"], "host": ["desktop-32gb", "no-such-host"],
    "engine.preset": ["llama.cpp", "ollama", "vllm", "sglang", "tgi"],
    "engine.cache_type_k": ["q8_0", "q4_0", "fp8", "f32"],
    "engine.cache_type_v": ["q8_0", "q4_0", "fp8"],
    "engine.allocator": ["slots", "unified", "paged"],
    "engine.ollama_version": ["0.33.0", "0.1.0", "x"],
    "workload.preset": ["family-4", "family-6", "no-such-household"],
    "workload.trace": ["missing.jsonl", "missing.parquet", "."],
    "workload.after_failure": ["new_chat", "end_session", "continue", "retry"],
    "latency.kind": ["roofline", "calibrated", "constant", "magic"],
    "latency.backend": ["auto", "CUDA", "Metal", "cuda"],
    "latency.path": ["missing.json", "."], "latency.constants": ["missing.yaml"],
    "sim.fidelity": ["fast", "step", "exact"],
}
"""Values that are (or are close to) right for a key."""

# NOTE: keys that size the run get only small or invalid values, so a case stays fast
SIZE_KEYS = {"workload.days": [0.01, 0.5, 2], "workload.max_sessions": [1, 2],
             "workload.time_scale": [0.5, 1, 3], "sim.max_sim_time_s": [1, 60, 3600],
             "sim.sample_interval_s": [0.1, 1, 60], "engine.max_queue": [1, 4]}
EDGE: list[Any] = [0, -1, 1, 7, 2**31, 2**63, 10**30, -(10**30), 0.5, 1e-9, 1e308, math.nan,
                   math.inf, -math.inf, "", "x", "ünï ✓ 汉字", "1 GiB", "16Ki", "1e99", True,
                   False, None, [], {}, [1, "a"], {"a": {"b": [1]}}, "\t\x07"]
BAD_SMALL: list[Any] = [0, -1, -0.5, math.nan, -math.inf, "", "x", True, None, [], {"a": 1}]


def _keys() -> dict[str, list[Any]]:
    """Every real key (dotted) with its good values: the listed ones and its default."""
    out: dict[str, list[Any]] = {}
    sections = {"": Scenario, "engine": SlotEngineConfig, "sim": SimOptions,
                "workload": WorkloadConfig, "accuracy": AccuracyConfig}
    models = [(s, m) for s, m in sections.items()] + [("engine", PagedEngineConfig)] + [
        ("latency", m) for m in (RooflineConfig, CalibratedConfig, ConstantConfig)]
    for section, model in models:
        for name, field in model.model_fields.items():
            key = f"{section}.{name}" if section else name
            default = field.default
            good = [default] if isinstance(default, (int, float, str)) else []
            out.setdefault(key, []).extend(good + GOOD.get(key, []))
    return out


KEYS = _keys()


def value_for(key: str) -> st.SearchStrategy[Any]:
    """Good, edge or random values for ``key`` (size keys: small or invalid only)."""
    if key in SIZE_KEYS:
        return st.sampled_from(SIZE_KEYS[key] + BAD_SMALL)
    good = KEYS.get(key) or [1]
    nested = st.recursive(st.none() | st.integers() | st.text(max_size=4),
                          lambda c: st.lists(c, max_size=2) | st.dictionaries(
                              st.text(max_size=3), c, max_size=2), max_leaves=4)
    wrong = st.one_of(st.sampled_from(EDGE), st.integers(), st.floats(), st.text(max_size=12),
                      nested)
    return st.one_of(st.sampled_from(good), st.sampled_from(good), wrong)
