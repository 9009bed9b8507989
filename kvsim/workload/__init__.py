"""Workloads: the trace schema, household generator, importers, sampling and loading.

The simulator needs only :func:`load_workload` (a ``WorkloadConfig`` and a seed →
an iterator of :class:`Session` sorted by first ``start_s``).
"""

from kvsim.workload.loader import load_workload
from kvsim.workload.schema import ReferenceEvent, Segment, Session, TraceMeta, Turn

__all__ = ["ReferenceEvent", "Segment", "Session", "TraceMeta", "Turn", "load_workload"]
