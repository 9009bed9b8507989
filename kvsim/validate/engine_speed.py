"""Serving engines' own speed figures (vLLM's ``bench latency``, a serving benchmark's
median TPOT, a single stream's tokens/s) against what ``kvsim simulate`` answers.

The layout (``docs/reference/vllm-speed/vllm-speed.csv`` and its README): one figure a
row, with the shape that produced it — ``input_len`` and ``output_len`` tokens a request,
``batch_or_concurrency`` requests at once. A row is replayed as its benchmark ran: that
many requests of that shape, all at t = 0, on the engine's preset with the card, model
and weights the row names, through the whole simulator (scheduler, KV pool, step
times; the caller passes the simulator in, :class:`Replay`). A row whose settings state
the requests in all ("300 prompts, max concurrency 4", "512 requests at this level") is
a closed loop: ``batch_or_concurrency`` streams, each sending its next request as its
last one ends, until that many have run. What is compared:

- ``avg_latency_s``: the time until the last request ends (``bench latency``'s batch);
- ``tpot_ms_median`` / ``itl_ms_median``: the median gap between output tokens;
- ``ttft_ms_median``: the median time to the first token;
- ``decode_tps_per_stream``: one over that median gap, for a prompt of at most
  :data:`SHORT_PROMPT` tokens (a longer prompt's prefill is in the printed rate);
- ``output_tps_total``: output tokens over the run's whole time.

A row whose ``gpu`` (or ``model``) cell is empty — vLLM's own printout names neither,
kvsim.validate.bench_printout — is replayed on what ``--gpu`` (``--model``) names, and
skipped with that advice without them.

Skipped, each with its reason: another metric, an output throughput whose number of
requests is not stated, a run with ``--enforce-eager`` (kvsim prices the engine's
CUDA graphs), several GPUs, and a card, model or weight format kvsim cannot name. An
input length the row does not print is taken as :data:`UNPRINTED_PROMPT` tokens, said so
in the row's notes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kvsim.config.gpu_names import resolve_gpu
from kvsim.errors import InputError
from kvsim.validate.memlogs import engine_name, gpus_named, model_named, weights_named
from kvsim.validate.records import Skipped

if TYPE_CHECKING:
    from kvsim.scenario import Scenario
    from kvsim.workload.schema import Session

ENGINE_SPEED = ("id", "engine", "gpu", "model", "input_len", "output_len",
                "batch_or_concurrency", "metric", "value", "unit")
KNOWN_COLUMNS = set(ENGINE_SPEED) | {"engine_version", "weight_format", "kv_type", "settings",
                                     "source", "notes"}
METRICS = {"avg_latency_s": "s", "tpot_ms_median": "ms", "itl_ms_median": "ms",
           "ttft_ms_median": "ms", "decode_tps_per_stream": "tokens/s",
           "output_tps_total": "tokens/s"}
"""The figures compared, with the unit each must be printed in (``output_tps_total``:
only for a run whose number of requests is stated)."""
_REQUESTS = re.compile(r"(\d[\d,]*)\s+(?:prompts|requests)\b|num[-_]prompts[ =](\d+)",
                       re.IGNORECASE)
SHORT_PROMPT = 64
MAX_REQUESTS = 65536
"""The most requests one row replays in all (a closed loop's)."""
MAX_BATCH = 4096
"""The most requests one row replays at once (a benchmark's concurrency; more is a typo or
an open benchmark, and would only slow ``kvsim validate``)."""
UNPRINTED_PROMPT = 40
"""Tokens taken for a prompt the row does not count ("a one-sentence chat prompt")."""


@dataclass(frozen=True)
class EngineSpeed:
    """One published engine speed figure (module docstring)."""

    id: str
    engine: str          # a kvsim engine preset
    gpu: str             # catalogue slug
    model: str           # catalogue slug
    weights: str         # kvsim weight format
    input_len: int
    input_printed: bool
    output_len: int
    batch: int
    metric: str
    value: float
    engine_version: str = ""
    requests: int = 0               # in all, ``batch`` at a time; 0: one wave of ``batch``
    ambiguous: str = ""             # why the card is not known ("": it is)
    candidates: tuple[str, ...] = ()  # the profiles an ambiguous card name fits


def _count(text: str) -> int | None:
    """The count a cell starts with ("53 (mean generated)" -> 53); None where it starts
    with no count ("65-character prompt", "not printed")."""
    m = re.match(r"\s*(\d+)(?![\w.-])", text or "")
    return int(m.group(1)) if m else None


def _requests(settings: str) -> int:
    """The requests a benchmark ran in all ("300 prompts", "--num-prompts 100"); 0: not
    stated."""
    m = _REQUESTS.search(settings or "")
    return int((m.group(1) or m.group(2)).replace(",", "")) if m else 0


def _why_not(row: dict[str, str]) -> str | None:
    metric, settings = row["metric"], row.get("settings", "")
    if metric not in METRICS:
        return f"metric {metric}: not one kvsim replays"
    if metric == "output_tps_total" and not _requests(settings):
        return "output_tps_total of a run whose number of requests is not stated"
    if (row.get("unit") or "").strip() != METRICS[metric]:
        return f"unit {row.get('unit')!r} of {metric}: {METRICS[metric]!r} expected"
    if re.search(r"enforce[-_]eager(?!\s*=\s*False)", settings, re.IGNORECASE):
        return "served with --enforce-eager: kvsim prices the engine's CUDA graphs"
    if metric == "decode_tps_per_stream" and (_count(row["input_len"]) or 0) > SHORT_PROMPT:
        return f"tokens/s over a {row['input_len']}-token prompt's prefill and its decode"
    return None


def read_engine_speed(row: dict[str, str]) -> EngineSpeed | Skipped:
    """One row as an :class:`EngineSpeed`, or why it cannot be replayed."""
    rid = row.get("id") or "?"
    why = _why_not(row)
    engine = engine_name(row.get("engine", ""))
    gpus, gpu_why, count = gpus_named(row.get("gpu", ""))
    model, from_name, model_why = model_named(row.get("model", ""))
    weights, weights_why = weights_named(row.get("weight_format", ""), from_name)
    out, batch = _count(row.get("output_len", "")), _count(row.get("batch_or_concurrency", ""))
    requests = _requests(row.get("settings", ""))
    try:
        value = float(row.get("value", ""))
    except ValueError:
        value = float("nan")
    cands = resolve_gpu(row.get("gpu", "")).candidates if gpu_why.startswith("ambiguous") \
        else ()
    later = {"gpu": not (row.get("gpu") or "").strip(), "model": not (row.get("model") or "").strip()}
    reasons = [r for r in (
        why, "" if engine else f"engine {row.get('engine')!r} names none of kvsim's presets",
        f"{count} GPUs: kvsim replays one card's rows" if count > 1 else
        ("" if cands or later["gpu"] else gpu_why),
        "" if later["model"] else model_why, "" if later["model"] else weights_why,
        "" if out and batch else "output_len and batch_or_concurrency must be counts above 0",
        "" if (batch or 0) <= MAX_BATCH else f"batch_or_concurrency {batch}: at most "
                                              f"{MAX_BATCH} requests at once are replayed",
        "" if requests <= MAX_REQUESTS else f"{requests} requests in all: at most "
                                            f"{MAX_REQUESTS} are replayed",
        "" if value > 0 else f"value {row.get('value')!r}: a positive number expected") if r]
    if reasons or not ((gpus or cands or later["gpu"]) and (model and weights or later["model"])
                       and out and batch):
        return Skipped(rid, "; ".join(reasons) or "not replayable")
    inp = _count(row.get("input_len", ""))
    return EngineSpeed(rid, engine, gpus[0] if gpus else "", model or "", weights or "",
                       inp or UNPRINTED_PROMPT, bool(inp), out, batch, row["metric"],
                       value, row.get("engine_version", ""), requests,
                       gpu_why if cands else "", cands)


def read_engine_speed_rows(rows: list[dict[str, str]], origin: str
                           ) -> tuple[list[EngineSpeed], list[Skipped]]:
    meas: list[EngineSpeed] = []
    skipped: list[Skipped] = []
    for row in rows:
        got = read_engine_speed(row)
        (skipped if isinstance(got, Skipped) else meas).append(got)  # type: ignore[arg-type]
    return meas, skipped


class Replay(Protocol):
    """Runs a scenario on the given sessions and returns the run's summary: what
    ``kvsim.api.simulate(...).summary`` returns (the caller passes it in: validate sits
    below the api layer)."""

    def __call__(self, scenario: Scenario, sessions: list[Session]) -> Mapping[str, Any]: ...


def predicted(m: EngineSpeed, replay: Replay, gpu: str | None = None) -> float:
    """``kvsim simulate``'s answer to the row (module docstring), on ``gpu`` (a slug)
    where the row's card is ambiguous."""
    from kvsim.scenario import resolve_scenario
    from kvsim.workload.schema import Session, Turn

    sc = resolve_scenario({"name": m.id, "gpu": gpu or m.gpu, "model": m.model,
                           "weights": m.weights,
                           "engine": {"preset": m.engine, "context_tokens":
                                      max(2048, m.input_len + m.output_len)},
                           "workload": {}})
    first = Turn(start_s=0.0, input_tokens=m.input_len, output_tokens=m.output_len)
    then = Turn(input_tokens=m.input_len, output_tokens=m.output_len)  # as the last ends
    total = max(m.requests, m.batch)
    s = replay(sc, [Session(session_id=f"r{i}", history="none", turns=(
        first, *[then] * (total // m.batch - 1 + (i < total % m.batch))))
        for i in range(m.batch)])
    if m.metric == "avg_latency_s":
        return float(s["sim_time_s"])  # the last request's end
    if m.metric == "output_tps_total":
        return float(s["tokens_per_s"])  # the output tokens over the whole run
    if m.metric == "ttft_ms_median":
        return 1000.0 * float(s["ttft_p50_s"])
    gap = float(s["itl_p50_s"])
    return 1.0 / gap if m.metric == "decode_tps_per_stream" else 1000.0 * gap


def engine_speed_row(m: EngineSpeed, replay: Replay | None) -> dict[str, object] | Skipped:
    """The row's prediction as a validation row (kind ``serving``), or why kvsim could not
    run it (no ``replay`` given; the scenario refused: the model does not fit the card, …)."""
    if replay is None:
        return Skipped(m.id, "a serving engine's figure: `kvsim validate` replays it "
                             "through the simulator")
    unnamed = [why for why, given in (("no card printed: name it with --gpu",
                                       m.gpu or m.ambiguous),
                                      ("no model printed: name it with --model", m.model),
                                      (("no weight format printed: --model names it "
                                        "(llama-3.1-8b-bf16)"), m.weights)) if not given]
    if unnamed:
        return Skipped(m.id, "; ".join(unnamed))
    try:
        if m.ambiguous:  # the summary leaves it out: which card ran is not known
            preds = ", ".join(f"{_amount(predicted(m, replay, g), m.metric)} as {g}"
                              for g in m.candidates)
            return Skipped(m.id, f"{m.ambiguous}; kvsim predicts {preds}; measured "
                                 f"{_amount(m.value, m.metric)}")
        pred = predicted(m, replay)
    except InputError as e:
        return Skipped(m.id, f"kvsim cannot run it: {e.one_line()}")
    return {"id": m.id, "kind": "serving", "backend": m.engine, "metric": m.metric,
            "gpu": m.gpu, "model": m.model, "weights": m.weights,
            "engine_version": m.engine_version, "input_len": m.input_len,
            "output_len": m.output_len, "batch": m.batch, "measured": m.value,
            "predicted": pred, "unit": METRICS[m.metric],
            "rel_err": (pred - m.value) / m.value,
            "notes": [] if m.input_printed else
            [f"input length not printed: {UNPRINTED_PROMPT} tokens taken"]}


def _amount(value: float, metric: str) -> str:
    return f"{value:,.3g} {METRICS[metric]}"
