"""Mooncake (FAST'25) synthetic trace through ``kvsim.workload`` import.

The shared Mooncake trace (not bundled; default path
/work/shared/traces/mooncake-fast25/synthetic_trace.jsonl, else pass ``--trace PATH``)
has long prompts with shared ``hash_ids`` prefixes; it is replayed open loop on vLLM
(llama-3.1-8b bf16, H100 SXM 80 GB, max_model_len 131072, prefix caching on).

    python benchmarks/mooncake.py                       # whole trace, fast and step
    python benchmarks/mooncake.py --trace PATH          # the trace stored elsewhere
    python benchmarks/mooncake.py --max-sessions 2000   # its first 2000 sessions
    python benchmarks/mooncake.py --no-step             # fast only
"""

from __future__ import annotations

import argparse
import itertools

from _common import measure

from kvsim.scenario import resolve_scenario
from kvsim.workload.importers import import_trace

MAX_CONTEXT = 131072
TRACE = "/work/shared/traces/mooncake-fast25/synthetic_trace.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--max-sessions", type=int, default=None)
    ap.add_argument("--no-step", action="store_true")
    a = ap.parse_args()
    sc = resolve_scenario({"gpu": "h100-sxm5-80gb", "model": "llama-3.1-8b", "weights": "bf16",
                           "engine": {"preset": "vllm", "context_tokens": MAX_CONTEXT},
                           "workload": {}})

    def sessions():
        _, it = import_trace("mooncake", a.trace)
        # NOTE: a few prompts exceed llama-3.1-8b's 131,072-token context; they are skipped
        # (the simulator refuses them, as the model would)
        it = (s for s in it if sum(t.input_tokens + t.output_tokens + t.tool_tokens
                                   + sum(p.tokens for p in t.prefix) for t in s.turns)
              + s.system_prompt_tokens < MAX_CONTEXT)
        return itertools.islice(it, a.max_sessions) if a.max_sessions else it
    # NOTE: the first full-size run in a process is ~4 s slower (heap growth; the
    # tiny warm-up does not cover it), so fast runs twice and the step run comes after
    measure("mooncake synthetic trace, vLLM, H100", sc, sessions, step=not a.no_step,
            repeat=2)


if __name__ == "__main__":
    main()
