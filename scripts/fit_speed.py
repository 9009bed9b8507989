#!/usr/bin/env python3
"""Fit kvsim's backend speed constants on published measurements; print LODO errors.

    python scripts/fit_speed.py [--measurements FOLDER ...] \
        -o hardware_profiles/speed/constants.yaml [--no-lodo]

Reads every file in the measurements folders (default: docs/reference/measurements, the
shared files; docs/reference/measurements-sweeps, depth sweeps on GDDR cards; and
docs/reference/measurements-pascal, the Tesla P40 rows that fit ``c_dp4a``;
docs/reference/measurements-prs and -community are held-out sets, checked with
``kvsim validate``) the way ``kvsim validate`` does, fits
:class:`kvsim.latency.backend.SpeedConstants` (kvsim.validate.fit: scipy least squares
on log errors), then refits once per device without it and predicts it
(leave-one-device-out).  Prints both error tables per (kind, backend, metric) and
writes the constants with the LODO summary and the row count they were fitted on.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import numpy as np
import yaml

from kvsim.metrics.summary import PERCENTILE_METHOD
from kvsim.validate.fit import fit_constants, log_errors, make_row
from kvsim.validate.lodo import leave_one_device_out
from kvsim.validate.predict import setup_for
from kvsim.validate.records import Skipped
from kvsim.validate.run import Validation, read_files

REPO = Path(__file__).resolve().parents[1]
MEASUREMENTS = [REPO / "docs" / "reference" / "measurements",
                REPO / "docs" / "reference" / "measurements-sweeps",
                REPO / "docs" / "reference" / "measurements-pascal"]


def summary_of(rows: list, errs: dict[str, float]) -> list[dict]:
    v = Validation()
    for r in rows:
        if r.m.id in errs:
            v.rows.append({"kind": r.m.kind, "backend": r.m.backend, "metric": r.m.metric,
                           "rel_err": math.exp(errs[r.m.id]) - 1.0})
    return v.summary()


def signed_spread(rows: list, errs: dict[str, float]) -> dict[tuple, dict[str, float]]:
    """Per (kind, backend, metric): the 10th and 90th percentiles of the signed relative
    error (kvsim's speed over the measured, minus 1) — the band ``kvsim simulate`` reruns a
    scenario at (kvsim.latency.speed_band)."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r.m.id in errs:
            groups.setdefault((r.m.kind, r.m.backend, r.m.metric), []).append(
                math.expm1(errs[r.m.id]))
    return {key: {f"p{q}_rel_err": round(float(np.quantile(e, q / 100,
                                                             method=PERCENTILE_METHOD)), 4)
                  for q in (10, 90)} for key, e in groups.items()}


def show(title: str, summary: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'kind':9} {'backend':7} {'metric':7} {'n':>4} {'median|e|':>10} {'p90|e|':>8} "
          f"{'median e':>9}")
    for s in summary:
        print(f"{s['kind']:9} {s['backend']:7} {s['metric']:7} {s['n']:4d} "
              f"{100 * s['median_abs_rel_err']:9.1f}% {100 * s['p90_abs_rel_err']:7.1f}% "
              f"{100 * s['median_rel_err']:+8.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measurements", type=Path, nargs="+", default=MEASUREMENTS,
                    help="folders whose *.csv files are fitted on (default: "
                    "docs/reference/measurements, the shared files, "
                    "docs/reference/measurements-sweeps and "
                    "docs/reference/measurements-pascal; "
                    "docs/reference/measurements-prs and -community are held out: "
                    "kvsim validate them)")
    ap.add_argument("-o", "--out", type=Path, default=REPO / "hardware_profiles" / "speed"
                    / "constants.yaml")
    ap.add_argument("--no-lodo", action="store_true", help="skip leave-one-device-out")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                    help="processes for the leave-one-device-out folds (default: every CPU)")
    ap.add_argument("--rows", type=Path, help="write every row's in-sample and LODO "
                    "relative error here (CSV)")
    args = ap.parse_args()
    files = sorted(f for folder in args.measurements for f in folder.glob("*.csv"))
    meas, skipped, problems = read_files(files)
    rows, unusable = [], list(skipped)
    for m in meas:
        s = setup_for(m)
        if isinstance(s, Skipped):
            unusable.append(s)
        else:
            rows.append(make_row(m, s))
    devices = sorted({r.device for r in rows})
    print(f"{len(rows)} rows on {len(devices)} devices; {len(unusable)} not predictable; "
          f"problems: {problems or 'none'}")
    t0 = time.perf_counter()
    full = fit_constants(rows, fitted_on=f"{len(rows)} rows, {len(devices)} devices "
                         f"({', '.join(f.name for f in files)})")
    print(f"fit: {time.perf_counter() - t0:.1f} s")
    fitted = log_errors(rows, full)
    show("in-sample (all devices in the fit)",
         summary_of(rows, {r.m.id: e for r, e in zip(rows, fitted)}))
    out = full.model_dump()
    if not args.no_lodo:
        t0 = time.perf_counter()
        lodo = leave_one_device_out(rows, full, jobs=args.jobs)
        print(f"\nleave-one-device-out: {time.perf_counter() - t0:.1f} s")
        summ = summary_of(rows, lodo)
        show("leave-one-device-out (each device predicted by a fit without it)", summ)
        spread = signed_spread(rows, lodo)
        out["errors"] = {f"{s['kind']}/{s['backend']}/{s['metric']}":
                         {**{k: round(float(s[k]), 4) for k in
                             ("n", "median_abs_rel_err", "p90_abs_rel_err", "median_rel_err")},
                          **spread[(s["kind"], s["backend"], s["metric"])]}
                         for s in summ}
    if args.rows:
        _write_rows(args.rows, rows, fitted, {} if args.no_lodo else lodo)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    read = " and ".join(_shown(f) for f in args.measurements)
    header = (f"# Written by scripts/fit_speed.py from {read}; do not edit by hand: re-run "
              "the script.\n# errors: leave-one-device-out, per kind/backend/metric.\n")
    args.out.write_text(header + yaml.safe_dump(_rounded(out), sort_keys=False),
                        encoding="utf-8")
    print(f"\nwrote {args.out}")


def _write_rows(path: Path, rows: list, fitted, lodo: dict[str, float]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        fh.write("id,kind,backend,metric,gpu,model,weights,n_prompt,n_gen,depth,batch,"
                 "measured_tps,rel_err_fit,rel_err_lodo\n")
        for r, e in zip(rows, fitted):
            m, s = r.m, r.setup
            lo = f"{math.expm1(lodo[m.id]):.4f}" if m.id in lodo else ""
            fh.write(f"{m.id},{m.kind},{m.backend},{m.metric},{s.gpu.name},{s.model.name},"
                     f"{s.weight_format},{m.n_prompt},{m.n_gen},{m.depth},{m.batch},"
                     f"{m.value},{math.expm1(e):.4f},{lo}\n")


def _shown(folder: Path) -> str:
    """A measurements folder as the constants' header names it (repository-relative)."""
    try:
        return folder.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return folder.as_posix()


def _rounded(x: object) -> object:
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


if __name__ == "__main__":
    main()
