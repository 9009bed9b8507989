"""Local workers hold none of the parent's files (audit 3, defect 1: forked workers kept
the result store's lock after their parent was killed), and a Dask address is checked
before any Client exists (defect 7)."""

from __future__ import annotations

import gc
import os
import time
import weakref

import pytest
from executor_tasks import open_files, parent_pid, payload

from kvsim.errors import InputError
from kvsim.plan.executor import LocalExecutor, make_executor
from kvsim.plan.store import ResultStore


def test_workers_do_not_inherit_the_store_lock(tmp_path):
    ex = LocalExecutor(2)
    try:
        with ResultStore(tmp_path / "s"):
            lock = str(tmp_path / "s" / ".lock")
            assert lock in open_files(None)  # this process holds it ...
            seen = [files for _, files in ex.imap_unordered(open_files, [0, 1])]
    finally:
        ex.close()
    assert len(seen) == 2 and not any(lock in files for files in seen)  # ... no worker


def test_workers_are_children_of_the_caller():
    ex = LocalExecutor(1)
    try:
        assert [pid for _, pid in ex.imap_unordered(parent_pid, [0])] == [os.getpid()]
    finally:
        ex.close()


def test_a_collected_result_is_not_held_by_the_pool():
    """Issue 24: the parent held every finished future (a sweep point's whole Results)
    until the end; now a result lives only until the caller takes the next one."""
    ex = LocalExecutor(2)
    alive = []
    try:
        for _, out in ex.imap_unordered(payload, [1024] * 4):  # NOTE: under a pipe buffer
            alive.append(weakref.ref(out))
            del out
            gc.collect()
            held = [r() is not None for r in alive]
            assert held[:-1] == [False] * (len(alive) - 1)
    finally:
        ex.close()
    assert len(alive) == 4


@pytest.mark.parametrize("address,allowed", [
    ("foo://x", ("not a Dask scheduler address: scheme 'foo://' is not one Dask connects "
                "over; one of tcp://, tls://, ucx://, ws://, wss:// followed by HOST:PORT, "
                "or HOST:PORT alone (tcp)")),
    ("inproc://x", ("not a Dask scheduler address: scheme 'inproc://' is not one Dask "
                   "connects over; one of tcp://, tls://, ucx://, ws://, wss:// followed by "
                   "HOST:PORT, or HOST:PORT alone (tcp)")),
    ("", ("empty; give the scheduler's address (e.g. tcp://10.0.0.5:8786 or "
         "10.0.0.5:8786), or leave --dask out to run locally")),
    ("tcp://:8786", ("not a Dask scheduler address (no host); e.g. tcp://10.0.0.5:8786 or "
                    "10.0.0.5:8786")),
    ("10.0.0.5:99999", ("not a Dask scheduler address (port 99999 is not in 1-65535); e.g. "
                       "tcp://10.0.0.5:8786 or 10.0.0.5:8786")),
])
def test_a_bad_dask_address_is_refused_at_once(address, allowed):
    pytest.importorskip("distributed")
    t0 = time.monotonic()
    with pytest.raises(InputError) as exc:
        make_executor(dask=address, dask_timeout_s=30)
    assert (exc.value.field, exc.value.value, exc.value.allowed) == ("--dask", address, allowed)
    assert time.monotonic() - t0 < 2  # no connection attempt, no 30 s wait
