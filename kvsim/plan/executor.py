"""Where planning work runs: in-process, a local process pool, or a Dask cluster.

Sweeps and replications are embarrassingly parallel: many independent scenario
runs.  Every backend exposes one operation, :meth:`Executor.imap_unordered`,
yielding ``(index, result)`` as each task finishes, so callers can store results
and advance a progress bar the moment they exist (a killed sweep keeps them).

NOTE: task functions must be importable top-level callables (they are pickled by
reference to worker processes); results travel back to the calling process, which
is the only writer of any output — workers never touch the result store, so a
cluster without a shared filesystem works too.

NOTE (killed parents): local workers are *spawned* (a fresh interpreter, not a fork),
so they inherit none of the parent's open files — above all not the result store's
lock file (Python opens files close-on-exec), which a forked worker would hold
after its parent was killed, blocking every rerun.  Each worker also exits within
:data:`PARENT_POLL_S` of its parent's death (SIGKILL, SIGTERM) instead of finishing
a task nobody will collect.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from kvsim.errors import InputError

DASK_CONNECT_TIMEOUT_S = 5.0
MAX_DASK_TIMEOUT_S = 3600.0
PARENT_POLL_S = 0.5
MAX_JOBS = 1024  # local worker processes; a larger sweep wants a Dask cluster (--dask)
HANDSHAKE_GRACE_S = 0.5
"""How long past ``--dask-timeout`` a connected peer may take to answer the handshake."""


class Executor(Protocol):
    def imap_unordered(self, fn: Callable[[Any], Any],
                       items: Sequence[Any]) -> Iterator[tuple[int, Any]]: ...

    def close(self) -> None: ...


class InlineExecutor:
    """Runs tasks one after the other in this process (``--jobs 1``)."""

    def imap_unordered(self, fn: Callable[[Any], Any],
                       items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        for i, item in enumerate(items):
            yield i, fn(item)

    def close(self) -> None:
        return None


def _worker_init(parent_pid: int) -> None:
    """Worker initializer: Ctrl-C is the parent's to handle (it stops the workers), and a
    daemon thread ends this worker once its parent is gone (the worker is then
    re-parented, so ``getppid`` changes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="kvsim-parent-watch", daemon=True).start()


@contextlib.contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """SIGINT blocked in this thread while it spawns workers.

    NOTE: a spawned worker inherits the block, so a Ctrl-C at the terminal (sent to the
    whole process group) never interrupts a worker half-way through its start-up imports
    (before :func:`_worker_init` runs); a Ctrl-C meanwhile reaches this process as soon as
    the block ends.  Where there is no ``pthread_sigmask`` (Windows) only
    :func:`_worker_init`'s SIG_IGN applies.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class LocalExecutor:
    """A ``concurrent.futures`` pool of ``jobs`` spawned worker processes (module NOTE).

    NOTE: when the caller stops collecting before every task is done (Ctrl-C, SIGTERM
    turned into an exception, an error) the workers are terminated at once: nobody
    would collect what they compute, and the pool's shutdown would wait for it.
    NOTE: a result is held only until the caller takes the next one (a sweep of 1,000
    household-weeks stays ~200 MB, benchmarks/sweep_memory.py).
    """

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._pool: cf.ProcessPoolExecutor | None = None
        self._workers: list[multiprocessing.process.BaseProcess] = []

    def imap_unordered(self, fn: Callable[[Any], Any],
                       items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        before = {p.pid for p in multiprocessing.active_children()}
        with _ctrl_c_deferred():  # NOTE: workers are spawned on submit
            if self._pool is None:
                self._pool = cf.ProcessPoolExecutor(
                    max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_worker_init, initargs=(os.getpid(),))
            futures = {self._pool.submit(fn, item): i for i, item in enumerate(items)}
        self._workers += [p for p in multiprocessing.active_children() if p.pid not in before]
        finished = False
        try:
            for fut in cf.as_completed(futures):
                # NOTE: dropped once collected: a finished future holds its result (a
                # sweep point's whole Results, ~1 MB a household-week) until released
                i, out = futures.pop(fut), fut.result()
                del fut
                yield i, out
                del out
            finished = True
        finally:
            if not finished:
                self._stop_workers()

    def _stop_workers(self) -> None:
        """Terminate the workers, then shut the (now broken) pool down.

        NOTE: the futures are left to the pool, which fails every unfinished one when it
        sees its workers gone; cancelling them here as well races with that (the pool
        then raises InvalidStateError in its own thread, a traceback on stderr).
        """
        for p in self._workers:
            p.terminate()
        for p in self._workers:
            p.join()
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._workers = []


class DaskExecutor:
    """Tasks on an existing Dask cluster (``distributed.Client(address)``)."""

    def __init__(self, address: str, timeout_s: float = DASK_CONNECT_TIMEOUT_S) -> None:
        if not 0 < timeout_s <= MAX_DASK_TIMEOUT_S:  # NaN fails too
            raise InputError("--dask-timeout", timeout_s,
                             f"seconds in (0, {MAX_DASK_TIMEOUT_S:g}]")
        try:
            from distributed import Client
        except ImportError:
            raise InputError("--dask", address,
                             "needs the 'dask' extra: pip install '.[dask]' in the kvsim "
                             "checkout") from None
        _check_address(address)
        try:
            asyncio.run(_handshake(address, timeout_s))
            self.client = Client(address, timeout=f"{timeout_s}s", set_as_default=False)
        except _SilentPeer:
            raise InputError("--dask", address, "accepts connections but did not answer "
                             f"the Dask handshake within {timeout_s:g} s; is it a Dask "
                             "scheduler?") from None
        except (OSError, TimeoutError, ValueError, TypeError) as exc:
            raise InputError("--dask", address, "no Dask scheduler reachable there within "
                             f"{timeout_s:g} s ({type(exc).__name__})") from None

    def imap_unordered(self, fn: Callable[[Any], Any],
                       items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        from distributed import as_completed

        # pure=False: identical scenarios are still separate tasks (we deduplicate
        # ourselves, by scenario hash, before submitting).
        futures = self.client.map(fn, list(items), pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for fut in as_completed(futures, loop=self.client.loop):
                yield index[fut.key], fut.result()
        finally:
            self.client.cancel(futures)

    def close(self) -> None:
        self.client.close()


class _SilentPeer(Exception):
    """The address accepted a connection but never spoke the Dask protocol."""


async def _handshake(address: str, timeout_s: float) -> None:
    """Connect and exchange Dask's handshake, the whole of it within ``timeout_s``.

    NOTE: ``distributed.Client`` bounds the TCP connect by its timeout but then waits for
    the peer's handshake without one, so a port that accepts and stays silent would hang
    it forever; this probe runs first and the Client only talks to a peer that answered.
    """
    from distributed.comm import connect

    try:  # NOTE: connect gives up with an OSError by timeout_s when nothing accepts
        comm = await asyncio.wait_for(connect(address, timeout=timeout_s),
                                      timeout_s + HANDSHAKE_GRACE_S)
    except TimeoutError:
        raise _SilentPeer() from None
    await comm.close()


DASK_EXAMPLE = "e.g. tcp://10.0.0.5:8786 or 10.0.0.5:8786"


def _check_address(address: str) -> None:
    """Refuse an address Dask cannot connect to before a Client exists (a half-built
    Client waits out its timeout, then prints a traceback when garbage-collected)."""
    from distributed.comm import registry
    from distributed.comm.addressing import parse_address, parse_host_port

    if not address.strip():
        raise InputError("--dask", address, f"empty; give the scheduler's address ("
                         f"{DASK_EXAMPLE}), or leave --dask out to run locally")
    schemes = sorted(s for s in registry.backends if s != "inproc")  # inproc: one process
    try:
        scheme, location = parse_address(address)
    except (ValueError, TypeError) as exc:
        raise InputError("--dask", address, f"not a Dask scheduler address ({exc}); "
                         f"{DASK_EXAMPLE}") from None
    if scheme not in schemes:
        raise InputError("--dask", address, f"not a Dask scheduler address: scheme "
                         f"'{scheme}://' is not one Dask connects over; one of " + ", ".join(f"{s}://" for s in schemes)
                         + " followed by HOST:PORT, or HOST:PORT alone (tcp)")
    try:
        host, port = parse_host_port(location)
    except (ValueError, TypeError) as exc:
        raise InputError("--dask", address, f"not a Dask scheduler address ({exc}); "
                         f"{DASK_EXAMPLE}") from None
    if not host or not 0 < int(port) < 65536:
        why = "no host" if not host else f"port {port} is not in 1-65535"
        raise InputError("--dask", address, f"not a Dask scheduler address ({why}); "
                         f"{DASK_EXAMPLE}")


def make_executor(jobs: int | None = None, dask: str | None = None,
                  dask_timeout_s: float = DASK_CONNECT_TIMEOUT_S) -> Executor:
    """``dask`` address → Dask; ``jobs == 1`` → inline; else a local process pool."""
    if dask is not None:  # NOTE: "" is refused (_check_address), not a local run
        return DaskExecutor(dask, dask_timeout_s)
    n = jobs if jobs is not None else min(max(1, os.cpu_count() or 1), MAX_JOBS)
    if not 1 <= n <= MAX_JOBS:
        raise InputError("--jobs", n, f"between 1 and {MAX_JOBS} worker processes")
    return InlineExecutor() if n == 1 else LocalExecutor(n)
