"""Fuzz: sweep files (kvsim.plan.sweep: ``base`` plus ``factors`` or ``points``) through
``kvsim sweep --jobs 1``.

Grids stay at most 2 x 2 points of a one-session scenario.  Each run must exit 0 or print
one ``error:`` line and exit 2 (tests/fuzz/conftest.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvsim.plan.sweep import SweepSpec
from tests.fuzz.helpers import FUZZ
from tests.fuzz.scenario_keys import BASE, EDGE, KEYS, value_for

ODD_KEYS = ["", ".", "engine..parallel", "engine.0", "policies.0.window_tokens",
            "engine.cache_type_k,engine.cache_type_v", "engine.parallel,", "workload.params.x",
            "no_such_key", "gpu.memory_bytes", "model.layers"]
SPEC_KEYS = list(SweepSpec.model_fields)


def _factor_values(key: str) -> st.SearchStrategy[Any]:
    one = value_for(key) if key in KEYS else st.sampled_from(EDGE)
    pairs = st.lists(st.sampled_from([["q8_0", "q8_0"], ["f16"], "q4_0", ["q4_0", "q4_0"]]),
                     min_size=1, max_size=2)
    listed = st.lists(one, min_size=1, max_size=2)
    return pairs if "," in key else st.one_of(listed, listed, listed, st.sampled_from(EDGE))


@st.composite
def sweep_doc(draw: st.DrawFn, scenario: str) -> dict[str, Any]:
    base: Any = draw(st.sampled_from([scenario, "inline", "missing.yaml", "quickstart", 3, None])
                     if draw(st.integers(0, 3)) == 3 else st.just(scenario))
    if base == "inline":
        base = dict(BASE)
    doc: dict[str, Any] = {"name": draw(st.sampled_from(["s", "", "ünï ✓"])), "base": base}
    keys = draw(st.lists(st.sampled_from(sorted(KEYS)), min_size=1, max_size=2, unique=True))
    if draw(st.integers(0, 3)) == 3:
        keys[0] = draw(st.sampled_from(ODD_KEYS))
    if draw(st.booleans()):
        doc["factors"] = {k: draw(_factor_values(k)) for k in keys}
    else:
        doc["points"] = draw(st.lists(st.fixed_dictionaries(
            {k: value_for(k) if k in KEYS else st.sampled_from(EDGE) for k in keys}),
            min_size=1, max_size=2) | st.sampled_from(EDGE))
    if draw(st.integers(0, 7)) == 7:  # the spec's own shape broken
        doc[draw(st.sampled_from(SPEC_KEYS + ["extra"]))] = draw(st.sampled_from(EDGE))
    return doc


@settings(FUZZ, max_examples=60)
@given(data=st.data())
@example(data=None)
def test_sweep_files(clean_exit, tmp_path, data):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        folder = Path(d)
        (folder / "base.yaml").write_text(yaml.safe_dump(BASE), encoding="utf-8")
        doc = data.draw(sweep_doc("base.yaml")) if data is not None else {
            "base": "base.yaml", "factors": {"engine.parallel": [1, 2]}}
        (folder / "sweep.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True),
                                           encoding="utf-8")
        clean_exit(["sweep", str(folder / "sweep.yaml"), "-o", str(folder / "out"), "-j", "1",
                    "--no-report", "--no-progress", "--summary-only"])


def test_a_base_of_the_wrong_type_names_what_base_may_be(clean_exit, tmp_path):
    # found by the fuzzer: 'sweep.base.str: 3 — Input should be a valid string'
    (tmp_path / "sweep.yaml").write_text("base: 3\nfactors: {engine.parallel: [1]}\n")
    code, _, err = clean_exit(["sweep", str(tmp_path / "sweep.yaml"), "-o",
                               str(tmp_path / "out"), "-j", "1"])
    assert code == 2 and err.strip() == (
        "error: sweep.base: 3 — a scenario YAML path, a bundled scenario name or an inline "
        "scenario mapping")


def test_a_key_below_a_value_another_key_sets_is_refused(clean_exit, tmp_path):
    # found by the fuzzer: TypeError "'int' object does not support item assignment"
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "sweep.yaml").write_text(
        "base: base.yaml\nfactors: {latency: [1], latency.rates: [backend]}\n")
    code, _, err = clean_exit(["sweep", str(tmp_path / "sweep.yaml"), "-o",
                               str(tmp_path / "out"), "-j", "1", "--no-progress"])
    assert code == 2 and err.strip() == (
        "error: sweep key: 'latency.rates' — 'latency' is 1 in this point (another key sets "
        "it): a key below it cannot be set")


@pytest.mark.parametrize("factor", ["host_default: [0, true]", "seed: [0, 10000000000000000000000]"])
def test_factor_values_parquet_cannot_type_are_stored_as_text(clean_exit, tmp_path, factor):
    # found by the fuzzer: ArrowInvalid (mixed int/bool column), OverflowError (int > int64)
    import pandas as pd

    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "sweep.yaml").write_text(f"base: base.yaml\nfactors: {{{factor}}}\n")
    code, _, _ = clean_exit(["sweep", str(tmp_path / "sweep.yaml"), "-o", str(tmp_path / "out"),
                             "-j", "1", "--no-progress", "--no-report", "--summary-only"])
    table = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    assert code == 0 and list(table["status"]) == ["ok", "ok"]
