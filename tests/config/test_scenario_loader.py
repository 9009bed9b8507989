"""Scenario loading: profile names resolved, --set overrides, stable hash."""

import pytest
import yaml

from kvsim.errors import InputError
from kvsim.scenario import apply_overrides, load_scenario, scenario_hash

BASE = {"name": "t", "gpu": "rtx-4090", "model": "llama-3.1-8b", "weights": "q4_k_m",
        "engine": {"preset": "llama.cpp", "ctx_size": 16384, "parallel": 2},
        "workload": {"preset": "family-4"}}


def write(tmp_path, data, name="s.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_load_resolves_profiles(tmp_path):
    s = load_scenario(write(tmp_path, BASE))
    assert s.gpu.memory_bytes == 24 * 2**30
    assert s.link.name == "pcie4-x16" and s.host.name == "desktop-64gb"
    # -c 16384 over 2 slots: 8192 per session
    assert (s.engine.ctx_size, s.engine.context_tokens, s.engine.parallel) == (16384, 8192, 2)


def test_set_overrides(tmp_path):
    s = load_scenario(write(tmp_path, BASE), ["engine.parallel=4", "display_reserve_bytes=1 GiB",
                                               "gpu=rtx-5090"])
    assert s.engine.parallel == 4 and s.display_reserve_bytes == 2**30
    assert s.link.name == "pcie5-x16"


def test_hash_is_stable_and_ignores_labels(tmp_path):
    a = load_scenario(write(tmp_path, BASE, "a.yaml"))
    b = load_scenario(write(tmp_path, {**BASE, "name": "other", "description": "x"}, "b.yaml"))
    c = load_scenario(write(tmp_path, BASE, "c.yaml"), ["engine.parallel=3"])
    assert scenario_hash(a) == scenario_hash(b) != scenario_hash(c)
    assert len(scenario_hash(a)) == 16


@pytest.mark.parametrize("sets,match", [
    (["bogus_key=1"], "not a key here; allowed: name, description, seed"), (["engine.parallel=0"], "greater than 0"),
    (["gpu=rtx-9999"], "closest"), (["noequals"], "dotted.key=value"),
    (["display_reserve_bytes=5 parsecs"], "unit")])
def test_bad_scenarios(tmp_path, sets, match):
    with pytest.raises(InputError, match=match):
        load_scenario(write(tmp_path, BASE), sets)


def test_apply_overrides_does_not_mutate():
    raw = {"engine": "vllm"}
    out = apply_overrides(raw, ["engine.block_tokens=32"])
    assert raw == {"engine": "vllm"} and out["engine"] == {"preset": "vllm", "block_tokens": 32}


def test_apply_overrides_indexes_lists_the_scenario_has():
    raw = {"policies": [{"kind": "kivi", "bits": 2},
                        {"kind": "sliding_window", "window_tokens": 1024}]}
    out = apply_overrides(raw, ["policies.1.window_tokens=4096", "policies.0={kind: kivi}"])
    assert out["policies"] == [{"kind": "kivi"},
                               {"kind": "sliding_window", "window_tokens": 4096}]
    assert raw["policies"][1]["window_tokens"] == 1024


@pytest.mark.parametrize("raw, item, message", [
    ({"policies": [{"kind": "kivi"}]}, "policies.1.bits=4",
     "--set: 'policies.1.bits' — '1' must be an item number of the list there (0..0); "
     "set the whole list to add items"),
    ({"policies": []}, "policies.0.bits=4",
     "--set: 'policies.0.bits' — '0' must be an item number of the list there (none: the "
     "list is empty); set the whole list to add items"),
    ({"policies": [{"kind": "kivi"}]}, "policies.x.bits=4",
     "--set: 'policies.x.bits' — 'x' must be an item number of the list there (0..0); "
     "set the whole list to add items"),
    ({}, "policies.0.bits=4",
     "--set: 'policies.0.bits' — 'policies' has no list in this scenario to index; set the "
     "whole list (policies=[...])"),
    ({}, "policies.bits=4",
     "--set: 'policies.bits' — 'policies' is a list: policies.N.KEY sets a key of its item "
     "N, policies=[...] the whole list"),
    ({"policies": [4]}, "policies.0.bits=4",
     "--set: 'policies.0.bits' — '0' is not a mapping or list in this scenario"),
])
def test_apply_overrides_refuses_what_the_list_lacks(raw, item, message):
    with pytest.raises(InputError) as exc:
        apply_overrides(raw, [item])
    assert str(exc.value) == message
