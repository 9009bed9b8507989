"""Fuzz: scenario YAML documents and ``--set KEY=VALUE`` overrides through ``kvsim simulate``.

Documents start from a tiny quickstart (one household session) and get one to three
mutations at real keys (tests/fuzz/scenario_keys.py: the fields of the pydantic models)
and policy lists, with good, edge and wrong values.
Each run must exit 0 or print one ``error:`` line and exit 2 (tests/fuzz/conftest.py).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvsim.policies import REGISTRY
from tests.fuzz.helpers import FUZZ
from tests.fuzz.scenario_keys import BASE, EDGE, KEYS, value_for

POLICY_FIELDS = {kind: list(cls.model_fields) for kind, cls in REGISTRY.items()}


def policy() -> st.SearchStrategy[dict[str, Any]]:
    """One policy mapping: a real kind (or none, or a wrong one) with some of its keys."""
    def build(kind: str) -> st.SearchStrategy[dict[str, Any]]:
        keys = [k for k in POLICY_FIELDS.get(kind, ["window_tokens"]) if k != "kind"]
        fields = st.dictionaries(st.sampled_from(keys + ["no_such_key"]), st.one_of(
            st.sampled_from([16, 256, 4096, "q8_0", "session", "offload", "lmcache"]),
            st.sampled_from(EDGE)), max_size=3)
        return fields.map(lambda f: {"kind": kind, **f})
    kinds = st.sampled_from(sorted(POLICY_FIELDS) + ["h2o"])
    return kinds.flatmap(build) | st.sampled_from([{}, {"window_tokens": 64}, "kivi", None])


def set_path(doc: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted ``key`` in ``doc``, making (or replacing) mappings on the way."""
    *parents, last = key.split(".")
    node = doc
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[last] = value


@st.composite
def scenario_doc(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(BASE))
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["set", "set", "set", "drop", "policies", "section"]))
        key = draw(st.sampled_from(sorted(KEYS)))
        if what == "set":
            set_path(doc, key, draw(value_for(key)))
        elif what == "drop":
            doc.pop(key.split(".")[0], None)
        elif what == "policies":
            doc["policies"] = draw(st.lists(policy(), max_size=2))
        else:  # a whole section replaced by a wrong shape
            doc[key.split(".")[0]] = draw(st.sampled_from(EDGE))
    ws = doc.get("workload")
    if isinstance(ws, dict) and ws.get("max_sessions") in (None, 2**63):
        ws["max_sessions"] = 1  # NOTE: dropped by a section rewrite: keep the run tiny
    return doc


def simulate_argv(scenario: str, out: Path, sets: list[str] = ()) -> list[str]:
    argv = ["simulate", scenario, "-o", str(out), "--no-report"]
    for s in sets:
        argv += ["--set", s]
    return argv


@settings(FUZZ, max_examples=150)
@given(doc=scenario_doc())
@example(doc={**BASE, "accuracy": "\r"})  # found: a carriage return split the error line
@example(doc={**BASE, "model": 0})  # found: AttributeError in the engine's context rule
@example(doc={**BASE, "latency": {"kind": "constant", "step_s": math.inf}})
@example(doc={**BASE, "policies": [{"kind": "sliding_window", "window_tokens": 2**63}]})
def test_scenario_documents(clean_exit, tmp_path, doc):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = Path(d) / "scenario.yaml"
        path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
        clean_exit(simulate_argv(str(path), Path(d) / "out"))


def _set_item() -> st.SearchStrategy[str]:
    real = st.sampled_from(sorted(KEYS)).flatmap(
        lambda k: value_for(k).map(lambda v: f"{k}={_yaml_text(v)}"))
    index = st.sampled_from(["policies.0.window_tokens=64", "policies.3=1", "engine.0=1",
                             "policies=[{kind: kivi}]", ("policies=[{kind: sliding_window, "
                             "window_tokens: 512}]"), "engine=vllm", "workload=family-4"])
    junk = st.text(max_size=20)
    dotted = st.lists(st.sampled_from(["engine", "workload", "sim", "x", "0", "", "policies"]),
                      min_size=1, max_size=4).map(".".join).map(lambda k: f"{k}=1")
    return st.one_of(real, real, index, junk, dotted)


def _yaml_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    return yaml.safe_dump(v, default_flow_style=True, allow_unicode=True).strip() \
        .removesuffix("...").strip()


@settings(FUZZ, max_examples=150)
@given(sets=st.lists(_set_item(), min_size=1, max_size=3))
@example(sets=["nonexistent.key=1"])
@example(sets=["engine.parallel=1e9"])
@example(sets=["engine.supported_cache_types=[]"])  # found: "allowed: " with nothing after
def test_set_overrides(clean_exit, tmp_path, sets):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = Path(d) / "scenario.yaml"
        path.write_text(yaml.safe_dump(BASE), encoding="utf-8")
        clean_exit(simulate_argv(str(path), Path(d) / "out", sets))


