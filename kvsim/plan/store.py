"""A resumable result store keyed by scenario (:func:`results_key`).

A sweep of hundreds of scenarios takes a while, and machines get killed.  Each
finished scenario is stored under ``<root>/results/<key>/`` holding
``record.json`` (summary, OOM verdict, the sweep point's parameters, provenance)
and, when the runner returned them, the full Results under ``results/``.

NOTE (atomicity): an entry is built in ``<root>/.tmp/<random>/`` and moved into
place with one ``os.replace`` of the directory, so an entry either exists whole
or not at all — a SIGKILL at any instant leaves at most a stray temp directory,
which the next :meth:`ResultStore.open` removes.  "Finished" means "the entry
directory exists"; nothing else is consulted.  One sweep writes a store at a time
(an exclusive :class:`filelock.FileLock` on ``<root>/.lock``: ``flock`` on POSIX,
``msvcrt.locking`` on Windows).  The lock file is opened
close-on-exec (as Python opens every file) and the local workers are spawned, not
forked (:mod:`kvsim.plan.executor`), so only the sweep's own process ever holds it:
when that process dies, the lock goes with it.

A summary-only entry (``--summary-only``: ``record.json`` says ``summary_only``) gets
its full Results later with :meth:`ResultStore.add_results`: they are built in
``.tmp/`` and moved into the entry with one rename, so they too exist whole or not.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
from filelock import FileLock, Timeout

from kvsim import __version__
from kvsim.errors import InputError

RECORD = "record.json"
STORE_FORMAT = 1


def _write_json(path: Path, doc: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, sort_keys=True, indent=1, default=_jsonable)
        fh.flush()
        os.fsync(fh.fileno())


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    return str(v)


class ResultStore:
    """``<root>/results/<key>/record.json`` (+ ``results/``), written atomically."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.entries = self.root / "results"
        self.tmp = self.root / ".tmp"
        self.run_id = uuid.uuid4().hex[:12]
        self._lock: FileLock | None = None

    def open(self) -> ResultStore:
        """Create the layout, take the lock and drop leftovers of killed runs."""
        if self.root.exists() and not self.root.is_dir():
            raise InputError("--out", str(self.root), "exists and is not a directory")
        self.entries.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(exist_ok=True)
        lock = FileLock(self.root / ".lock", timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise InputError("--out", str(self.root),
                             "another sweep is writing this result store; wait for it") from None
        self._lock = lock
        for stale in self.tmp.iterdir():
            shutil.rmtree(stale, ignore_errors=True)
        return self

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> ResultStore:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def has(self, key: str) -> bool:
        return (self.entries / key).is_dir()

    def finished(self) -> set[str]:
        return {p.name for p in self.entries.iterdir() if p.is_dir()} if self.entries.is_dir() \
            else set()

    def put(self, key: str, record: dict[str, Any], results: Any = None) -> bool:
        """Store one finished scenario; False if it was already there (kept as is)."""
        final = self.entries / key
        if final.exists():
            return False
        work = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=self.tmp))
        try:
            doc = {**record, "store_key": key, "kvsim_version": __version__,
                   "store_format": STORE_FORMAT, "run_id": self.run_id,
                   "stored_at_unix_s": time.time()}
            if results is not None:
                results.save(work / "results")
            _write_json(work / RECORD, doc)
            os.replace(work, final)
        except OSError:
            shutil.rmtree(work, ignore_errors=True)
            if final.is_dir():
                return False
            raise
        return True

    def add_results(self, key: str, results: Any) -> None:
        """Give a stored summary-only entry its full Results (kept if it has them)."""
        entry = self.entries / key
        if (entry / "results").is_dir():
            return
        work = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=self.tmp))
        try:
            results.save(work / "results")
            os.replace(work / "results", entry / "results")
            doc = {**self.get(key), "summary_only": False}
            _write_json(work / RECORD, doc)
            os.replace(work / RECORD, entry / RECORD)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def get(self, key: str) -> dict[str, Any]:
        path = self.entries / key / RECORD
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise InputError("result store", str(path), "missing or unreadable entry") from None

    def results_dir(self, key: str) -> Path | None:
        p = self.entries / key / "results"
        return p if p.is_dir() else None


def results_key(scenario_hash: str, scenario: Any, digests: dict[str, str]) -> str:
    """The store key of a scenario's results: its hash, the kvsim version and the content
    of every file it reads (a trace, a preset or a calibration YAML/JSON given by path),
    so an edited input file or a new kvsim is run again, never served stale.

    NOTE: a bundled preset is named, not read here: the version covers it.  ``digests``
    caches the sha256 of each path already read (a trace can be large).
    """
    wl, lat = scenario.workload, scenario.latency
    preset = wl.preset if wl.preset and wl.preset.endswith((".yaml", ".yml")) else None
    paths = [("workload.trace", wl.trace), ("workload.preset", preset),
             ("latency.path", getattr(lat, "path", None))]
    parts = [scenario_hash, __version__]
    for field, path in ((f, str(p)) for f, p in paths if p):
        if path not in digests:
            try:
                with open(path, "rb") as fh:
                    digests[path] = hashlib.file_digest(fh, "sha256").hexdigest()
            except OSError as exc:
                raise InputError(field, path, f"cannot read ({exc.strerror})") from None
        parts.append(digests[path])
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def write_table(df: pd.DataFrame, path: Path) -> None:
    """Write a DataFrame as Parquet or CSV (by suffix) via a temp file + os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        if path.suffix == ".parquet":
            df.to_parquet(tmp, index=False)
        else:
            df.to_csv(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
