"""``--set latency.KEY=…`` merges into the scenario's latency section, keeping its kind,
as ``--set engine.KEY=…`` merges into its engine; ``latency.kind`` still switches kinds."""

from __future__ import annotations

import json

import pytest

from kvsim.errors import InputError
from kvsim.latency.config import CalibratedConfig, ConstantConfig, RooflineConfig
from kvsim.scenario import load_scenario


def test_one_roofline_key_on_a_scenario_without_a_latency_section():
    # quickstart names no latency: Scenario.latency defaults to roofline (overhead 4 ms)
    assert load_scenario("quickstart").latency == RooflineConfig()
    lat = load_scenario("quickstart", ["latency.step_overhead_s=0.01"]).latency
    assert lat == RooflineConfig(step_overhead_s=0.01)
    assert (lat.kind, lat.step_overhead_s, lat.kv_dequant_factor) == ("roofline", 0.01, 0.25)


@pytest.mark.parametrize("sets,expected", [
    (["latency.kind=constant"], ConstantConfig(kind="constant")),
    (["latency.kind=constant", "latency.step_s=0.03"],
     ConstantConfig(kind="constant", step_s=0.03)),
    (["latency.step_s=0.03", "latency.kind=constant"],
     ConstantConfig(kind="constant", step_s=0.03)),
    (["latency={kind: constant, step_s: 0.05}"], ConstantConfig(kind="constant", step_s=0.05)),
    # docs/calibration.md
    (["latency.kind=calibrated", "latency.path=calibration/x.json"],
     CalibratedConfig(kind="calibrated", path="calibration/x.json")),
])
def test_latency_kind_still_switches(sets, expected):
    assert load_scenario("quickstart", sets).latency == expected


def test_a_key_merges_into_the_section_the_file_has(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("gpu: rtx-4090\nmodel: llama-3.1-8b\nworkload: family-4\n"
                 "latency: {kind: constant, step_s: 0.05, decode_token_s: 0.001}\n",
                 encoding="utf-8")
    lat = load_scenario(p, ["latency.prefill_token_s=0.0001"]).latency
    assert lat == ConstantConfig(kind="constant", step_s=0.05, decode_token_s=0.001,
                                  prefill_token_s=0.0001)


def test_a_key_the_kind_lacks_is_still_an_error():
    with pytest.raises(InputError) as exc:
        load_scenario("quickstart", ["latency.step_s=0.03"])  # constant's key, not roofline's
    assert exc.value.one_line() == (
        "latency.roofline.step_s: 0.03 — not a key here; allowed: kind, backend, rates, "
        "constants, step_overhead_s, kv_dequant_factor, speed_band, jitter_cv, jitter_prompt_cv, "
        "jitter_run_cv, arrival_delay_s, arrival_jitter_s, jitter_seed")


def test_simulate_with_one_latency_key(kvsim_cli, tmp_path):
    out = tmp_path / "o"
    code, err, _ = kvsim_cli("simulate", "quickstart", "--set", "latency.step_overhead_s=0.01",
                             "--set", "workload.days=0.02", "--no-report", "-o", out)
    assert (code, err) == (0, "")
    saved = json.loads((out / "scenario.json").read_text(encoding="utf-8"))
    assert saved["scenario"]["latency"] == {"kind": "roofline", "step_overhead_s": 0.01,
                                            "kv_dequant_factor": 0.25, "backend": "auto",
                                            "rates": "backend", "constants": None}
