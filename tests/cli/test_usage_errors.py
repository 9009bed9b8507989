"""Command-line usage mistakes get one line on stderr and exit code 2, like every
other user error (not click's multi-line usage block, never a traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("argv, expected", [
    (["fit", "--gpu", "rtx-4090", "--bogus", "1"], "No such option '--bogus'"),
    (["simulate"], "Missing argument 'SCENARIO'"),
    (["nosuch"], "No such command 'nosuch'"),
    (["simulate", "quickstart", "-o", "x", "--fidelity", "turbo"], "'turbo' is not one of"),
])
def test_usage_errors_are_one_line(argv: list[str], expected: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "kvsim", *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and expected in lines[0]
    assert "--help" in lines[0] and "Traceback" not in proc.stderr
