"""Results: the tables and summary of one run, saved and loaded as a directory.

Layout (``notes/results.md``, the shared contract): ``requests``, ``itl``,
``steps``, ``memory``, ``events`` and ``references`` as Parquet, ``summary.json``,
``scenario.json`` (resolved scenario + hash) and ``meta.json`` (format version,
tables, source).

``requests`` carries a ``status`` column (finished, failed, or unfinished at the
run's stop: :data:`kvsim.metrics.records.STATUSES`); a folder written before it
existed, and a measured replay, get it from ``failed`` (no run of theirs was cut
short with requests kept).  It carries a ``failure_code`` column too (one of
:data:`kvsim.metrics.failures.FAILURE_CODES` for a failed request, ``""`` otherwise,
beside the engine's own ``failure_reason``); a folder without it gets it from
``failure_reason``.

``references`` holds one row per scored reference event of the accuracy proxy
(docs/design/DESIGN.md §3.6; :mod:`kvsim.metrics.accuracy`): ``time_s, session_id, request_id,
content, outcome, bits, added_s, score``.  A folder written before the table existed
still loads: its references are read back from the ``events`` rows of kind
``reference`` (scores there are rounded to 4 decimals; ``bits`` is known only for
DEGRADED).  Rows stay modest: a 30-day ``family-4`` run scores ~1.5k references
against ~4.2k requests (at most a few per request, under the request cap).  ``save`` writes into a temporary sibling directory and renames it
into place, so an interrupted save never leaves a half-written result.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvsim import __version__
from kvsim.errors import InputError, RunStopped
from kvsim.metrics.failures import FAILURE_CODE
from kvsim.metrics.records import (
    EVENT_COLUMNS,
    ITL_DELTA,
    ITL_TABLE_COLUMNS,
    MEMORY_COLUMNS,
    OPTIONAL_REQUEST_COLUMNS,
    REQUEST_COLUMNS,
    STATUS,
    STEP_COLUMNS,
    Recorder,
)
from kvsim.metrics.rows import ReferenceRow
from kvsim.metrics.summary import failure_codes, request_status

FORMAT_VERSION = 1
TABLES = ("requests", "itl", "steps", "memory", "events")  # required in every folder
OPTIONAL_TABLES = ("references",)  # absent from folders written before it existed
REFERENCE_COLUMNS = ReferenceRow._fields
COLUMNS = {"requests": REQUEST_COLUMNS, "itl": ITL_TABLE_COLUMNS, "steps": STEP_COLUMNS,
           "memory": MEMORY_COLUMNS, "events": EVENT_COLUMNS, "references": REFERENCE_COLUMNS}
# detail of an ``events`` row of kind "reference" (kvsim.policies.recall)
_REFERENCE_DETAIL = (r"^(?P<outcome>[A-Z]+)(?:\((?P<bits>[0-9.]+)\))? (?P<content>\S+) "
                     r".* m=(?P<score>[0-9.]+) added_s=(?P<added_s>\S+)$")


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalar
        return _json_safe(obj.item())
    return obj


def dump_json(obj: Any) -> str:
    return json.dumps(_json_safe(obj), sort_keys=True, indent=1, allow_nan=False) + "\n"


def tables_from(rec: Recorder) -> dict[str, pd.DataFrame]:
    """The run's tables, built one at a time from the recorder's rows.

    NOTE: empties the recorder's row lists as it goes (the tables replace them), so a
    table's rows and its frame are the only copy held at once — the headroom
    :meth:`Recorder.save_reserve_bytes` keeps free below ``sim.max_rss_bytes``.
    """
    statuses = rec.statuses
    tables = {"requests": pd.DataFrame(rec.requests, columns=list(REQUEST_COLUMNS))}
    rec.request_rows, rec.status = [], bytearray()
    tables["requests"][STATUS] = statuses
    del statuses
    tables["itl"] = pd.DataFrame(rec.itl, columns=list(ITL_TABLE_COLUMNS))
    tables["steps"] = pd.DataFrame(rec.step_rows, columns=list(STEP_COLUMNS))
    rec.steps = []
    tables["memory"] = _taking_frame(rec.memory, MEMORY_COLUMNS)
    tables["events"] = pd.DataFrame(rec.events, columns=list(EVENT_COLUMNS))
    rec.events = []
    return tables


FRAME_CHUNK_ROWS = 1 << 16  # NOTE: rows turned into a frame (and freed) at a time


def _taking_frame(rows: list[Any], columns: tuple[str, ...]) -> pd.DataFrame:
    """``pd.DataFrame(rows, columns)`` of numeric rows, built from the end one chunk at a
    time while ``rows`` is emptied, so the rows and the frame are not held whole twice.

    NOTE: the chunks are joined at the end (``pd.concat``): the same columns and dtypes as
    one frame of all the rows, as every row holds the same kinds of numbers.
    """
    if not rows:
        return pd.DataFrame(rows, columns=list(columns))
    chunks = []
    while rows:
        chunks.append(pd.DataFrame(rows[-FRAME_CHUNK_ROWS:], columns=list(columns)))
        del rows[-FRAME_CHUNK_ROWS:]
    chunks.reverse()
    return pd.concat(chunks, ignore_index=True)


def with_status(requests: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with its ``status`` column: as recorded, or (older folders, measured
    replays) ``failed`` / ``finished`` from the ``failed`` column."""
    if STATUS in requests.columns:
        return requests
    return requests.assign(**{STATUS: pd.Series(request_status(requests).tolist(),
                                                index=requests.index)})


def with_failure_code(requests: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with its ``failure_code`` column (module doc): as saved, or derived
    from ``failure_reason`` (``""`` for a request that did not fail)."""
    if FAILURE_CODE in requests.columns or "failed" not in requests.columns:
        return requests
    failed = failure_codes(requests)
    codes = dict(zip(failed.index, failed))
    return requests.assign(**{FAILURE_CODE: pd.Series(
        [codes.get(i, "") for i in requests.index], index=requests.index)})


def references_frame(scored: Iterable[Any]) -> pd.DataFrame:
    """The ``references`` table from :class:`kvsim.metrics.accuracy.ScoredEvent` rows."""
    rows = [ReferenceRow(time_s=e.time_s, session_id=e.session_id, request_id=e.request_id,
                         content=e.content, outcome=e.outcome.label,
                         bits=float(e.outcome.bits), added_s=e.outcome.added_s, score=e.m)
            for e in scored]
    return _typed_references(pd.DataFrame(rows, columns=list(REFERENCE_COLUMNS)))


def references_from_events(events: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """The ``references`` table read back from ``events`` rows of kind ``reference``
    (folders written before the table existed; see the module doc)."""
    if "kind" not in events.columns or "detail" not in events.columns:
        return references_frame(())
    ev = events[events["kind"] == "reference"]
    parsed = ev["detail"].astype(str).str.extract(_REFERENCE_DETAIL)
    ok = parsed["outcome"].notna().to_numpy()
    ev, parsed = ev[ok], parsed[ok]
    owner = dict(zip(requests["request_id"].astype(str), requests["session_id"].astype(str))) \
        if {"request_id", "session_id"} <= set(requests.columns) else {}
    rid = ev["request_id"].astype(str)
    out = pd.DataFrame({
        "time_s": ev["time_s"].to_numpy(dtype=float),
        "session_id": [owner.get(r, r.rsplit("#", 1)[0]) for r in rid],
        "request_id": rid.to_numpy(), "content": parsed["content"].to_numpy(),
        "outcome": parsed["outcome"].to_numpy(),
        "bits": pd.to_numeric(parsed["bits"]).to_numpy(dtype=float),
        "added_s": pd.to_numeric(parsed["added_s"]).to_numpy(dtype=float),
        "score": pd.to_numeric(parsed["score"]).to_numpy(dtype=float)})
    return _typed_references(out)


def _typed_references(df: pd.DataFrame) -> pd.DataFrame:
    """Fixed dtypes, so an empty table round-trips through Parquet unchanged."""
    return df.astype({"time_s": float, "session_id": str, "request_id": str, "content": str,
                      "outcome": str, "bits": float, "added_s": float, "score": float})


@dataclass
class Results:
    """DataFrames + summary + resolved scenario of one simulated or measured run."""

    requests: pd.DataFrame
    itl: pd.DataFrame
    steps: pd.DataFrame
    memory: pd.DataFrame
    events: pd.DataFrame
    summary: dict[str, Any]
    scenario: dict[str, Any] = field(default_factory=dict)
    scenario_hash: str = ""
    source: str = "simulated"
    meta: dict[str, Any] = field(default_factory=dict)  # meta.json as loaded
    references: pd.DataFrame | None = None  # None: read back from ``events`` (module doc)
    path: str = field(default="", compare=False)  # the folder it was loaded from, if any
    # NOTE: the bound that ended the run early (None: it ran to its end); not saved —
    # the summary's stopped_at_s / stopped_reason say it in the folder
    stopped: RunStopped | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.requests = with_failure_code(with_status(self.requests))
        if self.references is None:
            self.references = references_from_events(self.events, self.requests)

    def table(self, name: str) -> pd.DataFrame:
        return getattr(self, name)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the result directory atomically; return its path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            for name in (*TABLES, *OPTIONAL_TABLES):
                self.table(name).to_parquet(tmp / f"{name}.parquet", index=False)
            (tmp / "summary.json").write_text(dump_json(self.summary))
            (tmp / "scenario.json").write_text(dump_json(
                {"scenario": self.scenario, "hash": self.scenario_hash}))
            (tmp / "meta.json").write_text(dump_json({
                "kvsim_version": __version__, "format_version": FORMAT_VERSION,
                "tables": [*TABLES, *OPTIONAL_TABLES], "source": self.source}))
            old = None
            if target.exists():
                old = target.with_name(f".{target.name}.old-{os.getpid()}")
                os.replace(target, old)
            os.replace(tmp, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Results:
        """Read a result directory; InputError names what is missing, damaged or mismatched."""
        p = Path(path)
        if not p.is_dir():
            raise InputError("results", str(p), "not a results directory")
        need = [f"{t}.parquet" for t in TABLES] + ["summary.json", "scenario.json", "meta.json"]
        missing = [n for n in need if not (p / n).is_file()]
        if missing:
            raise InputError("results", str(p), "missing " + ", ".join(missing))
        meta = _read_object(p / "meta.json")
        if meta.get("format_version") != FORMAT_VERSION:
            raise InputError("results.format_version", meta.get("format_version"),
                             f"this kvsim reads format {FORMAT_VERSION}")
        source = meta.get("source", "simulated")
        if source not in SOURCES:
            raise _damaged(p / "meta.json", f"source {source!r} is not one of "
                           + ", ".join(SOURCES))
        scen = _read_object(p / "scenario.json")
        scenario, digest = scen.get("scenario", {}), scen.get("hash", "")
        if not isinstance(scenario, dict) or not isinstance(digest, str):
            raise _damaged(p / "scenario.json", "needs 'scenario' (an object) and 'hash' "
                           "(a string)")
        summary = _read_object(p / "summary.json")
        summary = {k: (math.nan if v is None else v) for k, v in summary.items()}
        frames = {t: _read_table(p / f"{t}.parquet", COLUMNS[t]) for t in TABLES}
        for t in OPTIONAL_TABLES:
            if (p / f"{t}.parquet").is_file():
                frames[t] = _read_table(p / f"{t}.parquet", COLUMNS[t])
        if ITL_DELTA not in frames["itl"].columns:  # run-length rows (older / measured)
            frames["itl"][ITL_DELTA] = 0.0
        return cls(**frames, summary=summary, scenario=scenario, scenario_hash=digest,
                   source=source, meta=meta, path=str(p))


SOURCES = ("simulated", "measured")
"""``meta.json`` ``source``: kvsim simulate (and sweeps), kvsim replay."""


def _damaged(path: Path, why: str) -> InputError:
    return InputError("results", str(path), f"damaged results folder: {why} (rerun the "
                      "command that wrote it)")


def _read_object(path: Path) -> dict[str, Any]:
    """One JSON object file of a results folder."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError("results", str(path), f"cannot read ({exc.strerror})") from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        raise _damaged(path, "not valid JSON") from None
    if not isinstance(doc, dict):
        raise _damaged(path, f"a JSON object expected, found {type(doc).__name__}")
    return doc


def _read_table(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """One Parquet table of a results folder, with the columns kvsim writes (a column
    added since, absent from an older folder, gets its neutral value)."""
    import pyarrow as pa

    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise _damaged(path, f"not a readable Parquet table ({type(exc).__name__})") from None
    lacking = [c for c in columns if c not in df.columns and c != ITL_DELTA]
    for c in [c for c in lacking if c in OPTIONAL_REQUEST_COLUMNS]:
        df[c] = OPTIONAL_REQUEST_COLUMNS[c]
        lacking.remove(c)
    if lacking:
        raise _damaged(path, "missing column(s) " + ", ".join(lacking))
    return df
