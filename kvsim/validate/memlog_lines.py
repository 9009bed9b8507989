"""Figures in the lines engines print at start-up, wherever a row holds them
(kvsim.validate.memlog_text reads the rest): llama.cpp's memory breakdown and its buffer
lines, SGLang's pool line, Ollama's per-device layout lines and vLLM's maximum
concurrency. Units as printed (kvsim.validate.memlog_text's module NOTE)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvsim.config.units import parse_bytes

QTY = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s*([KMGT]i?B|B|tokens?)?\b", re.IGNORECASE)


@dataclass(frozen=True)
class Figure:
    """One printed figure: a metric of :data:`METRICS`, on one device (``""``: the whole
    engine, or its only GPU), with the text it was read from."""

    metric: str
    value: float            # tokens, bytes or layers
    device: str = ""
    as_printed: str = ""
    half_unit: float = 0.0  # bytes: half the last printed digit ("1.3 GiB": 0.05 GiB)


def half_digit(raw: str) -> float:
    """Half a unit of the last digit the number in ``raw`` was printed with ("1.3": 0.05)."""
    m = QTY.search(raw)
    digits = m.group(1).replace(",", "") if m else ""
    return 0.5 * 10.0 ** -(len(digits) - digits.index(".") - 1 if "." in digits else 0)


def printed_bytes(number: str, unit: str, field: str) -> tuple[float, float]:
    """(bytes, bytes half its last printed digit stands for) of a size as printed
    ("1.3", "GiB": 1.3 GiB and 0.05 GiB)."""
    return (float(parse_bytes(f"{number} {unit}", field)),
            parse_bytes(f"1 {unit}", field) * half_digit(number))


DEVICE = re.compile(r"(?<![\w])(?:projected\s+)?((?:CUDA|ROCm|Vulkan|Metal|SYCL)\d+|Host)\b")
_BREAKDOWN = re.compile(r"self=\s*\d+\s*\(model[= ]\s*(\d+)\s*\+\s*context[= ]\s*(\d+)\s*\+"
                        r"\s*compute[= ]\s*(\d+)\)")


def _breakdown(text: str) -> list[Figure]:
    """llama.cpp's memory breakdown: weights, KV (context) and compute per GPU, MiB."""
    out: list[Figure] = []
    marks = list(DEVICE.finditer(text))
    for i, m in enumerate(marks):
        dev, chunk = m.group(1), text[m.start():marks[i + 1].start() if i + 1 < len(marks)
                                      else len(text)]
        if dev == "Host" or chunk.lower().startswith("projected"):
            continue
        if t := re.match(r"\S+\s+total=\s*(\d+)", chunk):
            out.append(Figure("device_bytes", float(int(t.group(1)) * 2**20), dev,
                              chunk.strip("; ")))
        if b := _BREAKDOWN.search(chunk):
            for metric, val in zip(("weights_bytes", "kv_bytes", "compute_bytes"), b.groups(),
                                   strict=True):
                out.append(Figure(metric, float(int(val) * 2**20), dev, chunk.strip("; ")))
    return out


def _sglang_pool(text: str) -> list[Figure]:
    """SGLang's ``KV Cache is allocated … #tokens=N K size=X GB V size=Y GB`` line."""
    out: list[Figure] = []
    if m := re.search(r"#tokens\s*[=:]\s*(\d+)", text):
        out.append(Figure("kv_tokens", float(m.group(1)), as_printed=m.group(0)))
    if m := re.search(r"K size\s*[=:]\s*([\d.]+) ?(\w+),? V size\s*[=:]\s*([\d.]+) ?(\w+)",
                      text):
        (k, hk), (v, hv) = (printed_bytes(n, "GiB" if u.upper() == "GB" else u, "K/V size")
                            for n, u in ((m.group(1), m.group(2)), (m.group(3), m.group(4))))
        out.append(Figure("kv_bytes", k + v, as_printed=m.group(0), half_unit=hk + hv))
    return out


_OLLAMA_PART = re.compile(r'(model weights|kv cache|compute graph)"?\s+device=(\w+)\s+'
                         r'size="?(\d+(?:\.\d+)?)\s*([KMGT]i?B)"?', re.IGNORECASE)
_OLLAMA_METRIC = {"model weights": "weights_bytes", "kv cache": "kv_bytes",
                  "compute graph": "compute_bytes"}


def _ollama_layout(text: str) -> list[Figure]:
    """Ollama's per-device layout lines (its Go engine's ``msg="model weights"
    device=CUDA0 size="4.4 GiB"``, ``kv cache``, ``compute graph``): the GPUs' parts (the
    host's ``CPU`` parts are not a GPU's)."""
    out: list[Figure] = []
    for m in _OLLAMA_PART.finditer(text or ""):
        dev = m.group(2)
        if dev.upper() == "CPU":
            continue
        value, half = printed_bytes(m.group(3), m.group(4), f"{m.group(1)} {dev}")
        out.append(Figure(_OLLAMA_METRIC[m.group(1).lower()], value, dev, m.group(0),
                          half_unit=half))
    return out


_LLAMA_BUFFER = re.compile(r"(?<![\w])((?:CUDA|ROCm|Vulkan|SYCL|MTL|Metal)\d*)\s+(KV|compute|model)"
                           r"\s+buffer size\s*[=:]\s*(\d+(?:\.\d+)?)\s*(MiB|GiB)", re.IGNORECASE)
_LLAMA_KV_SIZE = re.compile(r"(?:llama_kv_cache\w*:\s+size|KV self size)\s*[=:]\s*"
                            r"(\d+(?:\.\d+)?)\s*(MiB|GiB)")
_LLAMA_METRIC = {"kv": "kv_bytes", "compute": "compute_bytes", "model": "weights_bytes"}


def _llama_lines(text: str) -> list[Figure]:
    """llama.cpp's own start-up lines (``llama_kv_cache: CUDA0 KV buffer size = 1024.00
    MiB``, ``compute buffer size``, ``model buffer size``; the host's buffers are not a
    GPU's): per GPU, a device's KV caches summed (an SWA model prints two); else the
    cache's ``size = X MiB`` (older ``KV self size``) for the whole engine."""
    sums: dict[tuple[str, str], tuple[float, float]] = {}
    printed: dict[tuple[str, str], list[str]] = {}
    for m in _LLAMA_BUFFER.finditer(text or ""):
        key = (_LLAMA_METRIC[m.group(2).lower()], m.group(1))
        value, half = printed_bytes(m.group(3), m.group(4), m.group(0))
        total, halves = sums.get(key, (0.0, 0.0))
        sums[key] = (total + value, halves + half)
        printed.setdefault(key, []).append(m.group(0))
    out = [Figure(metric, value, dev, " + ".join(printed[(metric, dev)]), half_unit=half)
           for (metric, dev), (value, half) in sums.items()]
    if not any(f.metric == "kv_bytes" for f in out) and (m := _LLAMA_KV_SIZE.search(text or "")):
        value, half = printed_bytes(m.group(1), m.group(2), m.group(0))
        out.append(Figure("kv_bytes", value, "", m.group(0), half_unit=half))
    return out


_CONCURRENCY = re.compile(r"maximum concurrency for\s*([\d,]+)\s*tokens per request\s*[=:]\s*"
                          r"(\d+(?:\.\d+)?)\s*x", re.IGNORECASE)


def _concurrency(text: str) -> list[Figure]:
    """vLLM's ``Maximum concurrency for L tokens per request: X.XXx`` (its pool over L)."""
    m = _CONCURRENCY.search(text or "")
    return [] if m is None else [Figure("max_concurrency", float(m.group(2)), "", m.group(0),
                                        half_unit=half_digit(m.group(2)))]


def engine_lines(text: str) -> list[Figure]:
    """Every figure of the engines' own lines in ``text`` (a device's figure once: the
    breakdown's before the buffer lines')."""
    figures = _breakdown(text) + _sglang_pool(text) + _ollama_layout(text) + _concurrency(text)
    known = {(f.metric, f.device) for f in figures}
    return figures + [f for f in _llama_lines(text) if (f.metric, f.device) not in known]
