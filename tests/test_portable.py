"""kvsim runs where POSIX-only modules do not exist (Windows): ``simulate``, ``plan`` and
``sweep`` run end to end in a process where kvsim's own imports of ``fcntl``,
``resource``, ``pwd``, ``grp`` or ``termios`` fail, as they do there.

NOTE: only imports made by kvsim's modules are refused: psutil and filelock pick their
platform's backend themselves (on Linux that backend imports ``resource`` / ``fcntl``).
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
POSIX_ONLY = ("fcntl", "resource", "pwd", "grp", "termios")

SCRIPT = textwrap.dedent("""
    import builtins, sys
    real, refused = builtins.__import__, []

    def guarded(name, globals=None, locals=None, fromlist=(), level=0):
        caller = (globals or {{}}).get("__name__", "")
        if name.split(".")[0] in {blocked!r} and caller.split(".")[0] == "kvsim":
            refused.append(f"{{caller}} imports {{name}}")
            raise ImportError(f"no module named {{name!r}} (refused: POSIX only)")
        return real(name, globals, locals, fromlist, level)

    builtins.__import__ = guarded
    from kvsim.cli import main
    for args in {runs!r}:
        try:
            main(args)
        except SystemExit as exc:
            if exc.code not in (0, None):
                sys.exit(f"{{args[0]}} exited {{exc.code}}; refused: {{refused}}")
    print("refused:", refused)
""")


def test_simulate_plan_and_sweep_run_without_posix_modules(tmp_path: Path) -> None:
    base = {"name": "base", "gpu": "rtx-4090", "model": "llama-3.1-8b",
            "engine": {"preset": "llama.cpp", "allocator": "slots", "context_tokens": 8192,
                       "parallel": 2},
            "workload": {"preset": "family-4", "days": 0.05}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base), encoding="utf-8")
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(
        {"name": "t", "base": "base.yaml", "factors": {"engine.parallel": [1, 2]}}),
        encoding="utf-8")
    runs = [["simulate", "quickstart", "--set", "workload.max_sessions=4", "-o",
             str(tmp_path / "sim"), "--no-report"],
            ["plan", str(tmp_path / "base.yaml"), "--contexts", "8192", "--parallel", "1,2",
             "-n", "1", "-j", "1", "--no-progress", "--no-report", "-o", str(tmp_path / "plan")],
            ["sweep", str(tmp_path / "sweep.yaml"), "-o", str(tmp_path / "sweep"), "-j", "1",
             "--no-progress", "--no-report"]]
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(blocked=POSIX_ONLY, runs=runs)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "refused: []" in r.stdout
    assert json.loads((tmp_path / "sim" / "summary.json").read_text())["requests"] > 0
    assert (tmp_path / "plan" / "plan.csv").is_file()
    assert len(list((tmp_path / "sweep" / "results").iterdir())) == 2
