"""Leave-one-device-out: refit without each device in turn and predict it.

The error a card that is in no measurement file would see (scripts/fit_speed.py prints
it and writes it beside the shipped constants).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.latency.backend import SpeedConstants
from kvsim.validate import fit as F
from kvsim.validate.fit import Row


def leave_one_device_out(rows: Sequence[Row], full: SpeedConstants,
                         jobs: int = 1) -> dict[str, float]:
    """Row id -> log error when its device was left out of the fit (warm-started at
    ``full``, leaning towards the physical defaults only: nothing of the left-out
    device reaches its prediction); ``jobs`` > 1 fits the folds in that many processes
    (the same folds, the same answers)."""
    devices = sorted({r.device for r in rows})
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            folds = pool.map(_held_out, [rows] * len(devices), devices,
                             [full] * len(devices))
            return {k: v for fold in folds for k, v in fold.items()}
    return {k: v for dev in devices for k, v in _held_out(rows, dev, full).items()}


def _held_out(rows: Sequence[Row], device: str, full: SpeedConstants) -> dict[str, float]:
    """One fold: fit without ``device``, then its rows' log errors."""
    train = [r for r in rows if r.device != device]
    test = [r for r in rows if r.device == device]
    k = F.fit_constants(train, start=full)
    return {r.m.id: float(e) for r, e in zip(test, F.log_errors(test, k))}
