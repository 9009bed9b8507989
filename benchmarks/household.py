"""Household benchmark: ``family-4`` for N days (``quickstart`` scenario: llama.cpp).

    python benchmarks/household.py --days 1          # household-day, fast and step
    python benchmarks/household.py --days 7          # household-week
    python benchmarks/household.py --days 30 --no-step   # household-month (peak RSS)

Targets (docs/speed.md): week ≤ 2 s wall; fast ≥ 50× step on a day; month ≤ 400 MB RSS.
"""

from __future__ import annotations

import argparse

from _common import measure

from kvsim.scenario import load_scenario


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--scenario", default="quickstart", help="bundled scenario or YAML path")
    ap.add_argument("--no-step", action="store_true", help="skip the per-step reference run")
    ap.add_argument("--repeat", type=int, default=None,
                    help="fast runs, best reported (default 3 up to a week, else 1)")
    a = ap.parse_args()
    sc = load_scenario(a.scenario, [f"workload.days={a.days:g}"])
    repeat = a.repeat if a.repeat is not None else (3 if a.days <= 7 else 1)
    measure(f"{a.scenario}, family-4, {a.days:g} day(s)", sc, step=not a.no_step,
            repeat=repeat)


if __name__ == "__main__":
    main()
