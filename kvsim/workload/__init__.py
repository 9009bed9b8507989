"""Workloads: the trace schema, household generator, importers, sampling and loading.

The simulator needs only :func:`load_workload` (a ``WorkloadConfig`` and a seed →
an iterator of :class:`Session` sorted by first ``start_s``).
"""

from typing import Any

from kvsim.workload.schema import ReferenceEvent, Segment, Session, TraceMeta, Turn

__all__ = ["ReferenceEvent", "Segment", "Session", "TraceMeta", "Turn", "load_workload"]


def __getattr__(name: str) -> Any:
    # NOTE: the loader (and pyarrow, for Parquet traces) loads on first use, so the
    # engine importing the schema pulls in no file-format library
    if name == "load_workload":
        from kvsim.workload.loader import load_workload
        return load_workload
    raise AttributeError(f"module 'kvsim.workload' has no attribute {name!r}")
