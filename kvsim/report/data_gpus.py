"""Report data for a box of several GPUs: each GPU's share of its memory over time
(a pure data function; kvsim.report.figures_run.gpu_memory_figure draws it)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.report.data_run import nonempty
from kvsim.report.downsample import DEFAULT_BUCKETS, minmax_rows


def gpu_memory(memory: pd.DataFrame | None, summary: dict | None,
               buckets: int = DEFAULT_BUCKETS) -> dict | None:
    """Several GPUs: each GPU's share of its memory over time, ``{"time_s", "gpus":
    [(label, fraction array, peak fraction)]}``, or None for one GPU.

    Each GPU holds its fixed bytes and its part of the reserved KV (the summary's
    ``gpus`` rows: ``static_bytes``, ``kv_bytes``, ``device_bytes``); the pool's
    reserved bytes over time are spread over the GPUs in those parts."""
    rows = (summary or {}).get("gpus")
    keys = ("index", "gpu", "static_bytes", "kv_bytes", "device_bytes")
    if not isinstance(rows, list) or not rows or not all(
            isinstance(r, dict) and all(k in r for k in keys) for r in rows):
        return None
    if not nonempty(memory) or "kv_reserved_bytes" not in memory.columns:
        return None
    mem = memory.sort_values("time_s", kind="stable").reset_index(drop=True)
    reserved = mem["kv_reserved_bytes"].to_numpy(dtype=np.int64)
    total_kv = sum(int(r["kv_bytes"]) for r in rows) or 1
    frame = pd.DataFrame({"time_s": mem["time_s"].to_numpy(dtype=float)})
    cols = []
    for r in rows:
        col = f"_g{r['index']}"
        # NOTE: in float: int64 bytes x bytes overflows past 8 EiB (2 GiB x 4 GiB)
        used = int(r["static_bytes"]) + reserved.astype(float) * (int(r["kv_bytes"]) / total_kv)
        frame[col] = used / float(r["device_bytes"])
        cols.append(col)
    kept = minmax_rows(frame.reset_index(), "time_s", cols, buckets)
    return {"time_s": kept["time_s"].to_numpy(),
            "gpus": [(f"GPU {r['index']}: {r['gpu']}", kept[c].to_numpy(),
                      float(frame[c].max())) for r, c in zip(rows, cols, strict=True)]}
