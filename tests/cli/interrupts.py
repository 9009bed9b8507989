"""Run ``kvsim ARGS`` as a terminal would and signal it once runs have started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# NOTE: as a terminal does: SIGINT raises KeyboardInterrupt (a child of a non-interactive
# shell would inherit SIGINT ignored)
_WITH_CTRL_C = ("import runpy, signal, sys; signal.signal(signal.SIGINT, "
                "signal.default_int_handler); sys.argv[0] = 'kvsim'; "
                "runpy.run_module('kvsim', run_name='__main__')")


def signal_after_runs(args: list[str], log: Path, sig: int, runs: int = 2,
                      ready: Callable[[], bool] = lambda: True) -> tuple[int, str]:
    """Start ``kvsim args`` with tests/plan's slow fake runner (1 s a run, each logged to
    ``log``), send ``sig`` once ``runs`` have started and ``ready()`` holds — SIGINT to the
    process group, as Ctrl-C at a terminal reaches the workers too; SIGTERM to the parent,
    as a service manager does — and return (exit code, stderr)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'plan'}",
           "KVSIM_TEST_SLEEP_S": "1", "KVSIM_TEST_RUN_LOG": str(log)}
    proc = subprocess.Popen([sys.executable, "-c", _WITH_CTRL_C, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (log.exists() and len(log.read_text().splitlines()) >= runs and ready()):
            assert proc.poll() is None and time.monotonic() < deadline, "no run started"
            time.sleep(0.05)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, stderr
