"""Import-direction rules from docs/design/DESIGN.md §2, checked on the source tree."""

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


SIMPY_USERS = {"core/engine.py", "core/simclock.py", "core/link.py"}
SIMPY_INTERNALS_OWNER = "core/simclock.py"  # NOTE: the one module that touches SimPy's privates


def test_only_the_listed_modules_import_simpy() -> None:
    users = {str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if "simpy" in _imports(p)}
    assert users <= SIMPY_USERS


def _simpy_private_names() -> set[str]:
    """The private attributes SimPy's environment and events carry (``_queue``, ``_eid``,
    ``_now``, ``_ok``, ``_value`` ...), read off live objects of the installed SimPy."""
    import simpy

    env = simpy.Environment()

    def proc():
        yield env.timeout(0)

    objs = (env, env.event(), env.timeout(1), env.process(proc()), env.any_of([env.event()]))
    return {k for o in objs for k in vars(o) if k.startswith("_") and not k.startswith("__")}


def test_only_simclock_touches_simpy_internals() -> None:
    # another object's SimPy-private attribute (``env._queue``, ``ev._ok``); a class's
    # own state (``self._now``) is not SimPy's
    private = _simpy_private_names()
    bad = []
    for path in PKG.rglob("*.py"):
        rel = str(path.relative_to(PKG))
        if rel == SIMPY_INTERNALS_OWNER:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr in private
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                bad.append(f"{rel}:{node.lineno} .{node.attr}")
    assert bad == []


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
            "kvsim.latency.factory, kvsim.engines.budget; "
            "print(sorted(m for m in ('pandas', 'plotly', 'click', 'torch', 'pyarrow', "
            "'rich', 'httpx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
