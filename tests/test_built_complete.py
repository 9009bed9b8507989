"""The simulator's parts are built complete, then run: outside kvsim/core no module
assigns an attribute of a scheduler or engine object (its policy, host tier, RAM cache).

NOTE: a policy acting on KV state (a slot's cells, the pool's credit) during the run is
behaviour, not construction, and is not what this checks.
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "kvsim"
BUILT = {"sched", "scheduler", "engine"}  # the names the code gives those objects


def _assignments(root: Path) -> list[str]:
    """``file:line name.attr`` of every assignment to an attribute (or a sub-attribute)
    of a name in :data:`BUILT`, outside ``root/core``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("core/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
            for t in targets:
                while isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute):
                    t = t.value
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                        and t.value.id in BUILT:
                    found.append(f"{rel}:{node.lineno} {t.value.id}.{t.attr}")
    return found


def test_no_part_is_patched_after_construction() -> None:
    assert _assignments(PKG) == []


def test_the_scan_finds_a_patch(tmp_path: Path) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "x.py").write_text(
        "def f(sched, rt):\n    sched.ram.limit_bytes = 1\n    sched.policy = rt\n")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "y.py").write_text("def g(sched):\n    sched.policy = None\n")
    assert _assignments(tmp_path) == ["policies/x.py:2 sched.ram", "policies/x.py:3 sched.policy"]
