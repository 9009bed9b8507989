"""The store key reads every file a scenario names: one it cannot read is a one-line
InputError naming the field (audit 3, defect 2: a raw FileNotFoundError)."""

from __future__ import annotations

import pytest

from kvsim.errors import InputError
from kvsim.plan.store import results_key
from kvsim.scenario import resolve_scenario, scenario_hash


@pytest.mark.parametrize("name,reason", [("nosuch.json", "No such file or directory"),
                                         ("folder", "Is a directory")])
def test_an_unreadable_calibration_file(tmp_path, name, reason):
    (tmp_path / "folder").mkdir()
    path = str(tmp_path / name)
    scen = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b",
                             "workload": {"preset": "family-2"},
                             "latency": {"kind": "calibrated", "path": path}})
    with pytest.raises(InputError) as exc:
        results_key(scenario_hash(scen), scen, {})
    assert str(exc.value) == f"latency.path: '{path}' — cannot read ({reason})"


def test_each_file_is_read_once(tmp_path):
    cal = tmp_path / "c.json"
    cal.write_text("{}")
    scen = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b",
                             "workload": {"preset": "family-2"},
                             "latency": {"kind": "calibrated", "path": str(cal)}})
    digests: dict[str, str] = {}
    key = results_key(scenario_hash(scen), scen, digests)
    # sha256 of b"{}"
    assert digests == {str(cal): "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"}
    cal.unlink()  # served from the cache now
    assert results_key(scenario_hash(scen), scen, digests) == key
