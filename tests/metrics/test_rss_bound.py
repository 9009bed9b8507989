"""``sim.max_rss_bytes`` holds for the whole ``kvsim simulate`` process, saving and the
report included: the guard stops the run early by the headroom saving its rows takes
(``Recorder.save_reserve_bytes``), and the tables are built without a second whole copy
of the rows."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from kvsim.metrics.results import FRAME_CHUNK_ROWS, _taking_frame
from kvsim.metrics.rows import MemoryRow

LIMIT_MIB = 300
TOLERANCE = 0.05  # NOTE: the reserve is measured, not exact; allocator noise across machines

# NOTE: the child's own high-water mark (VmHWM): its ru_maxrss would start at the
# pytest process's peak (Linux keeps it across fork and exec)
_CHILD = textwrap.dedent("""
    import sys
    from kvsim.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
    with open("/proc/self/status") as fh:
        peak = next(line for line in fh if line.startswith("VmHWM:")).split()[1]
    print("peak_kib", peak, "exit", code)
""")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="VmHWM: Linux only")
def test_the_memory_bound_holds_while_saving(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, "simulate", "quickstart", "--set",
         "sim.sample_interval_s=0.0001", "--set", "workload.days=5", "--set",
         f"sim.max_rss_bytes={LIMIT_MIB}MiB", "-o", str(out)],
        capture_output=True, text=True, timeout=600, check=False)
    *_, peak_kib, _, code = done.stdout.split()
    assert code == "2", done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: sim.max_rss_bytes: '") and "MiB to save the results) " \
        "after " in line and f"its memory limit ({LIMIT_MIB} MiB)" in line
    assert (out / "memory.parquet").is_file() and (out / "report.html").is_file()
    assert int(peak_kib) / 1024 <= LIMIT_MIB * (1 + TOLERANCE), int(peak_kib) / 1024


def test_tables_built_in_chunks_equal_one_frame():
    rows = [MemoryRow(0.5 * k, k * 4096, k % 7, 0, 0, k % 3, 1, 0)
            for k in range(2 * FRAME_CHUNK_ROWS + 11)]
    whole = pd.DataFrame(rows, columns=list(MemoryRow._fields))
    held = list(rows)
    got = _taking_frame(held, MemoryRow._fields)
    assert held == [] and got.equals(whole) and (got.dtypes == whole.dtypes).all()
