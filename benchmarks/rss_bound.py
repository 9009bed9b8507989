"""How ``sim.max_rss_bytes`` holds for the whole ``kvsim simulate`` process, and what the
guard's save headroom (``kvsim.metrics.records.SAVE_RESERVE_BYTES`` /
``SAVE_BYTES_PER_ROW``) is made of.  Prints figures; not a test.

Part 1: ``quickstart`` with a 0.1 ms memory tick (the memory timeline grows ~1 M rows a
minute of wall time) under limits of 300 and 400 MiB, each in a child process: the
child's peak (Linux ``VmHWM``), saving and the report included, against the limit.

Part 2: one run in this process, the RSS at each phase after the stop — the rows held,
the tables built, saved — then the process peak with the report written, and the bytes
per memory sample beyond the rows held that it took.

    python benchmarks/rss_bound.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

SETS = ["sim.sample_interval_s=0.0001", "workload.days=5"]
_CHILD = ("import sys\nfrom kvsim.cli import main\ntry:\n    main(sys.argv[1:])\n"
          "except SystemExit:\n    pass\n"
          "print(next(x for x in open('/proc/self/status') if x.startswith('VmHWM')).split()[1])")


def _mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def _peak_mib() -> float:
    with open("/proc/self/status") as fh:
        return int(next(x for x in fh if x.startswith("VmHWM")).split()[1]) / 1024


def bounded(limit_mib: int, out: Path) -> None:
    argv = ["simulate", "quickstart", *(a for s in SETS for a in ("--set", s)), "--set",
            f"sim.max_rss_bytes={limit_mib}MiB", "-o", str(out)]
    done = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True,
                          text=True, check=False)
    peak = int(done.stdout.split()[-1]) / 1024
    stop = done.stderr.strip().splitlines()[-1][:110]
    print(f"limit {limit_mib} MiB: peak {peak:.0f} MiB ({peak / limit_mib:.0%}); {stop}…")


def phases(limit_mib: int, out: Path) -> None:
    from kvsim import api
    from kvsim.metrics import results
    from kvsim.report import write_report
    from kvsim.scenario import load_scenario

    held: dict[str, float] = {}
    build = results.tables_from

    def timed_tables(rec):  # the RSS with every row held, then with the tables
        held["rows"], held["samples"] = _mib(), len(rec.memory)
        tables = build(rec)
        held["tables"] = _mib()
        return tables

    api.tables_from = timed_tables
    res = api.simulate(load_scenario("quickstart", [*SETS, f"sim.max_rss_bytes={limit_mib}MiB"]))
    api.tables_from = build
    path = res.save(out)
    saved = _mib()
    write_report(path / "report.html", [res], kind="simulate")
    top = _peak_mib()
    n = held["samples"]
    print(f"{n:,.0f} samples: rows held {held['rows']:.0f} MiB, tables {held['tables']:.0f}, "
          f"saved {saved:.0f}; process peak, the report included, {top:.0f} MiB")
    from kvsim.metrics.records import NEXT_CHECK_BYTES, SAVE_BYTES_PER_ROW, SAVE_RESERVE_BYTES
    reserve = SAVE_RESERVE_BYTES + NEXT_CHECK_BYTES + SAVE_BYTES_PER_ROW["memory"] * n
    print(f"beyond the rows held: {top - held['rows']:.0f} MiB; the guard's headroom for "
          f"{n:,} samples: {reserve / 2**20:.0f} MiB (fixed {SAVE_RESERVE_BYTES / 2**20:.0f} "
          f"+ next check {NEXT_CHECK_BYTES / 2**20:.0f} + {SAVE_BYTES_PER_ROW['memory']} "
          "bytes a sample)")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for limit in (300, 400):
            bounded(limit, Path(tmp) / f"r{limit}")
        shutil.rmtree(Path(tmp) / "r300", ignore_errors=True)
        phases(400, Path(tmp) / "p")


if __name__ == "__main__":
    main()
