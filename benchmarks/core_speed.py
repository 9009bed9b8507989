"""The engine core's speed on the three reference cases, against a kept previous core.

Cases (each a fresh process per run, so one case's heap cannot slow the next):

- ``chat``: the 1,000-request open-loop chat trace of ``open_loop_chat.py`` on vLLM
  (RTX 4090);
- ``house``: the household-week, ``quickstart`` (family-4 on llama.cpp) for 7 days;
- ``mooncake``: the Mooncake (FAST'25) synthetic trace (3,320 requests after the
  prompts over the model's context are skipped) on vLLM (H100), as ``mooncake.py``.

For each case it prints the engine seconds (``Engine.run``, wall and CPU), the whole
``kvsim.api.simulate`` seconds, simulated seconds and requests per wall second of the
engine, the run's peak RSS, and the seconds of a whole ``kvsim simulate --no-report``
process on the same sessions (written as a kvsim trace first; imports, reading and
saving included): min and median over the runs.
With ``--reference DIR`` (a checkout or ``git archive`` of the previous core: the
folder holding its ``kvsim`` package) every run is repeated with that code,
interleaved (new, reference, new, …), and the median speed-up is printed: both are
measured under the same load.

    python benchmarks/core_speed.py                                  # this core, 5 runs
    git archive <old-commit> kvsim hardware_profiles workloads | tar -x -C /tmp/old-core
    python benchmarks/core_speed.py --reference /tmp/old-core --runs 7

Targets (issue 24, median, this 2-core machine): chat engine ≤ 0.06 s and whole
``kvsim simulate`` ≤ 0.4 s; household-week engine ≤ 0.08 s; Mooncake engine ≤ 1.0 s.
NOTE: the machine is shared with other work; its load is printed with the figures
(``psutil.getloadavg``) and the CPU seconds are less sensitive to it than wall seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
MOONCAKE = "/work/shared/traces/mooncake-fast25/synthetic_trace.jsonl"
MOON_CONTEXT = 131072
CASES = ("chat", "house", "mooncake")
MOON_SCENARIO = {"name": "mooncake", "gpu": "h100-sxm5-80gb", "model": "llama-3.1-8b",
                 "weights": "bf16", "engine": {"preset": "vllm", "context_tokens": MOON_CONTEXT}}


# -- one run (a child process) ---------------------------------------------------------
def _use_root(root: str | None) -> None:
    """Import kvsim from ``root`` (the reference core) instead of this checkout."""
    if root:
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
        sys.path.insert(0, root)
    sys.path.insert(0, str(HERE))


def _case(name: str, trace: str):
    from kvsim.scenario import load_scenario, resolve_scenario

    if name == "chat":
        from open_loop_chat import chat_sessions

        ss = chat_sessions(0)
        return load_scenario("family-4-vllm", []), lambda: ss
    if name == "house":
        return load_scenario("quickstart", ["workload.days=7"]), lambda: None
    from kvsim.workload.importers import import_trace

    sc = resolve_scenario({**MOON_SCENARIO, "workload": {}})
    _, it = import_trace("mooncake", trace)
    ss = [s for s in it if sum(t.input_tokens + t.output_tokens + t.tool_tokens
                               + sum(p.tokens for p in t.prefix) for t in s.turns)
          + s.system_prompt_tokens < MOON_CONTEXT]
    return sc, lambda: ss


def child(name: str, root: str | None, trace: str) -> None:
    _use_root(root)
    from _common import peak_rss_mb

    from kvsim.api import simulate
    from kvsim.core import engine as engine_mod

    sc, sessions = _case(name, trace)
    short = sc.model_copy(update={"sim": sc.sim.model_copy(update={"max_sim_time_s": 60.0})})
    simulate(short, sessions=sessions())  # NOTE: one-off imports and caches, not timed
    timed: dict[str, float] = {}
    orig = engine_mod.Engine.run

    def run(eng, ss):  # type: ignore[no-untyped-def]
        t, c = time.perf_counter(), time.process_time()
        try:
            return orig(eng, ss)
        finally:
            timed["engine_s"] = time.perf_counter() - t
            timed["engine_cpu_s"] = time.process_time() - c
    engine_mod.Engine.run = run  # type: ignore[method-assign]
    t = time.perf_counter()
    res = simulate(sc, sessions=sessions())
    timed["simulate_s"] = time.perf_counter() - t
    s = res.summary
    timed.update(sim_s=float(s["sim_time_s"]), requests=int(s["requests"]),
                 rss_mb=peak_rss_mb(),
                 ttft_p95_s=float(s["ttft_p95_s"]), itl_p95_s=float(s["itl_p95_s"]))
    print("RESULT " + json.dumps(timed))


def whole_process(root: str | None, case: str, files: dict[str, Path]) -> float:
    """Seconds of a whole ``kvsim simulate --no-report`` process on ``case`` (its sessions
    written as a kvsim trace beforehand, so the process reads them as a user's would)."""
    env = dict(os.environ)
    if root:
        env["PYTHONPATH"] = root
    scenario, sets = {"chat": ("family-4-vllm", ["workload.preset=null",
                                                  f"workload.trace={files.get('chat')}"]),
                      "house": ("quickstart", ["workload.days=7"]),
                      "mooncake": (str(files.get("mooncake.yaml")), [])}[case]
    with tempfile.TemporaryDirectory() as out:
        code = ("import sys\n" + (f"sys.meta_path[:] = [f for f in sys.meta_path if "
                                   f"'editable' not in repr(f)]\nsys.path.insert(0, {root!r})\n"
                                   if root else "")
                + "from kvsim.cli import main\nsys.argv = ['kvsim'] + sys.argv[1:]\nmain()")
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, "simulate", scenario,
                        *(x for s in sets for x in ("--set", s)), "-o", out, "--no-report"],
                       check=True, capture_output=True, env=env)
        return time.perf_counter() - t


# -- the driver ------------------------------------------------------------------------
def _spawn(name: str, root: str | None, trace: str) -> dict[str, float]:
    r = subprocess.run([sys.executable, __file__, "--child", name, "--root", root or "",
                        "--trace", trace], capture_output=True, text=True, check=False)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode or not line:
        sys.exit(f"{name} ({root or 'this core'}) failed:\n{r.stderr[-3000:]}")
    return json.loads(line[-1].removeprefix("RESULT "))


def _traces(tmp: Path, cases: list[str], trace: str) -> dict[str, Path]:
    """The chat sessions and the kept Mooncake sessions as kvsim traces (with the
    Mooncake scenario as a YAML file), for the whole-process runs."""
    import yaml

    sys.path.insert(0, str(HERE))
    from open_loop_chat import chat_sessions

    from kvsim.workload.io import write_trace
    from kvsim.workload.schema import TraceMeta

    files: dict[str, Path] = {}
    if "chat" in cases:
        files["chat"] = tmp / "chat.jsonl"
        write_trace(files["chat"], chat_sessions(0), TraceMeta(source="open_loop_chat.py"))
    if "mooncake" in cases:
        _, sessions = _case("mooncake", trace)
        files["mooncake"] = tmp / "mooncake.jsonl"
        write_trace(files["mooncake"], sessions(), TraceMeta(source="mooncake.py"))
        files["mooncake.yaml"] = tmp / "mooncake.yaml"
        files["mooncake.yaml"].write_text(yaml.safe_dump(
            {**MOON_SCENARIO, "workload": {"trace": str(files["mooncake"])}}))
    return files


def _line(label: str, runs: list[dict[str, float]]) -> str:
    eng = [r["engine_s"] for r in runs]
    cpu = [r["engine_cpu_s"] for r in runs]
    sim = [r["simulate_s"] for r in runs]
    r0, med = runs[0], statistics.median(eng)
    return (f"   {label:10s} engine {min(eng):.3f} / {med:.3f} s (min / median wall; CPU "
            f"{statistics.median(cpu):.3f} s), simulate() {statistics.median(sim):.3f} s, "
            f"{r0['sim_s'] / med:,.0f} sim-s/wall-s, {r0['requests'] / med:,.0f} requests/s, "
            f"peak RSS {max(r['rss_mb'] for r in runs):.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reference", default=None, help="folder holding the previous core's kvsim")
    ap.add_argument("--trace", default=MOONCAKE, help="the Mooncake synthetic trace")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--root", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.root or None, a.trace)
        return
    cases = [c for c in a.cases.split(",") if c]
    if "mooncake" in cases and not Path(a.trace).is_file():
        print(f"(no Mooncake trace at {a.trace}: that case is skipped)")
        cases.remove("mooncake")
    roots: list[str | None] = [None] + ([str(Path(a.reference).resolve())] if a.reference else [])
    label = {None: "this core", **({roots[-1]: "reference"} if a.reference else {})}
    load0 = psutil.getloadavg()[0]
    got: dict[tuple[str, str | None], list[dict[str, float]]] = {}
    whole: dict[tuple[str, str | None], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = _traces(Path(tmp), cases, a.trace)
        for _, case, root in itertools.product(range(a.runs), cases, roots):  # interleaved
            got.setdefault((case, root), []).append(_spawn(case, root, a.trace))
            whole.setdefault((case, root), []).append(whole_process(root, case, files))
    print(f"load average {load0:.1f} at the start, {psutil.getloadavg()[0]:.1f} at the end "
          f"(2 cores, shared): figures are min / median of {a.runs} interleaved runs")
    for case in cases:
        print(f"== {case}")
        for root in roots:
            print(_line(label[root], got[(case, root)]))
            w = whole[(case, root)]
            print(f"   {'':10s} whole `kvsim simulate --no-report` process: {min(w):.3f} / "
                  f"{statistics.median(w):.3f} s (min / median)")
        if a.reference:
            new = statistics.median(r["engine_s"] for r in got[(case, None)])
            old = statistics.median(r["engine_s"] for r in got[(case, roots[1])])
            new_cpu = statistics.median(r["engine_cpu_s"] for r in got[(case, None)])
            old_cpu = statistics.median(r["engine_cpu_s"] for r in got[(case, roots[1])])
            print(f"   speed-up of the engine against the reference: {old / new:.2f}x wall, "
                  f"{old_cpu / new_cpu:.2f}x CPU (medians)")


if __name__ == "__main__":
    main()
