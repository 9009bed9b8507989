"""Trace files: JSONL and Parquet readers (streaming) and writers (atomic).

Formats (chosen by file extension):

* ``.jsonl`` — line 1 is a header ``{"trace_meta": {...TraceMeta...}}``; every
  further line is one :class:`Session` as JSON (``Session.model_dump(mode="json")``).
  Blank lines are skipped.
* ``.parquet`` — *nested*: one row per session with the same fields as the JSON
  form (``turns`` is a list of structs; each turn holds ``prefix`` and
  ``references`` as lists of structs).  :class:`TraceMeta` is stored as JSON in the
  schema metadata under ``kvsim.trace_meta``.  Rows are written in row groups of
  whole multiples of :data:`ROW_GROUP_SESSIONS` sessions holding at least
  :data:`ROW_GROUP_TURNS` turns, and read back :data:`ROW_GROUP_SESSIONS` at a time.

Readers yield sessions one at a time, so a trace never sits whole in memory
(:class:`TraceSessions` reads a file again for each pass), and check that sessions come sorted by their first ``start_s`` (the order the simulator
consumes them in).  Writers write to a temporary file beside the target and
``os.replace`` it at the end, so an error half-way (a bad row in an importer's
stream) leaves no output file behind.

NOTE: every error names the file, the line (JSONL) or row (Parquet, 1-based) and
the field, e.g. ``trace.jsonl line 17: turns.0.output_tokens: -3 — Input should be
greater than 0``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from kvsim.config.files import no_such_file, text_lines
from kvsim.errors import InputError, from_validation_error
from kvsim.workload.schema import Session, TraceMeta

ROW_GROUP_SESSIONS = 2048
ROW_GROUP_TURNS = 1 << 16  # NOTE: a row group holds at least this many turns (but the last)
FORMATS = (".jsonl", ".parquet")
_META_KEY = b"kvsim.trace_meta"

_SEGMENT = pa.struct([("id", pa.string()), ("tokens", pa.int64())])
_REFERENCE = pa.struct([
    ("turn", pa.int64()), ("part", pa.string()), ("offset_tokens", pa.int64()),
    ("length_tokens", pa.int64()), ("content", pa.string())])
_TURN = pa.struct([
    ("start_s", pa.float64()), ("think_s", pa.float64()), ("prefix", pa.list_(_SEGMENT)),
    ("tool_tokens", pa.int64()), ("input_tokens", pa.int64()),
    ("output_tokens", pa.int64()), ("references", pa.list_(_REFERENCE))])
SESSION_SCHEMA = pa.schema([
    ("session_id", pa.string()), ("kind", pa.string()), ("member", pa.string()),
    ("shared_prefix", pa.list_(_SEGMENT)),
    ("system_prompt_id", pa.string()), ("system_prompt_tokens", pa.int64()),
    ("history", pa.string()), ("turns", pa.list_(_TURN))])
OPTIONAL_COLUMNS = frozenset({"shared_prefix"})
"""Columns a Parquet trace may lack (written before they existed): their default."""


def trace_format(path: str | Path, field: str = "output") -> str:
    """``.jsonl`` or ``.parquet`` from the file name, else an InputError."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InputError(field, str(path), "file name must end in .jsonl or .parquet")
    return suffix


def validation_error(where: str, exc: ValidationError) -> InputError:
    """First pydantic error as ``<where>: <loc>: <value> — <message>``."""
    return from_validation_error(exc, prefix=where, sep=": ")


def parse_session(data: Any, where: str) -> Session:
    try:
        return Session.model_validate(data)
    except ValidationError as exc:
        raise validation_error(where, exc) from None


# ----------------------------------------------------------------------------- reading

def read_meta(path: str | Path) -> TraceMeta:
    """The trace header (JSONL first line / Parquet schema metadata)."""
    p = _existing(path)
    if trace_format(p, "trace") == ".parquet":
        raw = (_parquet_file(p).schema_arrow.metadata or {}).get(_META_KEY)
        try:
            return TraceMeta.model_validate_json(raw) if raw else TraceMeta()
        except ValidationError as exc:
            raise validation_error(f"{p.name}: trace_meta", exc) from None
    with p.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(text_lines(fh, p.name, p), 1):
            if line.strip():
                return _parse_header(line, p.name, lineno)
    raise InputError(p.name, "", "empty file — expected a trace_meta header line")


def count_sessions(path: str | Path, limit: int | None = None) -> int:
    """Sessions in a trace file without parsing them (Parquet metadata / JSONL lines).

    With ``limit`` a JSONL file is read only until it is known to hold more than
    ``limit`` sessions (the result is then ``limit + 1``), so a huge trace is not read
    whole just to be refused.
    """
    p = _existing(path)
    if trace_format(p, "trace") == ".parquet":
        n = _parquet_file(p).metadata.num_rows
        return n if limit is None else min(n, limit + 1)
    stop = None if limit is None else limit + 2  # the header line, then limit + 1 sessions
    with p.open("rb") as fh:
        lines = islice((line for line in fh if not line.isspace()), stop)
        return max(sum(1 for _ in lines) - 1, 0)  # minus the header


def iter_sessions(path: str | Path, check_order: bool = True,
                  unique_ids: bool = True) -> Iterator[Session]:
    """Stream the sessions of a trace file; InputError on the first bad record.

    With ``check_order`` a session whose first ``start_s`` is earlier than the
    previous one's is an error (use :func:`sorted_sessions` to sort instead).  With
    ``unique_ids`` a session id used before is an error.

    NOTE: memory: one record at a time, plus every session id with ``unique_ids`` (the
    one check that must remember them all; ``trace inspect`` and ``trace sample``,
    which need no unique ids, read without it, a simulation or replay with it).
    """
    p = _existing(path)
    source = _iter_parquet(p) if trace_format(p, "trace") == ".parquet" else _iter_jsonl(p)
    last = float("-inf")
    count = 0
    seen: set[str] = set()
    for where, session in source:
        if unique_ids:
            if session.session_id in seen:
                raise InputError(f"{where}: session_id", session.session_id,
                                 "already used by an earlier session; session ids must be "
                                 "unique")
            seen.add(session.session_id)
        start = session.turns[0].start_s or 0.0
        if check_order and start < last:
            raise InputError(f"{where}: turns.0.start_s", start,
                             f"earlier than the previous session's {last}; sessions must "
                             "be sorted by first start_s (use --sort)")
        last = max(last, start)
        count += 1
        yield session
    if count == 0:
        raise InputError(p.name, "", "no sessions in trace")


def sorted_sessions(path: str | Path, unique_ids: bool = True) -> list[Session]:
    """All sessions of a trace, sorted by first start_s (loads the whole trace)."""
    return sorted(iter_sessions(path, check_order=False, unique_ids=unique_ids),
                  key=lambda s: s.turns[0].start_s or 0.0)


class TraceSessions:
    """A trace file's sessions, read anew on each pass and counted from the file
    (:func:`count_sessions`) — a :class:`kvsim.workload.sampling.SessionSource` that
    streams.  With ``sort`` the trace is loaded and sorted once instead.

    NOTE: read without the session-id check (``iter_sessions(unique_ids=False)``).
    """

    def __init__(self, path: str | Path, sort: bool = False) -> None:
        self.path = path
        self._sorted = sorted_sessions(path, unique_ids=False) if sort else None

    def __iter__(self) -> Iterator[Session]:
        if self._sorted is not None:
            return iter(self._sorted)
        return iter_sessions(self.path, unique_ids=False)

    def __len__(self) -> int:
        if self._sorted is not None:
            return len(self._sorted)
        n = count_sessions(self.path)
        if n == 0:  # NOTE: the reader's own error (no header, no sessions, ...)
            for _ in iter_sessions(self.path, unique_ids=False):
                pass
        return n


def read_trace(path: str | Path) -> tuple[TraceMeta, list[Session]]:
    return read_meta(path), list(iter_sessions(path))


def _existing(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise no_such_file("trace", path, "a trace file (.jsonl or .parquet)")
    return p


def _parse_header(line: str, name: str, lineno: int) -> TraceMeta:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{name} line {lineno}", line.strip()[:60],
                         f"not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict) or "trace_meta" not in obj:
        raise InputError(f"{name} line {lineno}: trace_meta", line.strip()[:60],
                         "the first line of a kvsim trace must be {\"trace_meta\": {...}}")
    try:
        return TraceMeta.model_validate(obj["trace_meta"])
    except ValidationError as exc:
        raise validation_error(f"{name} line {lineno}: trace_meta", exc) from None


def _iter_jsonl(p: Path) -> Iterator[tuple[str, Session]]:
    header_seen = False
    with p.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(text_lines(fh, p.name, p), 1):
            if not line.strip():
                continue
            if not header_seen:
                _parse_header(line, p.name, lineno)
                header_seen = True
                continue
            where = f"{p.name} line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(where, line.strip()[:60],
                                 f"not valid JSON ({exc.msg} at column {exc.colno})") from None
            yield where, parse_session(obj, where)
    if not header_seen:
        raise InputError(p.name, "", "empty file — expected a trace_meta header line")


def _parquet_file(p: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(p)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(p.name, str(p), f"not a readable Parquet file ({exc})") from None


def _iter_parquet(p: Path) -> Iterator[tuple[str, Session]]:
    pf = _parquet_file(p)
    have = pf.schema_arrow.names
    missing = [n for n in SESSION_SCHEMA.names if n not in have and n not in OPTIONAL_COLUMNS]
    if missing:
        raise InputError(f"{p.name}: columns", have, "missing " + ", ".join(missing))
    columns = [n for n in SESSION_SCHEMA.names if n in have]
    row = 0
    for batch in pf.iter_batches(batch_size=ROW_GROUP_SESSIONS, columns=columns):
        for obj in batch.to_pylist():
            row += 1
            yield f"{p.name} row {row}", parse_session(_strip_nulls(obj), f"{p.name} row {row}")


def _strip_nulls(obj: dict[str, Any]) -> dict[str, Any]:
    """Parquet stores absent optionals as null; drop them so defaults apply."""
    out = {k: v for k, v in obj.items() if v is not None or k == "system_prompt_id"}
    out["turns"] = [{k: v for k, v in t.items() if v is not None or k == "start_s"}
                    for t in obj.get("turns") or []]
    for t in out["turns"]:
        t["references"] = [{k: v for k, v in r.items() if v is not None or k == "turn"}
                           for r in t.get("references") or []]
    return out


# ----------------------------------------------------------------------------- writing

@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; ``os.replace`` it on success, delete on error."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_trace(path: str | Path, sessions: Iterable[Session],
                meta: TraceMeta | None = None) -> int:
    """Write sessions (any iterable, consumed once) to ``path``; returns the count."""
    fmt = trace_format(path)
    meta = meta or TraceMeta()
    with atomic_path(path) as tmp:
        n = _write_parquet(tmp, sessions, meta) if fmt == ".parquet" else \
            _write_jsonl(tmp, sessions, meta)
        if n == 0:
            raise InputError("output", str(path), "no sessions to write")
    return n


def _write_jsonl(tmp: Path, sessions: Iterable[Session], meta: TraceMeta) -> int:
    n = 0
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps({"trace_meta": meta.model_dump(mode="json")}) + "\n")
        for s in sessions:
            fh.write(s.model_dump_json() + "\n")
            n += 1
    return n


def _write_parquet(tmp: Path, sessions: Iterable[Session], meta: TraceMeta) -> int:
    """Sessions turned into Arrow :data:`ROW_GROUP_SESSIONS` at a time; a row group is
    written once it holds :data:`ROW_GROUP_TURNS` turns (or at the end).

    NOTE: the writer keeps every row group's metadata until it closes (≈ 20 KB each), so
    groups of one-turn sessions 2,048 at a time would grow it with the trace.
    """
    schema = SESSION_SCHEMA.with_metadata({_META_KEY: meta.model_dump_json().encode()})
    n = turns = 0
    with pq.ParquetWriter(tmp, schema) as writer:
        buf: list[dict[str, Any]] = []
        parts: list[pa.Table] = []
        for s in sessions:
            buf.append(s.model_dump(mode="json"))
            n += 1
            turns += len(s.turns)
            if len(buf) >= ROW_GROUP_SESSIONS:
                parts.append(pa.Table.from_pylist(buf, schema=schema))
                buf = []
                if turns >= ROW_GROUP_TURNS:
                    writer.write_table(pa.concat_tables(parts))
                    parts, turns = [], 0
        if buf:
            parts.append(pa.Table.from_pylist(buf, schema=schema))
        if parts:
            writer.write_table(pa.concat_tables(parts))
    return n
