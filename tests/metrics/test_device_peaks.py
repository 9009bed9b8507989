"""Several GPUs: each GPU's peak is its fixed bytes plus its part of the pool's peak, and
the box's peak fraction is the fullest GPU's (kvsim.metrics.summary.device_peaks)."""

import pandas as pd
import pytest

from kvsim.core.build import DevicePart
from kvsim.metrics.summary import device_peaks
from kvsim.report.data_gpus import gpu_memory

GIB = 2**30
# a 24 GiB and a 12 GiB card each holding 8 GiB of weights and half of a 4 GiB pool
PARTS = (DevicePart(0, "rtx-3090", 8 * GIB, 2 * GIB, 24 * GIB),
         DevicePart(1, "rtx-3060-12gb", 8 * GIB, 2 * GIB, 12 * GIB))


def test_each_gpu_gets_its_part_of_the_reserved_peak():
    out = device_peaks(4 * GIB, PARTS)
    rows = out["gpus"]
    assert [r["peak_device_bytes"] for r in rows] == [10 * GIB, 10 * GIB]
    assert [r["peak_device_fraction"] for r in rows] == [pytest.approx(10 / 24),
                                                         pytest.approx(10 / 12)]
    assert out["peak_device_fraction"] == pytest.approx(10 / 12)   # the 3060 binds


def test_a_pool_reserved_only_in_part_spreads_in_the_same_parts():
    # half the pool reserved at its peak (a slot engine that grows): 1 GiB on each GPU
    assert [r["peak_device_bytes"] for r in device_peaks(2 * GIB, PARTS)["gpus"]] == \
        [9 * GIB, 9 * GIB]


def test_one_gpu_adds_nothing():
    assert device_peaks(4 * GIB, ()) == {}


def test_the_report_draws_each_gpus_share_over_time():
    summary = device_peaks(4 * GIB, PARTS)
    memory = pd.DataFrame({"time_s": [0.0, 1.0, 2.0],
                           "kv_reserved_bytes": [0, 2 * GIB, 4 * GIB]})
    data = gpu_memory(memory, summary)
    (l0, _, p0), (l1, f1, p1) = data["gpus"]
    assert (l0, l1) == ("GPU 0: rtx-3090", "GPU 1: rtx-3060-12gb")
    assert list(f1) == pytest.approx([8 / 12, 9 / 12, 10 / 12])
    assert (p0, p1) == (pytest.approx(10 / 24), pytest.approx(10 / 12))
    # a summary from before per-GPU rows (or one GPU) draws no such figure
    assert gpu_memory(memory, {"gpus": [{"index": 0}]}) is None
    assert gpu_memory(memory, {}) is None
