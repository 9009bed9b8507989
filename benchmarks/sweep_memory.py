"""A household-week sweep of N points on J local workers: wall time and the parent's RSS.

Writes a sweep of ``--points`` seeds of the ``quickstart`` scenario (family-4 on
llama.cpp) for ``--days`` days, runs ``kvsim sweep -j J --no-report`` on it in a
subprocess and samples the parent process's resident memory (psutil, every 50 ms) and
its workers' while it runs; prints the wall time, the time a point, the parent's peak
RSS, its own CPU seconds (it stores every point's Results: with 2 workers it can be the
bottleneck) and its RSS after the first tenth and at the end of the points (growth a
point).

    python benchmarks/sweep_memory.py                       # 1,000 points, 2 workers
    python benchmarks/sweep_memory.py --points 100          # a quicker look

Targets (issue 24): 1,000 points on 2 workers ≤ 3 min; parent RSS ≤ 300 MB.
NOTE: the machine is shared: the wall time stretches with other load; RSS does not.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

import psutil


class RssWatch:
    """Samples a process's RSS (and its children's) until stopped."""

    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        self.proc = psutil.Process(pid)
        self.every_s = every_s
        self.parent: list[tuple[float, int]] = []
        self.workers_peak = 0
        self.parent_cpu_s = 0.0  # the parent's own CPU seconds (last sample)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            try:
                rss = self.proc.memory_info().rss
                kids = sum(c.memory_info().rss for c in self.proc.children(recursive=True))
                cpu = self.proc.cpu_times()
                self.parent_cpu_s = cpu.user + cpu.system
            except psutil.Error:
                break
            if rss:  # NOTE: 0 once the process is a zombie
                self.parent.append((time.perf_counter() - t0, rss))
            self.workers_peak = max(self.workers_peak, kids)
            time.sleep(self.every_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def stored(out: Path) -> int:
    d = out / "results"
    return sum(1 for _ in d.iterdir()) if d.is_dir() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=1000)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--summary-only", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvsim-sweep-bench-") as tmp:
        root = Path(tmp)
        spec = root / "sweep.yaml"
        seeds = ", ".join(str(s) for s in range(a.points))
        spec.write_text(f"name: week-seeds\nbase: quickstart\nfactors:\n  seed: [{seeds}]\n"
                        f"  workload.days: [{a.days:g}]\n")
        out = root / "out"
        cmd = [sys.executable, "-m", "kvsim", "sweep", str(spec), "-o", str(out), "-j",
               str(a.jobs), "--no-progress", "--no-report"] + \
            (["--summary-only"] if a.summary_only else [])
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        marks: list[tuple[int, int]] = []  # (points stored, parent RSS) as they grow
        with RssWatch(proc.pid) as watch:
            while proc.poll() is None:
                time.sleep(0.5)
                if watch.parent:
                    marks.append((stored(out), watch.parent[-1][1]))
        wall = time.perf_counter() - t
        err = proc.stderr.read() if proc.stderr else ""
        if proc.returncode:
            sys.exit(f"kvsim sweep failed ({proc.returncode}): {err[-2000:]}")
        n = stored(out)
    peak = max(r for _, r in watch.parent)
    mb = 2**20
    print(f"== {a.points}-point sweep of quickstart (family-4, llama.cpp), {a.days:g} day(s), "
          f"{a.jobs} workers{', summary only' if a.summary_only else ''}")
    print(f"   wall {wall:.1f} s ({wall / max(n, 1) * 1000:.0f} ms a point, {n} stored), "
          f"parent peak RSS {peak / mb:.0f} MB, workers' peak RSS {watch.workers_peak / mb:.0f} "
          f"MB together")
    cpu = watch.parent_cpu_s
    print(f"   the parent's own CPU: {cpu:.1f} s ({cpu / max(n, 1) * 1000:.0f} ms a point: "
          "imports, resolving the points, storing each point's Results)")
    tenth = [r for k, r in marks if k >= max(n // 10, 1)]
    if tenth and n > 10:
        growth = (marks[-1][1] - tenth[0]) / max(marks[-1][0] - max(n // 10, 1), 1)
        print(f"   parent RSS at {max(n // 10, 1)} points {tenth[0] / mb:.0f} MB, at "
              f"{marks[-1][0]} points {marks[-1][1] / mb:.0f} MB: {growth / 1024:+.1f} KB a point")


if __name__ == "__main__":
    main()
