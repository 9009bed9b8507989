"""Engine knowledge lives in kvsim/engines/: no other module compares a value against an
engine's preset name (it asks ``engine_for(preset)`` instead)."""

import ast
from pathlib import Path

from kvsim.engines import registered_engines

PKG = Path(__file__).resolve().parents[1] / "kvsim"

# modules outside kvsim/engines/ whose comparisons with an engine's name are about
# something else, by file
ALLOWED = {
    "calibrate/replay.py": "the HTTP API dialect a real server speaks ('llama.cpp' or openai)",
    "calibrate/wire.py": "the HTTP API dialect a real server speaks ('llama.cpp' or openai)",
    "core/scheduler.py": "its own retract_order value 'sglang' (an engine trait's value)",
}


def _names_in(node: ast.expr, names: set[str]) -> set[str]:
    """Engine names among a comparison operand's string constants (a tuple, list or set
    of them too)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names_in(e, names) for e in node.elts))
    return set()


def _comparisons(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            hit = set().union(*(_names_in(x, names) for x in (node.left, *node.comparators)))
            if hit:
                found.append(f"line {node.lineno}: {sorted(hit)}")
    return found


def test_no_module_outside_engines_compares_an_engine_name() -> None:
    names = set(registered_engines())
    offenders = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith("engines/") or rel in ALLOWED:
            continue
        hits = _comparisons(path, names)
        if hits:
            offenders[rel] = hits
    assert offenders == {}


def test_the_allowed_exceptions_still_compare_a_name() -> None:
    # an exception that no longer compares any engine name is dropped from ALLOWED
    names = set(registered_engines())
    assert {rel for rel in ALLOWED if not _comparisons(PKG / rel, names)} == set()


def test_the_scan_sees_a_comparison(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('def f(cfg):\n    return cfg.preset in ("vllm", "sglang") or x == "ollama"\n')
    assert len(_comparisons(probe, set(registered_engines()))) == 2
