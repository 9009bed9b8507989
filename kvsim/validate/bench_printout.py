"""Serving benchmarks' own printouts as engine-speed rows (kvsim.validate.engine_speed).

A user pastes what ``vllm bench serve`` (``benchmark_serving.py``), SGLang's
``bench_serving`` or ``vllm bench latency`` printed, and ``kvsim validate`` replays each
run as it ran:

- **serve** (vLLM or SGLang; SGLang's names its ``Backend: sglang``): each ``Serving
  Benchmark Result`` block, with the lines printed just before it. ``Successful
  requests`` is the number of requests in all, ``Maximum`` (SGLang: ``Max``) ``request
  concurrency`` the streams (none, or ``not set``, with the traffic rate ``inf``: every
  request at once); a request's prompt and answer are ``Total input tokens`` and ``Total
  generated tokens`` over the requests (their means: a random dataset's lengths vary
  with its range ratio). Compared: the median TTFT, TPOT and ITL and the output token
  throughput.
- **latency** (vLLM): ``Avg latency: X seconds`` of one batch, with its shape from the
  arguments vLLM printed (``input_len``, ``output_len``, ``batch_size`` in the
  ``Namespace(...)`` line, or the ``--input-len`` … flags of a pasted command).

The model comes from the printed arguments (``model='…'``, ``--model``, ``vllm serve
<model>``); a checkpoint whose name states no format is bf16 (``dtype auto`` on the bf16
checkpoints people serve; ``dtype='float16'`` is f16). No printout names the card:
``--gpu`` gives it (and ``--model`` a model the text does not name).

NOTE: a run at a finite request rate (Poisson arrivals) or over several GPUs
(``tensor_parallel_size`` above 1) is listed as skipped with that reason: kvsim replays
closed loops and waves on one card.
"""

from __future__ import annotations

import re

from kvsim.model.names import resolve_model
from kvsim.validate.records import Skipped

SERVE_MARK = re.compile(r"^\s*=+\s*Serving Benchmark Result\s*=+\s*$", re.MULTILINE)
_CLOSE = re.compile(r"^\s*={20,}\s*$", re.MULTILINE)
LATENCY_MARK = re.compile(r"^\s*Avg latency:\s*[\d.]+\s*seconds", re.IGNORECASE | re.MULTILINE)
_SERVE_METRICS = (("Median TTFT (ms)", "ttft_ms_median", "ms"),
                  ("Median TPOT (ms)", "tpot_ms_median", "ms"),
                  ("Median ITL (ms)", "itl_ms_median", "ms"),
                  ("Output token throughput (tok/s)", "output_tps_total", "tokens/s"))


def _figure(text: str, label: str) -> float | None:
    """The number printed after ``label:`` on its own line (None: not printed)."""
    m = re.search(rf"^\s*{re.escape(label)}:\s*([\d,]+(?:\.\d+)?)", text,
                  re.IGNORECASE | re.MULTILINE)
    return float(m.group(1).replace(",", "")) if m else None


def _arg(text: str, *names: str) -> str | None:
    """An argument as printed (``name=value`` in a Namespace, ``"name": value`` in JSON)
    or as a pasted command gave it (``--name value``); the first name found."""
    for name in names:
        flag = "--" + name.replace("_", "-")
        m = re.search(rf"\b{name}\s*=\s*'?([^',)\s]+)'?", text) or \
            re.search(rf'"{name}"\s*:\s*"?([^",}}\s]+)"?', text) or \
            re.search(rf"(?<!\S){re.escape(flag)}[ =]'?([^'\s]+)'?", text)
        if m:
            return m.group(1)
    return None


def _model(text: str) -> str:
    m = _arg(text, "model")
    if m is None and (served := re.search(r"vllm serve\s+(\S+)", text)):
        m = served.group(1)
    return m or ""


def _weights(text: str, model: str) -> str:
    """The weight format the printout names (a quantization), else the one the model's
    name states, else its dtype's 16 bits (module docstring); "" with no model named
    (``--model`` names both)."""
    quant = _arg(text, "quantization")
    if quant and quant.lower() not in ("none", "null"):
        return quant
    if not model or resolve_model(model).weight_format:
        return ""
    return "f16" if (_arg(text, "dtype") or "").lower() in ("float16", "half", "fp16") \
        else "bf16 (dtype auto)"


def _base(whole: str, run: str, rid: str) -> tuple[dict[str, str], str]:
    """The cells every row of one run shares (its arguments from the ``whole`` paste, its
    traffic from its own ``run`` text), and why it cannot be replayed ("")."""
    short = re.search(r"(?<!\S)-tp[ =](\d+)", whole)
    tp = int(_arg(whole, "tensor_parallel_size") or (short.group(1) if short else 1))
    shown = re.search(r"Traffic request rate:\s*(\S+)", run)
    rate = (shown.group(1) if shown else _arg(whole, "request_rate") or "").lower()
    why = f"tensor_parallel_size {tp}: kvsim replays one card's rows" if tp > 1 else \
        f"request rate {rate}/s (Poisson arrivals): kvsim replays closed loops and waves" \
        if rate and rate not in ("inf", "infinity") else ""
    backend = re.search(r"^\s*Backend:\s*(\S+)", run, re.MULTILINE)
    engine = "sglang" if backend and backend.group(1).lower().startswith("sglang") else "vllm"
    eager = (_arg(whole, "enforce_eager") or "").lower() in ("true", "1")
    model = _model(whole)
    return {"engine": engine, "engine_version": "", "gpu": "", "model": model,
            "weight_format": _weights(whole, model),
            "settings": "enforce_eager" if eager else "", "source": rid}, why


def _serve_rows(whole: str, run: str, rid: str) -> tuple[list[dict[str, str]], list[Skipped]]:
    """One ``Serving Benchmark Result`` block (with the lines before it) as rows."""
    base, why = _base(whole, run, rid)
    n = _figure(run, "Successful requests")
    tin, tout = _figure(run, "Total input tokens"), _figure(run, "Total generated tokens")
    if why or not n or tin is None or not tout:
        return [], [Skipped(rid, why or "a serving printout without Successful requests, "
                            "Total input tokens and Total generated tokens: the requests' "
                            "shape is not known")]
    conc = _figure(run, "Maximum request concurrency") or \
        _figure(run, "Max request concurrency") or float(_arg(whole, "max_concurrency") or 0)
    streams = int(min(conc or n, n))
    shape = {"input_len": str(round(tin / n)), "output_len": str(round(tout / n)),
             "batch_or_concurrency": str(streams)}
    settings = "; ".join(s for s in (f"{int(n)} prompts, max concurrency {streams}",
                                     base["settings"]) if s)
    rows = [{**base, **shape, "id": f"{rid}:{metric}", "metric": metric,
             "value": str(value), "unit": unit, "settings": settings}
            for label, metric, unit in _SERVE_METRICS
            if (value := _figure(run, label)) is not None]
    return rows, [] if rows else [Skipped(rid, "no median TTFT, TPOT, ITL or output "
                                          "throughput printed")]


def _runs(text: str) -> list[str]:
    """Each serving result block with the lines printed before it (after the previous
    block's closing rule)."""
    out, start = [], 0
    for m in SERVE_MARK.finditer(text):
        close = _CLOSE.search(text, m.end())
        end = close.end() if close else len(text)
        out.append(text[start:end])
        start = end
    return out


def _latency_rows(text: str, origin: str) -> tuple[list[dict[str, str]], list[Skipped]]:
    base, why = _base(text, text, origin)
    rid = f"{origin}:avg_latency_s"
    shape = {k: _arg(text, k) for k in ("input_len", "output_len", "batch_size")}
    missing = [k for k, v in shape.items() if v is None]
    if why or missing:
        return [], [Skipped(rid, why or f"{', '.join(missing)} not printed: paste the "
                            "Namespace(...) line or the command with it")]
    return [{**base, "id": rid, "metric": "avg_latency_s",
             "value": str(_figure(text, "Avg latency")), "unit": "s",
             "input_len": str(shape["input_len"]), "output_len": str(shape["output_len"]),
             "batch_or_concurrency": str(shape["batch_size"])}], []


def read_bench_printout(text: str, origin: str
                        ) -> tuple[list[dict[str, str]], list[Skipped]] | None:
    """The engine-speed rows (and skipped runs) of a serving benchmark's printout; None
    when ``text`` is no such printout."""
    runs = _runs(text)
    if runs:
        rows: list[dict[str, str]] = []
        skipped: list[Skipped] = []
        for i, run in enumerate(runs, 1):
            r, s = _serve_rows(text, run, f"{origin}:run{i}" if len(runs) > 1 else origin)
            rows += r
            skipped += s
        return rows, skipped
    if LATENCY_MARK.search(text):
        return _latency_rows(text, origin)
    return None
