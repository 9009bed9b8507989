"""A household of closed-loop chat sessions on a 4-slot llama-server, as a scenario file.

Each session has its own system prompt (no shared prefix) and 6 turns whose think times
differ by session and turn, so with more sessions than slots which slot a returning
session finds free — and how much of its prompt is reused — hinges on the step times;
with as many sessions as slots each keeps its own.  No RAM prompt cache
(``cache_ram_bytes: 0``, llama-server's ``--cache-ram 0``), constant step costs.
"""

import json
from pathlib import Path

SLOTS = 4


def sessions_scenario(folder: Path, sessions: int, jitter_cv: float = 0.1) -> Path:
    """Write ``folder/trace.jsonl`` and ``folder/scenario.yaml``; return the scenario."""
    lines = [json.dumps({"trace_meta": {"source": "test", "schema_version": 1}})]
    for i in range(sessions):
        turns = [{"start_s": 0.5 * i if t == 0 else None,
                  "think_s": 0.0 if t == 0 else 2.0 + 0.5 * ((7 * i + 3 * t) % 5),
                  "prefix": [], "tool_tokens": 0, "input_tokens": 200, "output_tokens": 40,
                  "references": []} for t in range(6)]
        lines.append(json.dumps({"session_id": f"s{i}", "kind": "chat", "member": "",
                                 "system_prompt_id": f"sys{i}", "system_prompt_tokens": 300,
                                 "history": "full", "turns": turns}))
    (folder / "trace.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    p = folder / "scenario.yaml"
    p.write_text("gpu: rtx-4090\nmodel: llama-3.1-8b\n"
                 f"engine: {{preset: llama.cpp, parallel: {SLOTS}, ctx_size: 32768, "
                 "cache_ram_bytes: 0}\nworkload: {trace: trace.jsonl}\n"
                 "latency: {kind: constant, step_s: 0.02, prefill_token_s: 0.0001, "
                 f"jitter_cv: {jitter_cv}}}\n", encoding="utf-8")
    return p
