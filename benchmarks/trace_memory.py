"""Peak RSS of ``kvsim trace inspect``, ``trace sample`` and ``trace import`` on generated
traces of 1 M and 4 M requests, and the ratio: a reader that streams stays flat (≈ 1.0),
one that loads the trace grows with it (≈ 4).  Prints figures; not a test.

Each command runs in a child process of its own; its peak is the child's high-water
mark (``VmHWM``, Linux).  The traces come from the generators of tests/workload/test_trace_memory.py
(kvsim traces as Parquet written by pyarrow: open-loop sessions of 20 turns; an Azure CSV
for the import), written to a temporary folder.

    python benchmarks/trace_memory.py            # 1 M and 4 M requests (a few minutes)
    python benchmarks/trace_memory.py 250000 1000000
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# NOTE: the child's own high-water mark (Linux VmHWM): ru_maxrss would carry this
# process's peak over into the child (Linux keeps it across fork and exec)
_CHILD = ("import sys\nfrom kvsim.cli import main\ntry:\n    main(sys.argv[1:])\n"
          "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
          "print(next(x for x in open('/proc/self/status') if x.startswith('VmHWM')).split()[1])")


def _generators():  # NOTE: the test's generators, so both measure the same traces
    spec = importlib.util.spec_from_file_location(
        "trace_memory_test", ROOT / "tests" / "workload" / "test_trace_memory.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_big_trace, mod.write_azure_csv


def peak_mib(*argv: str) -> float:
    """The peak RSS (MiB) of ``kvsim ARGV`` in a fresh child."""
    done = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True,
                          text=True, check=True)
    return int(done.stdout.split()[-1]) / 1024


def main(sizes: list[int]) -> None:
    write_big_trace, write_azure_csv = _generators()
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for n in sizes:
            trace, csv = d / f"t{n}.parquet", d / f"a{n}.csv"
            write_big_trace(trace, n)
            write_azure_csv(csv, n)
            for name, argv in (
                    ("trace inspect", ["trace", "inspect", str(trace), "--json"]),
                    ("trace sample --sessions 1000", ["trace", "sample", str(trace),
                                                      "--sessions", "1000", "-o",
                                                      str(d / "s.parquet")]),
                    ("trace import azure", ["trace", "import", "azure", str(csv), "-o",
                                            str(d / "i.parquet")])):
                rows.setdefault(name, []).append(peak_mib(*argv))
            trace.unlink()
            csv.unlink()
    head = "".join(f"{n / 1e6:>10g} M" for n in sizes)
    print(f"{'peak RSS (MiB)':<30}{head}   ratio last/first")
    for name, peaks in rows.items():
        cells = "".join(f"{p:>12.0f}" for p in peaks)
        print(f"{name:<30}{cells}   {peaks[-1] / peaks[0]:.2f}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1_000_000, 4_000_000])
