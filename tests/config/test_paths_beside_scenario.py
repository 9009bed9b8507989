"""A scenario file's relative paths — its workload trace and its calibrated latency's
artifact — are read beside the file when they are there, else from the current folder
(a ``--set`` on a bundled scenario); both keys follow the same rule."""

from pathlib import Path

import yaml

from kvsim.scenario import load_scenario


def _write(folder: Path) -> Path:
    (folder / "cal").mkdir(parents=True)
    (folder / "cal" / "c.json").write_text("{}")
    doc = {"gpu": "rtx-4090", "model": "llama-3.2-1b", "workload": "family-4",
           "latency": {"kind": "calibrated", "path": "cal/c.json"}}
    path = folder / "scen" / "s.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({**doc, "latency": {**doc["latency"],
                                                        "path": "../cal/c.json"}}))
    return path


def test_latency_path_is_read_beside_the_scenario_file(tmp_path, monkeypatch):
    path = _write(tmp_path / "proj")
    monkeypatch.chdir(tmp_path)  # ../cal/c.json does not exist from here
    s = load_scenario(path)
    assert Path(s.latency.path) == path.parent / "../cal/c.json"


def test_a_path_not_beside_the_file_stays_as_given(tmp_path, monkeypatch):
    path = _write(tmp_path / "proj")
    monkeypatch.chdir(tmp_path)
    s = load_scenario(path, ["latency.path=elsewhere.json"])
    assert s.latency.path == "elsewhere.json"


def test_a_model_profile_yaml_is_read_beside_the_scenario_file(tmp_path, monkeypatch):
    from kvsim.config.catalog import load_raw

    folder = tmp_path / "proj"
    folder.mkdir()
    own = load_raw("models", "llama-3.2-1b")
    (folder / "my-model.yaml").write_text(yaml.safe_dump({**own, "name": "my-model"}))
    (folder / "s.yaml").write_text(yaml.safe_dump(
        {"gpu": "rtx-4090", "model": "my-model.yaml", "workload": "family-4"}))
    monkeypatch.chdir(tmp_path)  # my-model.yaml is not in the current folder
    s = load_scenario(folder / "s.yaml")
    assert s.model.name == "my-model"
    assert s.model.num_layers == own["num_layers"]
