"""Policy configs refuse what every kvsim input model refuses (FrozenModel): true/false
for a number, .inf / .nan, unknown keys — one line naming the key the user wrote
(``policies.0.budget_tokens``, not pydantic's union tag), its value and what is
allowed, exit code 2."""

import pytest
from pydantic import ValidationError

from kvsim.policies import REGISTRY
from kvsim.policies.eviction import ScoreEvictionConfig, SlidingWindowConfig
from kvsim.policies.offload import HostKVCacheConfig, IdleOffloadConfig
from kvsim.scenario import load_scenario

BASE = ["simulate", "quickstart", "--set", "workload.max_sessions=1"]
FINITE = "Input should be a finite number"


@pytest.mark.parametrize("policy, line", [
    ("{kind: score_eviction, budget_tokens: true}",
     "policies.0.budget_tokens: True — a number, not true/false"),
    ("{kind: score_eviction, budget_tokens: .inf}", f"policies.0.budget_tokens: inf — {FINITE}"),
    ("{kind: sliding_window, window_tokens: 2048, sink_tokens: false}",
     "policies.0.sink_tokens: False — a number, not true/false"),
    ("{kind: kivi, residual_tokens: .nan}", f"policies.0.residual_tokens: nan — {FINITE}"),
    ("{kind: host_kv_cache, hicache_ratio: .inf}", f"policies.0.hicache_ratio: inf — {FINITE}"),
    ("{kind: host_kv_cache, hicache_ratio: true}",
     "policies.0.hicache_ratio: True — a number, not true/false"),
    ("{kind: idle_offload, idle_after_s: true}",
     "policies.0.idle_after_s: True — a number, not true/false"),
    ("{kind: idle_offload, idle_after_s: .inf}",
     "policies.0.idle_after_s: inf — a duration must be a finite number >= 0"),
    ("{kind: idle_offload, host_budget_bytes: false}",
     "policies.0.host_budget_bytes: False — a byte size such as '24 GiB' or an integer"),
    ("{kind: host_kv_cache, host_budget_bytes: .inf}",
     "policies.0.host_budget_bytes: inf — a byte size must be a finite number >= 0"),
    ("{kind: sliding_window, window_tokens: 2048, windw: 1}",
     "policies.0.windw: 1 — not a key here; allowed: sink_tokens, pin_system_prompt, "
     "chunk_tokens, pin_turn_boundaries, boundary_tokens, kind, window_tokens, write_back"),
    ("{kind: sliding_window}", "policies.0.window_tokens: 'missing' — required (given: kind)"),
    ("{kind: kivi, bits: true}", "policies.0.bits: True — Input should be 2 or 4"),
    ("{window_tokens: 2048}",
     "policies.0.kind: 'missing' — required: 'kind' says which kind this is"),
])
def test_bad_policy_value_through_the_cli(tmp_path, kvsim_cli, policy, line) -> None:
    out = tmp_path / "out"
    rc, err, _ = kvsim_cli(*BASE, "--set", f"policies=[{policy}]", "-o", out)
    assert (rc, err) == (2, f"error: {line}")
    assert not out.exists()


def test_bad_policy_in_the_second_list_entry(tmp_path, kvsim_cli) -> None:
    pols = "[{kind: idle_offload}, {kind: score_eviction, budget_tokens: .inf}]"
    rc, err, _ = kvsim_cli(*BASE, "--set", f"policies={pols}", "-o", tmp_path / "out")
    assert (rc, err) == (2, f"error: policies.1.budget_tokens: inf — {FINITE}")


def test_bad_policy_in_a_scenario_yaml(tmp_path, kvsim_cli) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("gpu: rtx-4060-ti-16gb\nmodel: llama-3.1-8b\nengine: llama.cpp\n"
                 "workload: {preset: family-4, max_sessions: 1}\n"
                 "policies:\n  - kind: score_eviction\n    budget_tokens: yes\n")
    rc, err, _ = kvsim_cli("simulate", p, "-o", tmp_path / "out")
    assert (rc, err) == (2, "error: policies.0.budget_tokens: True — a number, not true/false")


def test_good_policies_still_load_by_kind() -> None:
    pols = ("[{kind: score_eviction, budget_tokens: 2048.0, scope: global}, "
            "{kind: idle_offload, idle_after_s: '30 s', host_budget_bytes: '8 GiB'}]")
    sc = load_scenario("quickstart", [f"policies={pols}"])
    evict, offload = sc.policies
    assert isinstance(evict, ScoreEvictionConfig) and evict.budget_tokens == 2048
    assert isinstance(offload, IdleOffloadConfig)
    assert (offload.idle_after_s, offload.host_budget_bytes) == (30.0, 8 * 2**30)
    assert type(sc).model_validate(sc.model_dump()) == sc  # scenario.json round trip


def _numeric_fields(cls) -> list[str]:
    return [n for n, f in cls.model_fields.items() if f.annotation in (int, float, int | None)]


@pytest.mark.parametrize("cls", list(REGISTRY.values()), ids=list(REGISTRY))
def test_every_numeric_field_of_every_kind_refuses_a_bool_and_inf(cls) -> None:
    fields = _numeric_fields(cls)
    assert fields  # every kind has numbers (token counts, a ratio, a duration, a size)
    for name in fields:
        with pytest.raises(ValidationError, match="a number, not true/false"):
            cls.model_validate({name: True})
        with pytest.raises(ValidationError, match="finite"):
            cls.model_validate({name: float("inf")})


def test_python_callers_get_the_same_checks() -> None:
    with pytest.raises(ValidationError, match="a number, not true/false"):
        SlidingWindowConfig(window_tokens=True)
    with pytest.raises(ValidationError, match=FINITE):
        HostKVCacheConfig(hicache_ratio=float("inf"))
    with pytest.raises(ValidationError, match="frozen"):
        SlidingWindowConfig(window_tokens=64).window_tokens = 32  # type: ignore[misc]


def test_build_errors_use_the_same_path_as_validation_errors(tmp_path, kvsim_cli) -> None:
    rc, err, _ = kvsim_cli(*BASE, "--set", "policies=[{kind: sliding_window, "
                           "window_tokens: 20000}]", "-o", tmp_path / "out")
    assert rc == 2 and err.startswith("error: policies.0.window_tokens: 20000 — "), err
