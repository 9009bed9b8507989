"""Importers for public request traces → kvsim sessions.

* **Mooncake** JSONL (``timestamp`` ms, ``input_length``, ``output_length``,
  ``hash_ids``: one id per 512-token prompt block).  Each request becomes a turn of a
  ``history: none`` session whose ``prefix`` is the block list as segments
  ``mc/<hash_id>`` (512 tokens; the last block holds the remainder of
  ``input_length``), so prefix identity stays token-exact.  ``len(hash_ids) ==
  ceil(input_length / 512)`` is checked per row.  Follow-up turns are inferred: a
  request whose ``hash_ids`` start with *all full blocks* of an earlier request
  joins the session of the latest such request with the longest match (branches stay
  in the same session, so down-sampling keeps a whole prefix tree together) — unless
  that match ends inside the trace's *common prefix*: the leading blocks that at least
  :data:`SHARED_PREFIX_FANOUT` different continuations follow (a system prompt every
  conversation starts with, like block 0 of Mooncake's conversation trace), which
  start conversations rather than continue one.  Inferring sessions needs every row,
  so the importer holds them (≈ 250 bytes a row and 8 an id): at most
  :data:`MOONCAKE_MAX_ROWS` rows and :data:`MOONCAKE_MAX_BLOCKS` ids, else a one-line stop.
* **Azure LLM** CSV (``TIMESTAMP`` ``YYYY-MM-DD HH:MM:SS.fffffff``, ``ContextTokens``,
  ``GeneratedTokens``): one single-turn open-loop session per row.
* **BurstGPT** CSV (columns by name: ``Timestamp`` s, ``Request tokens``,
  ``Response tokens``; ``Session ID`` when present groups rows into
  ``history: none`` sessions).  Rows with 0 response tokens are failed requests in
  BurstGPT; they are skipped with a warning.
* **ShareGPT**-style conversations: see :mod:`kvsim.workload.sharegpt`.

All timestamps become seconds since the first request.  Timestamps going
backwards are an error naming the line, unless ``sort=True`` (then the rows are
sorted and a :class:`TraceWarning` says how many were out of order).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import warnings
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from kvsim.config.files import no_such_file, text_lines
from kvsim.errors import InputError
from kvsim.workload.schema import Segment, Session, TraceMeta, Turn

MOONCAKE_BLOCK_TOKENS = 512
# NOTE: a leading block chain followed by this many distinct next blocks is a prefix the
# trace's conversations share (not one conversation): the synthetic trace's largest
# branching inside a conversation is 13, its conversation trace's block 0 has thousands
SHARED_PREFIX_FANOUT = 64
# NOTE: the Mooncake importer holds every row to infer sessions: ≈ 250 MB at these
# bounds (rows and ids); past either the import stops with a one-line message
MOONCAKE_MAX_ROWS = 500_000
BURSTGPT_MAX_GROUPED_ROWS = 500_000  # NOTE: grouping by Session ID holds the rows too
MOONCAKE_MAX_BLOCKS = 16_000_000


class TraceWarning(UserWarning):
    """Something was repaired or dropped during import (the CLI prints it)."""


def as_int(value: Any, where: str, field: str, minimum: int = 0) -> int:
    """A token count: an integer >= minimum (integral floats and digit strings accepted)."""
    v = value
    if isinstance(v, str):
        try:
            v = float(v.strip()) if v.strip() else None
        except ValueError:
            raise InputError(f"{where}: {field}", value, "not a number") from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
            or v != int(v):
        raise InputError(f"{where}: {field}", value, "must be a whole number")
    if v < minimum:
        raise InputError(f"{where}: {field}", value, f"must be >= {minimum}")
    return int(v)


def as_time(value: Any, where: str, field: str) -> float:
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {field}", value, "not a number") from None
    if not math.isfinite(t):
        raise InputError(f"{where}: {field}", value, "must be finite")
    return t


def open_text(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise no_such_file("file", path, "the trace file to import")
    if p.stat().st_size == 0:
        raise InputError(p.name, "", "empty file — no requests")
    return p


def ordered(records: Iterable[tuple[str, float, Any]], sort: bool,
            name: str) -> Iterator[tuple[str, float, Any]]:
    """Pass (where, time, payload) records through, rejecting or sorting backward times."""
    if sort:
        items = list(records)
        late = sum(1 for a, b in itertools.pairwise(items) if b[1] < a[1])
        if late:
            warnings.warn(f"{name}: {late} rows had earlier timestamps than the row before; "
                          "sorted by time", TraceWarning, stacklevel=2)
            items.sort(key=lambda r: r[1])
        yield from items
        return
    last = -math.inf
    for where, t, payload in records:
        if t < last:
            raise InputError(f"{where}: timestamp", t,
                             f"earlier than the previous row ({last}); pass --sort to sort")
        last = t
        yield where, t, payload


def _rebase(records: Iterable[tuple[str, float, Any]], name: str
            ) -> Iterator[tuple[str, float, Any]]:
    """Shift times so the first record is at 0; an empty input is an error."""
    t0 = None
    for where, t, payload in records:
        if t0 is None:
            t0 = t
        yield where, t - t0, payload
    if t0 is None:
        raise InputError(name, "", "empty file — no requests")


# ----------------------------------------------------------------------------- Mooncake

class _McRow(NamedTuple):
    """One Mooncake request as the importer holds it."""

    start_s: float
    n_in: int
    n_out: int
    ids: array  # of int64 hash ids


def _mooncake_rows(p: Path) -> Iterator[tuple[str, float, tuple[int, int, array]]]:
    held = 0
    with p.open("r", encoding="utf-8") as fh:
        for n, (lineno, line) in enumerate(
                (k, x) for k, x in enumerate(text_lines(fh, p.name, p), 1) if x.strip()):
            where = f"{p.name} line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(where, line.strip()[:60], f"not valid JSON ({exc.msg})") \
                    from None
            if not isinstance(obj, dict):
                raise InputError(where, line.strip()[:60], "expected a JSON object")
            for key in ("timestamp", "input_length", "output_length", "hash_ids"):
                if key not in obj:
                    raise InputError(f"{where}: {key}", None, "missing key")
            n_in = as_int(obj["input_length"], where, "input_length", 1)
            n_out = as_int(obj["output_length"], where, "output_length", 1)
            ids = obj["hash_ids"]
            if not isinstance(ids, list):
                raise InputError(f"{where}: hash_ids", ids, "must be a list of integers")
            ids = array("q", [as_int(h, where, f"hash_ids.{k}") for k, h in enumerate(ids)])
            want = math.ceil(n_in / MOONCAKE_BLOCK_TOKENS)
            if len(ids) != want:
                raise InputError(f"{where}: hash_ids", f"{len(ids)} ids",
                                 f"expected ceil(input_length/512) = {want}")
            held += len(ids)
            _check_held(where, n + 1, held)
            ts = as_time(obj["timestamp"], where, "timestamp")
            yield where, ts / 1000.0, (n_in, n_out, ids)


def _check_held(where: str, rows: int, ids: int) -> None:
    for what, n, bound in (("rows", rows, MOONCAKE_MAX_ROWS), ("hash ids", ids,
                                                               MOONCAKE_MAX_BLOCKS)):
        if n > bound:
            raise InputError(where, f"over {bound:,} {what}", f"at most {bound:,} {what} in "
                             "one Mooncake import (it holds the trace to infer sessions); "
                             "split the file by time and import the parts")


def import_mooncake(path: str | Path, sort: bool = False) -> tuple[TraceMeta, Iterator[Session]]:
    """Mooncake JSONL → sessions (holds the trace's rows to infer follow-up chains)."""
    p = open_text(path)
    rows = [_McRow(t, *payload) for _, t, payload in
            _rebase(ordered(_mooncake_rows(p), sort, p.name), p.name)]
    chains = _mooncake_chains(rows)
    meta = TraceMeta(source=f"mooncake:{p.name}",
                     description=f"{len(rows)} requests, {len(chains)} inferred sessions")

    def sessions() -> Iterator[Session]:
        for k, members in enumerate(chains):
            turns = tuple(_mooncake_turn(rows[i]) for i in members)
            yield Session(session_id=f"mc{k:06d}", kind="imported", history="none",
                          turns=turns)
    return meta, sessions()


def _mooncake_turn(row: _McRow) -> Turn:
    segs = [Segment(id=f"mc/{h}", tokens=min(MOONCAKE_BLOCK_TOKENS,
                                             row.n_in - k * MOONCAKE_BLOCK_TOKENS))
            for k, h in enumerate(row.ids)]
    return Turn(start_s=row.start_s, prefix=tuple(segs), input_tokens=0,
                output_tokens=row.n_out)


def _chain_keys(ids: Iterable[int]) -> list[int]:
    """One key per leading block chain of a row (equal keys: equal block prefixes)."""
    h, keys = 0, []
    for b in ids:
        h = hash((h, b))
        keys.append(h)
    return keys


def _common_prefix(rows: list[_McRow]) -> set[int]:
    """Keys of the leading chains the trace's conversations share: from the first block
    on, each followed by at least :data:`SHARED_PREFIX_FANOUT` distinct next blocks.

    NOTE: found one depth at a time, so it holds one key per row at most (the chains one
    block longer than the common ones found so far), not one per block.
    """
    common: set[int] = set()
    parents = {0}  # the chains found common at the previous depth (0: the empty one)
    for depth in itertools.count():
        children: set[tuple[int, int]] = set()  # (chain at depth, its next block)
        for row in rows:
            if len(row.ids) > depth + 1:
                keys = _chain_keys(row.ids[:depth + 2])
                if (keys[depth - 1] if depth else 0) in parents:
                    children.add((keys[depth], keys[depth + 1]))
        fanout = Counter(chain for chain, _ in children)
        parents = {chain for chain, n in fanout.items() if n >= SHARED_PREFIX_FANOUT}
        if not parents:
            return common
        common |= parents
    return common


def _mooncake_chains(rows: list[_McRow]) -> list[list[int]]:
    """Group requests into sessions: the parent of a request is the latest earlier
    request whose full blocks are the longest prefix of its hash_ids, when that prefix
    reaches past the common prefix (:func:`_common_prefix`)."""
    common = _common_prefix(rows)
    by_full_key: dict[int, int] = {}
    session_of: list[int] = []
    chains: list[list[int]] = []
    for i, row in enumerate(rows):
        keys = _chain_keys(row.ids)
        parent = next((by_full_key[k] for k in reversed(keys)
                       if k in by_full_key and k not in common), None)
        if parent is None:
            session_of.append(len(chains))
            chains.append([i])
        else:
            session_of.append(session_of[parent])
            chains[session_of[parent]].append(i)
        n_full = row.n_in // MOONCAKE_BLOCK_TOKENS
        if n_full:
            by_full_key[keys[n_full - 1]] = i
    # NOTE: sessions come out sorted by their first request, as rows are time-ordered.
    return chains


# ----------------------------------------------------------------------------- CSV traces

def _csv_rows(p: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    with p.open("r", encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(text_lines(fh, p.name, p))
        header = [h.strip() for h in (reader.fieldnames or [])]
        if not header:
            raise InputError(p.name, "", "empty file — no header")
        reader.fieldnames = header
        missing = [c for c in required if c not in header]
        if missing:
            raise InputError(f"{p.name}: columns", ",".join(header),
                             "missing " + ", ".join(missing) + "; need " + ", ".join(required))
        for row in reader:
            if None in row:
                raise InputError(f"{p.name} line {reader.line_num}", row[None],
                                 f"more values than the {len(header)} columns")
            yield reader.line_num, row


def parse_azure_time(text: str, where: str) -> float:
    """``YYYY-MM-DD HH:MM:SS[.fffffff]`` (7 fractional digits) → POSIX-like seconds."""
    base, _, frac = (text or "").strip().partition(".")
    try:
        whole = datetime.strptime(base, "%Y-%m-%d %H:%M:%S")
        frac_s = int(frac) / 10 ** len(frac) if frac else 0.0
    except ValueError:
        raise InputError(f"{where}: TIMESTAMP", text,
                         "expected YYYY-MM-DD HH:MM:SS.fffffff") from None
    return (whole - datetime(1970, 1, 1)).total_seconds() + frac_s


def import_azure(path: str | Path, sort: bool = False) -> tuple[TraceMeta, Iterator[Session]]:
    """Azure LLM inference CSV → one single-turn open-loop session per row (streamed)."""
    p = open_text(path)

    def records() -> Iterator[tuple[str, float, tuple[int, int]]]:
        for line, row in _csv_rows(p, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
            where = f"{p.name} line {line}"
            yield where, parse_azure_time(row["TIMESTAMP"], where), (
                as_int(row["ContextTokens"], where, "ContextTokens", 1),
                as_int(row["GeneratedTokens"], where, "GeneratedTokens", 1))

    def sessions() -> Iterator[Session]:
        for k, (_, t, (n_in, n_out)) in enumerate(_rebase(ordered(records(), sort, p.name),
                                                           p.name)):
            yield Session(session_id=f"az{k:07d}", kind="imported", history="none",
                          turns=(Turn(start_s=t, input_tokens=n_in, output_tokens=n_out),))
    return TraceMeta(source=f"azure:{p.name}"), sessions()


def import_burstgpt(path: str | Path, sort: bool = False) -> tuple[TraceMeta, Iterator[Session]]:
    """BurstGPT CSV → sessions (grouped by ``Session ID`` when that column exists)."""
    p = open_text(path)
    required = ("Timestamp", "Request tokens", "Response tokens")
    with p.open("r", encoding="utf-8-sig", newline="") as fh:
        header = next(csv.reader(text_lines(fh, p.name, p)), [])
        grouped = "Session ID" in [h.strip() for h in header]
    skipped = [0]

    def records() -> Iterator[tuple[str, float, tuple[str | None, int, int]]]:
        for line, row in _csv_rows(p, required):
            where = f"{p.name} line {line}"
            n_out = as_int(row["Response tokens"], where, "Response tokens", 0)
            n_in = as_int(row["Request tokens"], where, "Request tokens", 0)
            t = as_time(row["Timestamp"], where, "Timestamp")
            if n_out == 0:
                skipped[0] += 1
                continue
            sid = (row.get("Session ID") or "").strip() or None if grouped else None
            yield where, t, (sid, n_in, n_out)

    def sessions() -> Iterator[Session]:
        rows = _rebase(ordered(records(), sort, p.name), p.name)
        yield from (_burst_grouped(rows) if grouped else _burst_single(rows))
        if skipped[0]:
            warnings.warn(f"{p.name}: skipped {skipped[0]} rows with 0 response tokens "
                          "(failed requests)", TraceWarning, stacklevel=2)
    return TraceMeta(source=f"burstgpt:{p.name}"), sessions()


def _burst_single(rows: Iterable[tuple[str, float, Any]]) -> Iterator[Session]:
    for k, (_, t, (_, n_in, n_out)) in enumerate(rows):
        yield Session(session_id=f"bg{k:07d}", kind="imported", history="none",
                      turns=(Turn(start_s=t, input_tokens=n_in, output_tokens=n_out),))


def _burst_grouped(rows: Iterable[tuple[str, float, Any]]) -> Iterator[Session]:
    """Group by Session ID (in memory: at most :data:`BURSTGPT_MAX_GROUPED_ROWS` rows);
    rows without an id are single-turn sessions."""
    groups: dict[str, list[Turn]] = {}
    for k, (where, t, (sid, n_in, n_out)) in enumerate(rows):
        if k >= BURSTGPT_MAX_GROUPED_ROWS:
            raise InputError(where, f"over {BURSTGPT_MAX_GROUPED_ROWS:,} rows", f"at most "
                             f"{BURSTGPT_MAX_GROUPED_ROWS:,} rows in one BurstGPT import with "
                             "a Session ID column (it holds the rows to group them); split "
                             "the file by time and import the parts")
        key = f"bg-{sid}" if sid is not None else f"bg{k:07d}"
        groups.setdefault(key, []).append(Turn(start_s=t, input_tokens=n_in,
                                               output_tokens=n_out))
    for key, turns in sorted(groups.items(), key=lambda kv: (kv[1][0].start_s, kv[0])):
        yield Session(session_id=key, kind="imported", history="none", turns=tuple(turns))


def _sharegpt(path: str | Path, sort: bool = False) -> tuple[TraceMeta, Iterator[Session]]:
    from kvsim.workload.sharegpt import import_sharegpt
    return import_sharegpt(path)


IMPORTERS: dict[str, Callable[..., tuple[TraceMeta, Iterator[Session]]]] = {
    "mooncake": import_mooncake, "azure": import_azure, "burstgpt": import_burstgpt,
    "sharegpt": _sharegpt,
}


def import_trace(fmt: str, path: str | Path, sort: bool = False
                 ) -> tuple[TraceMeta, Iterator[Session]]:
    """Dispatch on the format name (mooncake, azure, burstgpt, sharegpt)."""
    if fmt not in IMPORTERS:
        raise InputError("format", fmt, "one of " + ", ".join(IMPORTERS))
    return IMPORTERS[fmt](path, sort=sort)
