"""Same results to the bit: this core against a kept reference core, on many cases.

A change to the engine core that is meant to be a pure speed-up (issue 24) must leave
every table of every run unchanged.  This script runs each case below in a fresh
process with this checkout's ``kvsim`` and with a reference checkout's (``--reference
DIR``: a ``git archive`` of the previous core, as for ``core_speed.py``), and compares
a digest of every Results table (requests, itl, steps, memory, events: values, column
names and dtypes, row order) and of the summary.  Cases cover both allocators (paged:
vLLM, SGLang; slots: llama.cpp, Ollama), both fidelities, prefix caching on and off,
preemption under a small KV pool, a sliding-window model (hybrid KV groups), the
bundled policies (host tier, recoverable eviction, idle offload), the open-loop chat
trace and the first Mooncake sessions (long shared prefixes).

    git archive <old-commit> kvsim hardware_profiles workloads | tar -x -C /tmp/old-core
    python benchmarks/exactness.py --reference /tmp/old-core          # every case
    python benchmarks/exactness.py --reference /tmp/old-core --cases chat,moon-400

Prints one line a case (``same`` or the tables that differ) and exits 1 when any case
differs.  NOTE: each case runs once per core; nothing here is timed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from core_speed import MOON_SCENARIO, MOONCAKE  # NOTE: the same trace and scenario

HERE = Path(__file__).resolve().parent
_DAY = ["workload.days=1"]
_SMALL_POOL = ["engine.kv_cache_memory_bytes=1 GiB", "engine.context_tokens=8192"]
CASES: dict[str, tuple[str, list[str]]] = {
    # name: (bundled scenario, --set overrides); each also runs at step fidelity (":step")
    "quickstart": ("quickstart", ["workload.days=3"]),
    "quickstart-1slot": ("quickstart", [*_DAY, "engine.parallel=1"]),
    "ollama": ("family-4-ollama", _DAY),
    "recoverable": ("family-4-recoverable", _DAY),
    "idle-offload": ("family-4-idle-offload", _DAY),
    "vllm": ("family-4-vllm", ["workload.days=2"]),
    "vllm-nocache": ("family-4-vllm", [*_DAY, "engine.enable_prefix_caching=false"]),
    "chat-preempt": ("family-4-vllm", _SMALL_POOL),  # ~300 preemptions
    "vllm-offload": ("family-4-vllm-offload", _DAY),
    "vllm-gemma": ("family-4-vllm", [*_DAY, "model=gemma-3-4b"]),
    "sglang": ("family-4-vllm", [*_DAY, "engine.preset=sglang"]),
    "chat": ("family-4-vllm", []),
    "moon-400": ("", []),
}
STEP_TOO = ("quickstart", "quickstart-1slot", "ollama", "recoverable", "vllm", "vllm-nocache",
            "chat-preempt", "vllm-gemma", "sglang")


def _digest(res) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """One SHA-256 per table (pandas' row hashes, column names, dtypes) and the summary's."""
    import pandas as pd

    out = {}
    for name in ("requests", "itl", "steps", "memory", "events"):
        df = res.table(name)
        h = hashlib.sha256(repr([list(df.columns), [str(t) for t in df.dtypes]]).encode())
        if len(df):
            h.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
        out[name] = h.hexdigest()[:16]
    out["summary"] = hashlib.sha256(
        json.dumps(res.summary, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return out


def _sessions(name: str):  # type: ignore[no-untyped-def]
    """The case's own sessions (the chat trace, the first Mooncake ones), else None."""
    if name.startswith("chat"):
        sys.path.insert(0, str(HERE))
        from open_loop_chat import chat_sessions

        return chat_sessions(0)
    if name.startswith("moon-"):
        from kvsim.workload.importers import import_trace

        _, it = import_trace("mooncake", MOONCAKE)
        n = int(name.split("-")[1])
        return [s for _, s in zip(range(n), it)]
    return None


def child(case: str) -> None:
    from kvsim.api import simulate
    from kvsim.scenario import load_scenario, resolve_scenario

    name, _, fidelity = case.partition(":")
    scenario, sets = CASES[name]
    sets = [*sets, f"sim.fidelity={fidelity or 'fast'}"]
    if name.startswith("moon-"):
        sc = resolve_scenario({**MOON_SCENARIO, "workload": {},
                               "sim": {"fidelity": fidelity or "fast"}})
    else:
        sc = load_scenario(scenario, sets)
    print("DIGEST " + json.dumps(_digest(simulate(sc, sessions=_sessions(name)))))


def _run(case: str, root: str | None) -> dict[str, str] | str:
    env = dict(os.environ)
    code = ("import sys\n" + (f"sys.meta_path[:] = [f for f in sys.meta_path if "
                               f"'editable' not in repr(f)]\nsys.path.insert(0, {root!r})\n"
                               if root else "")
            + f"sys.path.insert(0, {str(HERE)!r})\nimport exactness\n"
            f"exactness.child({case!r})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, check=False)
    line = [x for x in r.stdout.splitlines() if x.startswith("DIGEST ")]
    if r.returncode or not line:
        return f"failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}"
    return json.loads(line[-1].removeprefix("DIGEST "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", required=True, help="folder holding the previous core's kvsim")
    ap.add_argument("--cases", default="", help="comma-separated names (default: every case)")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    a = ap.parse_args()
    names = [c for c in a.cases.split(",") if c] or list(CASES)
    if any(n.startswith("moon-") for n in names) and not Path(MOONCAKE).is_file():
        print(f"(no Mooncake trace at {MOONCAKE}: those cases are skipped)")
        names = [n for n in names if not n.startswith("moon-")]
    cases = [c for n in names for c in ([n, f"{n}:step"] if n in STEP_TOO else [n])]
    ref = str(Path(a.reference).resolve())
    with ThreadPoolExecutor(a.jobs) as pool:
        futs = {c: (pool.submit(_run, c, None), pool.submit(_run, c, ref)) for c in cases}
        bad = 0
        for c, (mine, theirs) in futs.items():
            m, t = mine.result(), theirs.result()
            if isinstance(m, str) or isinstance(t, str):
                print(f"{c:24s} {m if isinstance(m, str) else ''} {t if isinstance(t, str) else ''}")
                bad += 1
                continue
            diff = [k for k in m if m[k] != t.get(k)]
            bad += bool(diff)
            print(f"{c:24s} {'same' if not diff else 'DIFFERS: ' + ', '.join(diff)}")
    print(f"{len(cases) - bad} of {len(cases)} cases the same")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
