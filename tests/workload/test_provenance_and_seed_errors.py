"""Every number in a household preset says where it comes from; bad seeds/days are errors."""

from pathlib import Path

import pytest
import yaml

from kvsim.errors import InputError
from kvsim.workload.generator import generate
from kvsim.workload.preset import load_preset
from kvsim.workload.sampling import sample

PRESETS = Path(__file__).resolve().parents[2] / "workloads" / "households"


def _unsourced(node, path=""):
    """Paths of distributions, assistants, kinds, members and reference models without a
    non-empty ``source`` (walks the raw YAML, so optional schema fields cannot hide one)."""
    if isinstance(node, list):
        for i, v in enumerate(node):
            yield from _unsourced(v, f"{path}[{i}]")
        return
    if not isinstance(node, dict):
        return
    parts = path.split(".")
    needs = ("dist" in node or parts[-1] == "references"
             or (len(parts) >= 2 and parts[-2] in ("assistants", "kinds", "members")))
    if needs and not str(node.get("source", "")).strip():
        yield path
    for k, v in node.items():
        yield from _unsourced(v, f"{path}.{k}")


@pytest.mark.parametrize("name", ["family-2", "family-4", "family-6"])
def test_every_distribution_and_default_is_sourced(name):
    doc = yaml.safe_load((PRESETS / f"{name}.yaml").read_text(encoding="utf-8"))
    assert doc["sources"]
    assert list(_unsourced(doc)) == []


def test_walker_finds_an_unsourced_distribution():
    doc = {"kinds": {"voice": {"source": "x", "references": {
        "source": "y", "span_tokens": {"dist": "const", "value": 8}}}}}
    assert list(_unsourced(doc)) == [".kinds.voice.references.span_tokens"]


@pytest.mark.parametrize("days,seed,line", [
    (float("inf"), 0, "days: inf — must be a finite number > 0"),
    (1.0, -3, "seed: -3 — a non-negative integer"),
])
def test_generator_rejects_bad_days_and_seed(days, seed, line):
    with pytest.raises(InputError) as exc:
        generate(load_preset("family-2"), days, seed)
    assert exc.value.one_line() == line


def test_sample_rejects_negative_seed():
    sessions = generate(load_preset("family-2"), 1.0, 0)
    with pytest.raises(InputError) as exc:
        sample(sessions, n_sessions=1, seed=-1)
    assert exc.value.one_line() == "--seed: -1 — a non-negative integer"
