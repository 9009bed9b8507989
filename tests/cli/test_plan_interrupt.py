"""Ctrl-C or SIGTERM on a running ``kvsim plan`` (local workers) ends in one line —
``interrupted`` (exit code 130) or ``terminated`` (143) — with no traceback, no worker's
KeyboardInterrupt and no "leaked semaphore" warning (as ``kvsim sweep`` does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# NOTE: as a terminal does: SIGINT raises KeyboardInterrupt (a child of a non-interactive
# shell would inherit SIGINT ignored)
_WITH_CTRL_C = ("import runpy, signal, sys; signal.signal(signal.SIGINT, "
                "signal.default_int_handler); sys.argv[0] = 'kvsim'; "
                "runpy.run_module('kvsim', run_name='__main__')")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_plan_says_so_in_one_line(tmp_path, sig):
    log = tmp_path / "runs.log"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'plan'}",
           "KVSIM_TEST_SLEEP_S": "1", "KVSIM_TEST_RUN_LOG": str(log)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _WITH_CTRL_C, "plan", "quickstart", "--contexts", "8192",
         "--parallel", "1,2,3,4", "-n", "4", "-j", "2", "--runner",
         "plan_fake_runners:slow_run", "--no-progress", "--no-report", "-o",
         str(tmp_path / "out")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (log.exists() and len(log.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, "no run started"
            time.sleep(0.05)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C reaches the workers too
        else:
            proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    what, code = ("interrupted", 130) if sig == signal.SIGINT else ("terminated", 143)
    assert proc.returncode == code, stderr
    lines = [ln for ln in stderr.splitlines() if not ln.startswith("note: ")]
    assert lines == [what], stderr
