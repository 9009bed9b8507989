"""Shared measurement for the benchmark scripts (not tests; they print figures).

``measure`` runs one scenario in ``fast`` and (optionally) ``step`` fidelity in the
same process and prints, per mode: wall seconds of the whole ``kvsim.api.simulate``
call and of the engine run alone, simulated seconds per wall second, engine steps
simulated per wall second, SimPy events processed per second, and the fast/step
ratio of both wall times.  Peak RSS (``resource.getrusage``) is the process
high-water mark, so it is printed after the fast run (taken first).

NOTE: portable: ``resource`` (POSIX) is imported where it is used, psutil's peak working
set stands in on Windows.

The fast run also times its decode stretches (``FastForward._segment``: step
times, tokens, blocks of the skipped steps).  The rest of its engine time —
sessions, admission, prefill and other inline steps, completions, policies,
records, SimPy — is work the step mode does too, so ``step engine / (fast engine −
stretches)`` bounds the fast/step ratio that any faster stretch code could reach.

NOTE: a small warm-up run first pays the one-off imports (pandas, pyarrow, policies),
which would otherwise be charged to whichever mode runs first; the fast mode is then
timed ``repeat`` times and the best run is reported (the machine is shared), the
step mode once (it is the slow reference).  Workload generation, policy set-up and
table building are the same in both modes, so the *engine* ratio is the one that
compares the two fidelities; the whole-run ratio is printed too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, Self

from kvsim.api import simulate
from kvsim.core import engine as engine_mod
from kvsim.core.fastforward import FastForward
from kvsim.scenario import Scenario
from kvsim.workload.schema import Session


def peak_rss_mb(children: bool = False) -> float | None:
    """Peak RSS in MiB of this process (or of its waited-for children); None where the
    platform keeps no such figure (children on Windows)."""
    try:
        import resource
    except ImportError:  # Windows: the working set's peak, this process only
        import psutil

        return None if children else psutil.Process().memory_info().peak_wset / 2**20
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    rss = resource.getrusage(who).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


class _EngineTimer:
    """Times ``Engine.run`` (the simulation proper) inside ``simulate``, and the decode
    stretches inside it; counts events."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.stretch_s = 0.0
        self.events = 0
        self._orig = engine_mod.Engine.run
        self._orig_segment = FastForward._segment

    def __enter__(self) -> Self:
        orig, timer, segment = self._orig, self, self._orig_segment

        def timed_segment(ff: FastForward, *args: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return segment(ff, *args, **kw)
            finally:
                timer.stretch_s += time.perf_counter() - t
        FastForward._segment = timed_segment  # type: ignore[method-assign]

        def run(eng: Any, sessions: Iterable[Session]) -> float:
            env_step = eng.env.step
            count = [0]

            def step() -> None:
                count[0] += 1
                env_step()
            eng.env.step = step  # type: ignore[method-assign]
            t = time.perf_counter()
            try:
                return orig(eng, sessions)
            finally:
                timer.seconds = time.perf_counter() - t
                timer.events = count[0]
        engine_mod.Engine.run = run  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        engine_mod.Engine.run = self._orig  # type: ignore[method-assign]
        FastForward._segment = self._orig_segment  # type: ignore[method-assign]


def run_once(scenario: Scenario, sessions: Callable[[], Iterable[Session]] | None,
             fidelity: str) -> dict[str, float]:
    sc = scenario.model_copy(update={"sim": scenario.sim.model_copy(
        update={"fidelity": fidelity})})
    src = sessions() if sessions is not None else None
    with _EngineTimer() as timer:
        t = time.perf_counter()
        res = simulate(sc, sessions=src)
        wall = time.perf_counter() - t
    s = res.summary
    return {"wall_s": wall, "engine_s": timer.seconds, "stretch_s": timer.stretch_s,
            "events": timer.events,
            "sim_s": s["sim_time_s"],
            "steps": s["steps"], "requests": s["requests"], "output_tokens": s["output_tokens"],
            "ttft_p95_s": s["ttft_p95_s"], "itl_p95_s": s["itl_p95_s"]}


def measure(label: str, scenario: Scenario,
            sessions: Callable[[], Iterable[Session]] | None = None, step: bool = True,
            repeat: int = 3, warmup: Callable[[], Iterable[Session]] | None = None) -> None:
    print(f"== {label}")
    run_once(scenario.model_copy(update={"sim": scenario.sim.model_copy(
        update={"max_sim_time_s": 60.0})}), warmup or sessions, "fast")  # imports
    fast = [run_once(scenario, sessions, "fast") for _ in range(max(repeat, 1))]
    rows = {"fast": min(fast, key=lambda r: r["wall_s"])}
    print(f"   peak RSS after fast run: {peak_rss_mb():.0f} MB")
    if step:
        rows["step"] = run_once(scenario, sessions, "step")
    for mode, r in rows.items():
        print(f"   {mode:4s}: wall {r['wall_s']:.3f} s (engine {r['engine_s']:.3f} s), "
              f"sim {r['sim_s']:.0f} s → {r['sim_s'] / r['wall_s']:,.0f} sim-s/wall-s, "
              f"{r['steps'] / r['engine_s']:,.0f} steps/s, "
              f"{r['events'] / r['engine_s']:,.0f} events/s ({r['events']} SimPy events), "
              f"{r['requests']} requests, {r['output_tokens']} output tokens, "
              f"p95 TTFT {r['ttft_p95_s']:.4f} s, p95 ITL {r['itl_p95_s']:.5f} s")
    if step:
        f, s = rows["fast"], rows["step"]
        same = all(abs(f[k] - s[k]) <= 1e-9 * max(abs(s[k]), 1e-12) for k in
                   ("sim_s", "ttft_p95_s", "itl_p95_s")) and f["steps"] == s["steps"]
        print(f"   fast/step speed-up: {s['wall_s'] / f['wall_s']:.1f}x whole run, "
              f"{s['engine_s'] / f['engine_s']:.1f}x engine; results agree: {same}")
        shared = f["engine_s"] - f["stretch_s"]
        print(f"   fast engine: {f['stretch_s']:.3f} s in decode stretches, {shared:.3f} s in "
              f"work both modes do (sessions, admission, inline steps, completions, records, "
              f"SimPy); with free stretches the engine speed-up would be at most "
              f"{s['engine_s'] / shared:.1f}x")
    print(f"   peak RSS: {peak_rss_mb():.0f} MB")
