"""Open-loop chat benchmark: 1,000 requests over ~370 s (~2.7 requests/s).

Generated deterministically (numpy ``SeedSequence``, stream per quantity): request
arrivals are a Poisson process at 2.7 requests/s; requests are grouped into chat
sessions of 1–4 turns (uniform), a session's turns taking its share of arrival
slots in time order (open loop: every turn has its own ``start_s``); prompts
log-normal around 300 tokens (new user text per turn; the history is the
prefix), answers log-normal around 150 tokens.  Served by vLLM (llama-3.1-8b bf16,
RTX 4090).

    python benchmarks/open_loop_chat.py            # target: fast ≤ 0.2 s wall
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import measure

from kvsim.scenario import load_scenario
from kvsim.workload.schema import Session, Turn

RATE_PER_S = 2.7
REQUESTS = 1000


def chat_sessions(seed: int = 0, requests: int = REQUESTS) -> list[Session]:
    ss = np.random.SeedSequence(seed)
    arr_rng, size_rng, slot_rng, tok_rng = (np.random.default_rng(s) for s in ss.spawn(4))
    arrivals = np.cumsum(arr_rng.exponential(1.0 / RATE_PER_S, requests))
    sizes: list[int] = []
    while sum(sizes) < requests:
        sizes.append(int(size_rng.integers(1, 5)))
    sizes[-1] -= sum(sizes) - requests
    owner = slot_rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    inputs = np.maximum(tok_rng.lognormal(np.log(300), 0.6, requests).astype(int), 1)
    outputs = np.maximum(tok_rng.lognormal(np.log(150), 0.5, requests).astype(int), 1)
    turns: dict[int, list[Turn]] = {}
    for i in range(requests):
        turns.setdefault(int(owner[i]), []).append(Turn(
            start_s=float(arrivals[i]), input_tokens=int(inputs[i]),
            output_tokens=int(outputs[i])))
    out = [Session(session_id=f"chat{k}", turns=tuple(t)) for k, t in turns.items()]
    return sorted(out, key=lambda s: s.turns[0].start_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    sessions = chat_sessions(a.seed)
    span = max(t.start_s for s in sessions for t in s.turns)
    print(f"{sum(len(s.turns) for s in sessions)} requests in {len(sessions)} sessions, "
          f"last arrival at {span:.0f} s ({REQUESTS / span:.2f} requests/s)")
    sc = load_scenario("family-4-vllm", [])
    measure("open-loop chat, vLLM, rtx-4090", sc, lambda: sessions)


if __name__ == "__main__":
    main()
