"""Import-direction rules from DESIGN.md §2, checked on the source tree."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "kvsim"
FORBIDDEN_IN_CORE = {"pandas", "plotly", "click", "torch", "rich", "httpx", "dask", "distributed"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", ["core", "policies", "model", "config", "latency"])
def test_inner_layers_import_no_frontends(layer: str) -> None:
    bad = {}
    for path in (PKG / layer).rglob("*.py"):
        hit = _imports(path) & FORBIDDEN_IN_CORE
        if hit:
            bad[str(path.relative_to(PKG))] = sorted(hit)
    assert bad == {}


def test_only_engine_and_link_touch_simpy() -> None:
    users = sorted(
        str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if "simpy" in _imports(p))
    allowed = {"core/engine.py", "core/link.py"}
    assert set(users) <= allowed | {u for u in users if u.startswith("core/engine")}


def test_modules_stay_small() -> None:
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}


def test_simulating_loads_no_frontend_or_file_format_library() -> None:
    # what the inner layers import at run time, transitively (the rule above reads one
    # file at a time): the engine, its schedulers, policies and latency models
    import subprocess
    import sys
    code = ("import sys, kvsim.core.engine, kvsim.core.build, kvsim.policies.build, "
            "kvsim.latency.factory, kvsim.model.budget; "
            "print(sorted(m for m in ('pandas', 'plotly', 'click', 'torch', 'pyarrow', "
            "'rich', 'httpx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
