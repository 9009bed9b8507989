"""What timing noise costs: a scenario at jitter 0 (fast and step) and jittered (every step).

    python benchmarks/jitter.py                     # quickstart, one household-day
    python benchmarks/jitter.py --days 7 --cv 0.1

Prints, per run, wall seconds of ``kvsim.api.simulate``, requests, prompt-cache reuse
and TTFT p95.  A jittered run simulates every step (docs/scenarios.md, "Timing noise"),
so its wall time is the step run's plus the noise draws.  Not a test.
"""

from __future__ import annotations

import argparse
import time

from kvsim.api import simulate
from kvsim.scenario import load_scenario


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--cv", type=float, default=0.05, help="latency.jitter_cv of the noisy run")
    ap.add_argument("--scenario", default="quickstart", help="bundled scenario or YAML path")
    a = ap.parse_args()
    days = [f"workload.days={a.days:g}"]
    simulate(load_scenario(a.scenario, ["workload.days=0.05"]))  # warm-up: the imports
    for label, sets in (("jitter 0, fast", ["sim.fidelity=fast"]),
                        ("jitter 0, step", ["sim.fidelity=step"]),
                        (f"jitter {a.cv:g} (every step)", [f"latency.jitter_cv={a.cv}"])):
        sc = load_scenario(a.scenario, days + sets)
        t = time.perf_counter()
        s = simulate(sc).summary
        wall = time.perf_counter() - t
        print(f"{label:<26} {wall:7.2f} s wall  {s['requests']:6d} requests  reuse "
              f"{100 * s['prefix_hit_rate']:5.1f} %  TTFT p95 {1000 * s['ttft_p95_s']:7.1f} ms")


if __name__ == "__main__":
    main()
