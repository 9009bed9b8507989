"""The source tree runs as the installed package does: ``python -m kvsim`` from a
checkout, with no kvsim installed, finds the bundled profiles and scenarios (the wheel
ships ``hardware_profiles/`` and ``workloads/`` as packages inside kvsim; a checkout has
them beside it)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# NOTE: drop the editable install's import hooks, so only the checkout on sys.path[0]
# provides kvsim — as when a user runs it from a clone with another kvsim (or none)
# installed
RUN = """
import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:] = [p for p in sys.path if "__editable__" not in p]
sys.path.insert(0, {root!r})
sys.argv = ["kvsim", *{args!r}]
import kvsim
assert kvsim.__file__.startswith({root!r}), kvsim.__file__
runpy.run_module("kvsim", run_name="__main__")
"""


def _kvsim(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN.format(root=str(ROOT), args=list(args))],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)


def test_python_m_kvsim_from_a_checkout_runs_the_bundled_scenario(tmp_path: Path) -> None:
    r = _kvsim(tmp_path, "simulate", "quickstart", "--set", "workload.max_sessions=3",
               "-o", str(tmp_path / "out"), "--no-report")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "out" / "summary.json").is_file()


def test_python_m_kvsim_from_a_checkout_reads_the_catalogue(tmp_path: Path) -> None:
    r = _kvsim(tmp_path, "fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
               "--weights", "q4_k_m", "--engine", "llama.cpp")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "GeForce RTX 4090" in r.stdout
