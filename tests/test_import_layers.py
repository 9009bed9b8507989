"""The package's layer order, checked on the source tree (module- and function-level imports).

A package may import itself and the layers listed before it.  ``KNOWN_BACK_EDGES`` lists
the imports that still point upward, each by the module that makes it: the test fails when
a new one appears *and* when one is removed without updating the list, so it only shrinks.
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "kvsim"

# lowest first; "kvsim" is the package root (it holds only __version__)
LAYERS = ("kvsim", "errors", "config", "model", "engines", "latency", "core", "policies",
          "workload", "metrics", "calibrate", "validate", "api", "plan", "report", "cli",
          "__main__")

# (importing module, imported layer) pairs that point upward today
KNOWN_BACK_EDGES = {
    ("config/model_names.py", "model"),       # a model name carries its weight format
    ("config/scenario.py", "engines"),        # the Scenario holds the engine config
    ("config/scenario.py", "metrics"),        # the Scenario holds the accuracy config
    ("config/scenario.py", "policies"),       # ... and the policy configs
    ("latency/calibrated.py", "calibrate"),   # a calibrated model reads the artifact
    ("latency/factory.py", "calibrate"),
    ("core/engine.py", "metrics"),            # the engine records into a Recorder
    ("core/engine.py", "workload"),           # sessions are built from trace rows
    ("core/sessions.py", "metrics"),
    ("core/sessions.py", "workload"),
    ("core/fastforward.py", "metrics"),
    ("core/stretch_memory.py", "metrics"),
    ("policies/recall.py", "metrics"),        # recall outcomes are accuracy records
    ("policies/runtime.py", "metrics"),
    ("workload/generator.py", "metrics"),
    ("calibrate/bench.py", "validate"),       # bench reads llama-bench output via validate
}


def _layer(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "kvsim"


def _edges() -> set[tuple[str, str]]:
    found = set()
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        own = rel.split("/")[0].removesuffix(".py")
        own = "kvsim" if own == "__init__" else own
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                     and node.level == 0 else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.split(".")[0] == "kvsim" and _layer(name) != own:
                    found.add((rel, own, _layer(name)))
    return found


def test_every_package_has_a_layer() -> None:
    tops = {p.name.removesuffix(".py") for p in PKG.iterdir()
            if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert tops - {"__init__"} <= set(LAYERS)


def test_imports_point_down_except_the_known_back_edges() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = {(rel, dst) for rel, src, dst in _edges() if rank[dst] > rank[src]}
    assert upward == KNOWN_BACK_EDGES
