"""Whole-process time of the light commands: ``kvsim --help`` and ``kvsim fit``.

Each command is a fresh process (``subprocess``), run interleaved with a bare
``python -c pass`` (the interpreter's own start-up, for scale) ``--repeat`` times;
min and median wall seconds are printed, and the heavy modules each command ended
with (none expected: kvsim/cli/__init__.py reads command help from the sources).

    python benchmarks/startup.py              # target: kvsim --help ≤ 0.25 s (median)

NOTE: the machine is shared: a loaded machine stretches every figure (compare with
the bare interpreter printed beside them).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

HEAVY = ("pandas", "pyarrow", "plotly", "scipy", "simpy")
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "kvsim --help": [sys.executable, "-m", "kvsim", "--help"],
    "kvsim fit": [sys.executable, "-m", "kvsim", "fit", "--gpu", "rtx-4090",
                  "--model", "llama-3.1-8b"],
}
_PROBE = ("import sys; sys.argv = ['kvsim', *{args!r}]\nfrom kvsim.cli import main\n"
          "try:\n    main()\nexcept SystemExit:\n    pass\n"
          "print(sorted(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)")


def heavy_imports(args: list[str]) -> str:
    r = subprocess.run([sys.executable, "-c", _PROBE.format(args=args, heavy=HEAVY)],
                       capture_output=True, text=True, check=False)
    return r.stderr.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    a = ap.parse_args()
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(a.repeat):  # NOTE: interleaved, so a burst of load hits every case
        for name, cmd in CASES.items():
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            times[name].append(time.perf_counter() - t)
    for name, ts in times.items():
        mods = heavy_imports(CASES[name][3:]) if name.startswith("kvsim") else ""
        print(f"{name:15s} min {min(ts):.3f} s, median {statistics.median(ts):.3f} s "
              f"({a.repeat} runs)" + (f"; heavy modules imported: {mods}" if mods else ""))


if __name__ == "__main__":
    main()
