"""Ctrl-C or SIGTERM on a running ``kvsim plan`` (local workers) ends in one line —
``interrupted`` (exit code 130) or ``terminated`` (143) — with no traceback, no worker's
KeyboardInterrupt and no "leaked semaphore" warning (as ``kvsim sweep`` does)."""

from __future__ import annotations

import signal

import pytest
from interrupts import signal_after_runs


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_plan_says_so_in_one_line(tmp_path, sig):
    code, stderr = signal_after_runs(
        ["plan", "quickstart", "--contexts", "8192", "--parallel", "1,2,3,4", "-n", "4",
         "-j", "2", "--runner", "plan_fake_runners:slow_run", "--no-progress",
         "--no-report", "-o", str(tmp_path / "out")], tmp_path / "runs.log", sig)
    what, want = ("interrupted", 130) if sig == signal.SIGINT else ("terminated", 143)
    assert code == want, stderr
    lines = [ln for ln in stderr.splitlines() if not ln.startswith("note: ")]
    assert lines == [what], stderr
