"""Where planning work runs: in-process, a local process pool, or a Dask cluster.

Sweeps and replications are embarrassingly parallel: many independent scenario
runs.  Every backend exposes one operation, :meth:`Executor.imap_unordered`,
yielding ``(index, result)`` as each task finishes, so callers can store results
and advance a progress bar the moment they exist (a killed sweep keeps them).

NOTE: task functions must be importable top-level callables (they are pickled by
reference to worker processes); results travel back to the calling process, which
is the only writer of any output — workers never touch the result store, so a
cluster without a shared filesystem works too.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from kvsim.errors import InputError

DASK_CONNECT_TIMEOUT_S = 5.0
MAX_DASK_TIMEOUT_S = 3600.0


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


class LocalExecutor:
    """A ``concurrent.futures`` process pool of ``jobs`` workers."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._pool: cf.ProcessPoolExecutor | None = None

    def imap_unordered(self, fn: Callable[[Any], Any],
                       items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(max_workers=self.jobs)
        futures = {self._pool.submit(fn, item): i for i, item in enumerate(items)}
        try:
            for fut in cf.as_completed(futures):
                yield futures[fut], fut.result()
        finally:
            for fut in futures:
                fut.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


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
            self.client = Client(address, timeout=f"{timeout_s}s", set_as_default=False)
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


def _check_address(address: str) -> None:
    """Refuse an address Dask cannot parse before a Client exists (a half-built Client
    prints a traceback when it is garbage-collected)."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        if scheme in ("tcp", "tls", "ws", "wss", "ucx"):
            parse_host_port(location)
    except (ValueError, TypeError) as exc:
        raise InputError("--dask", address, f"not a Dask scheduler address ({exc}); e.g. "
                         "tcp://10.0.0.5:8786") from None


def make_executor(jobs: int | None = None, dask: str | None = None,
                  dask_timeout_s: float = DASK_CONNECT_TIMEOUT_S) -> Executor:
    """``dask`` address → Dask; ``jobs == 1`` → inline; else a local process pool."""
    if dask:
        return DaskExecutor(dask, dask_timeout_s)
    n = jobs if jobs is not None else max(1, (os.cpu_count() or 1))
    if n < 1:
        raise InputError("--jobs", n, "at least 1")
    return InlineExecutor() if n == 1 else LocalExecutor(n)
