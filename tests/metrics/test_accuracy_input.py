"""The recall proxy's multipliers (scenario key ``accuracy``) are checked like every kvsim
input model: no true/false for a number, no .inf / .nan, no unknown key — one line
naming ``accuracy.<class>.<field>``, its value and what is allowed, exit code 2."""

import pytest
from pydantic import ValidationError

from kvsim.metrics.accuracy import AccuracyConfig, ContentMultipliers
from kvsim.scenario import load_scenario

BASE = ["simulate", "quickstart", "--set", "workload.max_sessions=1"]


@pytest.mark.parametrize("override, line", [
    ("accuracy.exact.lost=true", "accuracy.exact.lost: True — a number, not true/false"),
    ("accuracy.gist.degraded_2bit=.inf",
     "accuracy.gist.degraded_2bit: inf — Input should be a finite number"),
    ("accuracy.p_hit=.nan", "accuracy.p_hit: nan — Input should be a finite number"),
    ("accuracy.p_hit=false", "accuracy.p_hit: False — a number, not true/false"),
    ("accuracy.exact.lots=0.1", "accuracy.exact.lots: 0.1 — not a key here; allowed: "
     "degraded_4bit, degraded_3bit, degraded_2bit, lost, lost_deep, collapse"),
    ("accuracy.exact.collapse=1.5",
     "accuracy.exact.collapse: 1.5 — Input should be less than or equal to 1"),
])
def test_bad_accuracy_value_through_the_cli(tmp_path, kvsim_cli, override, line) -> None:
    out = tmp_path / "out"
    rc, err, _ = kvsim_cli(*BASE, "--set", override, "-o", out)
    assert (rc, err) == (2, f"error: {line}")
    assert not out.exists()


def test_bad_accuracy_in_a_scenario_yaml(tmp_path, kvsim_cli) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("gpu: rtx-4060-ti-16gb\nmodel: llama-3.1-8b\nengine: llama.cpp\n"
                 "workload: {preset: family-4, max_sessions: 1}\n"
                 "accuracy:\n  gist:\n    lost_deep: .NaN\n")
    rc, err, _ = kvsim_cli("simulate", p, "-o", tmp_path / "out")
    assert (rc, err) == (2, "error: accuracy.gist.lost_deep: nan — Input should be a finite number")


def test_good_accuracy_overrides_load_and_keep_the_other_defaults() -> None:
    acc = load_scenario("quickstart", ["accuracy.exact.lost=0", "accuracy.p_hit=1"]).accuracy
    assert (acc.exact.lost, acc.p_hit) == (0.0, 1.0)
    assert acc.gist == AccuracyConfig().gist and acc.exact.collapse == 0.05


@pytest.mark.parametrize("name", sorted(ContentMultipliers.model_fields))
def test_every_multiplier_refuses_a_bool_and_inf(name) -> None:
    with pytest.raises(ValidationError, match="a number, not true/false"):
        ContentMultipliers.model_validate({name: True})
    with pytest.raises(ValidationError, match="finite"):
        ContentMultipliers.model_validate({name: float("inf")})
