"""Results: the tables and summary of one run, saved and loaded as a directory.

Layout (``notes/results.md``, the shared contract): ``requests``, ``itl``,
``steps``, ``memory`` and ``events`` as Parquet, ``summary.json``,
``scenario.json`` (resolved scenario + hash) and ``meta.json`` (format version,
tables, source).  ``save`` writes into a temporary sibling directory and renames it
into place, so an interrupted save never leaves a half-written result.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvsim import __version__
from kvsim.errors import InputError
from kvsim.metrics.records import (
    EVENT_COLUMNS,
    ITL_DELTA,
    ITL_TABLE_COLUMNS,
    MEMORY_COLUMNS,
    REQUEST_COLUMNS,
    STEP_COLUMNS,
    Recorder,
)

FORMAT_VERSION = 1
TABLES = ("requests", "itl", "steps", "memory", "events")
COLUMNS = {"requests": REQUEST_COLUMNS, "itl": ITL_TABLE_COLUMNS, "steps": STEP_COLUMNS,
           "memory": MEMORY_COLUMNS, "events": EVENT_COLUMNS}


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
    rows = {"requests": rec.requests, "itl": rec.itl, "steps": rec.steps,
            "memory": rec.memory, "events": rec.events}
    return {name: pd.DataFrame(rows[name], columns=list(COLUMNS[name])) for name in TABLES}


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

    def table(self, name: str) -> pd.DataFrame:
        return getattr(self, name)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the result directory atomically; return its path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            for name in TABLES:
                self.table(name).to_parquet(tmp / f"{name}.parquet", index=False)
            (tmp / "summary.json").write_text(dump_json(self.summary))
            (tmp / "scenario.json").write_text(dump_json(
                {"scenario": self.scenario, "hash": self.scenario_hash}))
            (tmp / "meta.json").write_text(dump_json({
                "kvsim_version": __version__, "format_version": FORMAT_VERSION,
                "tables": list(TABLES), "source": self.source}))
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
        """Read a result directory; InputError names what is missing or mismatched."""
        p = Path(path)
        if not p.is_dir():
            raise InputError("results", str(p), "not a results directory")
        need = [f"{t}.parquet" for t in TABLES] + ["summary.json", "scenario.json", "meta.json"]
        missing = [n for n in need if not (p / n).is_file()]
        if missing:
            raise InputError("results", str(p), "missing " + ", ".join(missing))
        meta = json.loads((p / "meta.json").read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise InputError("results.format_version", meta.get("format_version"),
                             f"this kvsim reads format {FORMAT_VERSION}")
        frames = {t: pd.read_parquet(p / f"{t}.parquet") for t in TABLES}
        if ITL_DELTA not in frames["itl"].columns:  # run-length rows (older / measured)
            frames["itl"][ITL_DELTA] = 0.0
        scen = json.loads((p / "scenario.json").read_text())
        summary = json.loads((p / "summary.json").read_text())
        summary = {k: (math.nan if v is None else v) for k, v in summary.items()}
        return cls(**frames, summary=summary, scenario=scen.get("scenario", {}),
                   scenario_hash=scen.get("hash", ""), source=meta.get("source", "simulated"))
