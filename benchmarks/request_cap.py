"""Request cap benchmark: a trace larger than one run may hold, through ``kvsim simulate``.

    python benchmarks/request_cap.py                 # cap + 1 sessions, cut by time
    python benchmarks/request_cap.py --sessions 10000000 --refused   # refused at once

Writes a trace of one-turn chat sessions 50 ms apart into a temporary directory and
runs the README's ``kvsim simulate`` on it in a child process (the ``quickstart``
scenario, report included).  The default trace holds one session more than
:data:`kvsim.metrics.records.MAX_REQUESTS` and the run is cut by ``sim.max_sim_time_s``
after the last arrival (so it is not refused up front): it must stop at the cap with
exit code 2, one error line and every result file written.  Prints wall seconds, the
child's peak RSS (the ~400 MB bound in docs/speed.md) and what was saved.

With ``--refused`` the run is not cut by time and the trace is larger than the cap:
it must be refused before simulating anything (the sessions are only counted).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import peak_rss_mb

from kvsim.metrics.records import MAX_REQUESTS

GAP_S = 0.05


def write_trace(path: Path, sessions: int) -> None:
    with path.open("w") as fh:
        fh.write(json.dumps({"trace_meta": {"source": "benchmark", "schema_version": 1}}) + "\n")
        for i in range(sessions):
            fh.write(json.dumps({"session_id": f"s{i}", "turns": [
                {"start_s": round(i * GAP_S, 6), "input_tokens": 20, "output_tokens": 3}]})
                     + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=MAX_REQUESTS + 1)
    ap.add_argument("--refused", action="store_true",
                    help="do not cut the run by time: a trace over the cap is refused at once")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace, out = Path(tmp) / "big.jsonl", Path(tmp) / "out"
        t = time.perf_counter()
        write_trace(trace, a.sessions)
        print(f"wrote {a.sessions:,} sessions ({trace.stat().st_size / 2**20:.0f} MiB) "
              f"in {time.perf_counter() - t:.1f} s; cap {MAX_REQUESTS:,} requests")
        # NOTE: the preset is unset first: a later workload.preset=null unsets the trace too
        cmd = [sys.executable, "-m", "kvsim", "simulate", "quickstart",
               "--set", "workload.preset=null", "--set", f"workload.trace={trace}",
               "-o", str(out)]
        if not a.refused:
            cmd += ["--set", f"sim.max_sim_time_s={a.sessions * GAP_S + 60:g}"]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t
        rss_mb = peak_rss_mb(children=True) or float("nan")
        err = proc.stderr.strip().splitlines()
        print(f"exit code {proc.returncode} after {wall:.1f} s, peak RSS {rss_mb:.0f} MB")
        print(f"stderr ({len(err)} line{'s' * (len(err) != 1)}): {err[-1] if err else ''}")
        if (out / "summary.json").is_file():
            s = json.loads((out / "summary.json").read_text())
            files = sorted(p.name for p in out.iterdir())
            print(f"saved: {s['requests']:,} requests, stopped at {s.get('stopped_at_s')} s; "
                  f"{', '.join(files)}")
        else:
            print("saved: nothing")


if __name__ == "__main__":
    main()
