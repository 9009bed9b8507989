"""Top-level task bodies for tests/plan/test_executor_workers.py (workers import them)."""

from __future__ import annotations

import os


def open_files(_: object) -> list[str]:
    """What this worker process has open (its /proc/self/fd targets)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def parent_pid(_: object) -> int:
    return os.getppid()


class Payload:
    """A task result the parent can watch (weakref) for being freed."""

    def __init__(self, nbytes: int) -> None:
        self.data = bytes(nbytes)


def payload(nbytes: int) -> Payload:
    return Payload(nbytes)
