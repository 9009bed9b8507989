"""kvsim's vLLM speed against published vLLM figures (docs/reference/vllm-speed): prints
each usable row's measured value beside what ``kvsim simulate`` answers for the same
shape, then the median signed and |relative| error per metric. Not a test; a check.

Each row is replayed as a benchmark would run it: ``batch_or_concurrency`` requests of
``input_len`` prompt and ``output_len`` answer tokens, all arriving at t = 0, on the
``vllm`` engine preset with the card, model and weights the row names:

- ``avg_latency_s`` (``vllm bench latency``): the last request's end-to-end time;
- ``tpot_ms_median``: the median inter-token gap;
- ``decode_tps_per_stream``: 1 / median gap (rows with a prompt of at most 64 tokens,
  where the printed rate is near pure decode).

The rows' names are mapped to catalogue slugs by :data:`SLUGS` (the published text names
a card or checkpoint loosely: an unstated H100 / A100 variant is taken as the SXM part,
noted); a row it cannot map, a server run with ``--enforce-eager`` (kvsim prices vLLM with
CUDA graphs) and a throughput figure of an open benchmark (its arrivals are not at hand)
are listed as skipped with the reason.

    python scripts/vllm_speed_check.py
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from pathlib import Path

from kvsim.api import simulate
from kvsim.scenario import resolve_scenario
from kvsim.workload.schema import Session, Turn

ROWS = Path(__file__).resolve().parents[1] / "docs" / "reference" / "vllm-speed" / "vllm-speed.csv"
SLUGS = {  # (text in the row's gpu / model / weight_format) -> catalogue slug
    "gpu": [("H100", "h100-sxm5-80gb"), ("A100 80GB", "a100-80gb-sxm4"),
            ("RTX A6000", "rtx-a6000"), ("RTX 4090", "rtx-4090")],
    "model": [("Llama-3.1-8B", "llama-3.1-8b"), ("Qwen2.5-7B", "qwen2.5-7b"),
              ("Qwen2.5-14B", "qwen2.5-14b"), ("Qwen3-14B", "qwen3-14b"),
              ("Qwen3-4B", "qwen3-4b"), ("Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3")],
    "weights": [("FP8", "fp8"), ("GPTQ-Int4", "gptq"), ("AWQ", "awq"), ("bf16", "bf16")],
}
SHORT_PROMPT = 64


def _slug(kind: str, text: str) -> str | None:
    return next((s for key, s in SLUGS[kind] if key.lower() in text.lower()), None)


def _int(text: str) -> int | None:
    """The count a field starts with ("53 (mean generated)" -> 53), else None."""
    m = re.match(r"\s*(\d+)(?![\w-])", text or "")
    return int(m.group(1)) if m else None


def _skip_reason(r: dict[str, str]) -> str | None:
    if "enforce-eager" in r["settings"] or "enforce_eager=True" in r["settings"]:
        return "served with --enforce-eager (no CUDA graphs)"
    if r["metric"] not in ("avg_latency_s", "tpot_ms_median", "decode_tps_per_stream"):
        return f"metric {r['metric']}: the benchmark's arrivals are not at hand"
    if r["metric"] == "decode_tps_per_stream" and (_int(r["input_len"]) or 0) > SHORT_PROMPT:
        return "tokens/s over a long prompt's prefill and the decode together"
    missing = [k for k, f in (("gpu", "gpu"), ("model", "model"), ("weights", "weight_format"))
               if _slug(k, r[f]) is None]
    return f"no catalogue slug for its {', '.join(missing)}" if missing else None


def predicted(r: dict[str, str]) -> float:
    """kvsim's answer for one row (module docstring)."""
    batch, out = _int(r["batch_or_concurrency"]) or 1, _int(r["output_len"]) or 1
    inp = _int(r["input_len"]) or 40  # a chat prompt of a few dozen tokens where unprinted
    sc = resolve_scenario({"name": r["id"], "gpu": _slug("gpu", r["gpu"]),
                           "model": _slug("model", r["model"]),
                           "weights": _slug("weights", r["weight_format"]),
                           "engine": {"preset": "vllm", "context_tokens": max(2048, inp + out)},
                           "workload": {}})
    turn = Turn(start_s=0.0, input_tokens=inp, output_tokens=out)
    s = simulate(sc, sessions=[Session(session_id=f"r{i}", turns=(turn,))
                               for i in range(batch)]).summary
    return {"avg_latency_s": s["e2e_p99_s"], "tpot_ms_median": 1000 * s["itl_p50_s"],
            "decode_tps_per_stream": 1.0 / s["itl_p50_s"]}[r["metric"]]


def main() -> int:
    errs: dict[str, list[float]] = {}
    with ROWS.open(encoding="utf-8") as f:
        for r in csv.DictReader(f):
            why = _skip_reason(r)
            if why:
                print(f"{r['id']}  skipped: {why}")
                continue
            pred, meas = predicted(r), float(r["value"])
            err = pred / meas - 1.0
            errs.setdefault(r["metric"], []).append(err)
            print(f"{r['id']}  {_slug('gpu', r['gpu']):15s} {_slug('model', r['model']):16s} "
                  f"{_slug('weights', r['weight_format']):9s} B={r['batch_or_concurrency']:>4s} "
                  f"{r['metric']:22s} measured {meas:9.3f}  kvsim {pred:9.3f}  {100 * err:+6.1f} %")
    for metric, e in errs.items():
        print(f"{metric}: n {len(e)}, median {100 * statistics.median(e):+.1f} %, "
              f"median |e| {100 * statistics.median(abs(x) for x in e):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
