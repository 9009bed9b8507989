"""The package's layer order and its acyclic import graph, checked on the source tree.

Every import counts: module-level, function-level and ``TYPE_CHECKING`` ones, and
``importlib.import_module("kvsim....")`` with a literal name.  A package may import
itself and the layers listed before it in ``LAYERS`` (lowest first):

- ``kvsim`` (the root: only ``__version__``), ``errors``;
- ``config``, ``model``: data and geometry (units, profiles, catalogue, the workload
  section; KV bytes, weight formats, name → catalogue model);
- ``engines``: what each engine does (one module per engine);
- ``latency``: step-time models and the calibration artifacts they read;
- ``metrics``: the flat records and Results (it reads the simulator's requests, events
  and memory samples through protocols, kvsim.metrics.recorded);
- ``workload``: traces and the household generator;
- ``core``, ``policies``: the simulator and the KV policies acting on it;
- ``scenario``: one run's whole resolved input (engine, workload, latency, policies,
  accuracy), what every tool above takes;
- ``validate`` (measurements → predicted vs measured), ``calibrate`` (the harnesses,
  llama-bench fits through validate's fit);
- ``api``, ``plan``, ``report``, ``cli``, ``__main__``: the entry points.

No upward import is allowed; a second test checks that the package-level graph has no
cycle (so the order above is one the imports really follow, not just a listing).
"""

import ast
import graphlib
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "kvsim"

LAYERS = ("kvsim", "errors", "config", "model", "engines", "latency", "metrics", "workload",
          "core", "policies", "scenario", "validate", "calibrate", "api", "plan", "report",
          "cli", "__main__")

def _layer(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "kvsim"


def _imported(node: ast.AST) -> list[str]:
    """The absolute module names one AST node imports."""
    if isinstance(node, ast.ImportFrom):
        return [node.module] if node.module and node.level == 0 else []
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str) and getattr(
                node.func, "attr", getattr(node.func, "id", "")) == "import_module":
        return [node.args[0].value]
    return []


def _edges() -> set[tuple[str, str, str]]:
    """(module path under kvsim/, its layer, an imported layer) for each cross-layer import."""
    found = set()
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        own = rel.split("/")[0].removesuffix(".py")
        own = "kvsim" if own == "__init__" else own
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for name in _imported(node):
                if name.split(".")[0] == "kvsim" and _layer(name) != own:
                    found.add((rel, own, _layer(name)))
    return found


def test_every_package_has_a_layer() -> None:
    tops = {p.name.removesuffix(".py") for p in PKG.iterdir()
            if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert tops - {"__init__"} <= set(LAYERS)


def test_imports_point_down_the_layers() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = {(rel, dst) for rel, src, dst in _edges() if rank[dst] > rank[src]}
    assert upward == set()


def test_the_package_import_graph_has_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for _rel, src, dst in _edges():
        graph.setdefault(src, set()).add(dst)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle between layers: {exc.args[1]}") from None
