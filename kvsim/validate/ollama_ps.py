"""``ollama ps`` as a user pastes it — its table or the ``/api/ps`` JSON — as start-up
memory measurements (:class:`~kvsim.validate.memlogs.MemoryMeasurement`, engine
``ollama``) that :mod:`kvsim.validate.memlog_predict` compares with kvsim's layout.

What each form shows (kvsim.engines._ollama_ps says what Ollama computes):

- the table: ``NAME ID SIZE PROCESSOR [CONTEXT] UNTIL``.  SIZE is decimal ("8.4 GB" is
  8.35–8.45 × 10⁹ bytes; from 10 up Ollama truncates, "47 GB" is 47–48 × 10⁹) →
  ``ollama_ps_size_bytes``; PROCESSOR's GPU share ("100% GPU" 100, "7%/93% CPU/GPU" 93,
  "100% CPU" 0) → ``ollama_ps_gpu_percent``; CONTEXT (newer releases) is num_ctx.  An
  ``ollama -v`` line pasted with it ("ollama version is 0.10.1") names the release.
- the JSON: ``size`` and ``size_vram`` in bytes (→ ``ollama_ps_size_bytes`` and
  ``ollama_ps_vram_bytes``, exact), ``context_length``, ``details.quantization_level``
  and ``expires_at``, whose date picks the release when none is named
  (:func:`kvsim.engines.ollama_releases.ollama_release_at`).

NOTE: neither names the GPU (``kvsim validate --gpu`` gives it) nor OLLAMA_NUM_PARALLEL
(the release's default is taken).  The table does not show the weight format: a tag
that states one ("qwen2.5:7b-instruct-q8_0") gives it, else the library's default tag is
taken — Q4_K_M, MXFP4 for gpt-oss (Ollama ships it in its own format) — and said so.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kvsim.errors import InputError
from kvsim.validate.memlog_lines import Figure
from kvsim.validate.memlogs import MemoryMeasurement, model_named, weights_named

_HEADER = re.compile(r"^NAME\s+ID\s+SIZE\s+PROCESSOR\b.*$", re.MULTILINE)
_VERSION = re.compile(r"(?:ollama|client) version is (\d+\.\d+\.\d+)", re.IGNORECASE)
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(TB|GB|MB|KB|B)$")
_SCALE = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}
_PROCESSOR = re.compile(r"^(?:(\d+)%/(\d+)% CPU/GPU|100% (GPU|CPU))$")
_NO_GPU = "GPU not named by `ollama ps` (give it: kvsim validate --gpu)"


def read_ollama_ps(text: str, origin: str) -> list[MemoryMeasurement] | None:
    """The loaded models of an ``ollama ps`` paste (table or JSON); None when ``text`` is
    neither; InputError naming ``<origin>.<model>.<column>`` for a cell that does not read."""
    stripped = text.strip()
    if stripped.startswith("{") and '"models"' in stripped:
        try:
            doc = json.loads(stripped)
        except json.JSONDecodeError:
            return None
        models = doc.get("models") if isinstance(doc, dict) else None
        if not isinstance(models, list) or not all(isinstance(m, dict) and "size" in m
                                                   for m in models):
            return None
        return [_json_row(m, origin) for m in models]
    header = _HEADER.search(text)
    if header is None:
        return None
    version = v.group(1) if (v := _VERSION.search(text)) else ""
    return [_table_row(cells, origin, version) for cells in _table(text, header)]


def _table(text: str, header: re.Match[str]) -> list[dict[str, str]]:
    """The table's rows as {column: cell}, cut at the header's column starts."""
    head = header.group(0)
    starts = [(m.start(), m.group(0)) for m in re.finditer(r"\S+", head)]
    rows = []
    for line in text[header.end():].splitlines():
        if not line.strip() or _VERSION.search(line):
            continue
        if line.lstrip().startswith("NAME"):
            break
        cells = {name: line[a:b].strip() for (a, name), (b, _) in
                 zip(starts, [*starts[1:], (len(line) + 1, "")], strict=True)}
        rows.append(cells)
    return rows


def _table_row(cells: dict[str, str], origin: str, version: str) -> MemoryMeasurement:
    name = cells.get("NAME", "")
    field = f"{origin}.{name}"
    figures = [_printed_size(cells.get("SIZE", ""), f"{field}.SIZE")]
    gpu_share = _gpu_percent(cells.get("PROCESSOR", ""), f"{field}.PROCESSOR")
    if gpu_share is not None:
        figures.append(Figure("ollama_ps_gpu_percent", gpu_share,
                              as_printed=cells["PROCESSOR"], half_unit=0.5))
    context = cells.get("CONTEXT", "")
    if context and not context.isdigit():
        raise InputError(f"{field}.CONTEXT", context, "a whole number of tokens")
    return _measurement(name, origin, version, "", int(context) if context else None,
                        tuple(figures), quant="")


def _json_row(m: dict[str, Any], origin: str) -> MemoryMeasurement:
    name = str(m.get("model") or m.get("name") or "")
    field = f"{origin}.{name}"
    size, vram = _whole(m.get("size"), f"{field}.size"), _whole(m.get("size_vram", 0),
                                                                   f"{field}.size_vram")
    figures = (Figure("ollama_ps_size_bytes", float(size), as_printed=f"size={size}"),
               Figure("ollama_ps_vram_bytes", float(vram), as_printed=f"size_vram={vram}"))
    ctx = m.get("context_length")
    details = m.get("details") if isinstance(m.get("details"), dict) else {}
    return _measurement(name, origin, "", str(m.get("expires_at") or "")[:10],
                        _whole(ctx, f"{field}.context_length") if ctx else None, figures,
                        quant=str(details.get("quantization_level") or ""))


def _measurement(name: str, origin: str, version: str, date: str, context: int | None,
                 figures: tuple[Figure, ...], quant: str) -> MemoryMeasurement:
    model, fmt, model_reason = model_named(name)
    stated: tuple[str, ...] = ()
    if quant:
        weights, weights_reason = weights_named(quant, fmt)
    elif fmt:
        weights, weights_reason = fmt, ""
    else:
        weights = "mxfp4" if (model or "").startswith("gpt-oss") else "q4_k_m"
        weights_reason = ""
        said = ("weights: `ollama ps` does not show them; the library's default tag "
                f"({weights.upper()}) taken")
        stated = (said,)
    return MemoryMeasurement(
        id=f"{origin}:{name}", engine="ollama", engine_as_printed="ollama ps", stock=True,
        engine_version=version, gpu_as_printed="", gpus=(), gpu_reason=_NO_GPU, gpu_count=1,
        model_as_printed=name, model=model, model_reason=model_reason, weights=weights,
        weights_reason=weights_reason, figures=figures, source=origin, date=date,
        stated=stated, settings={"num_ctx": context} if context else {})


def _printed_size(raw: str, field: str) -> Figure:
    """SIZE as printed (module docstring: one decimal below 10, truncated from 10 up)."""
    m = _SIZE.match(raw)
    if m is None:
        raise InputError(field, raw, "a size as `ollama ps` prints it, e.g. '8.4 GB'")
    number, scale = float(m.group(1)), _SCALE[m.group(2)]
    if "." in m.group(1):
        return Figure("ollama_ps_size_bytes", number * scale, as_printed=raw,
                      half_unit=0.05 * scale)
    if number >= 10:  # truncated: anything from N to N + 1
        return Figure("ollama_ps_size_bytes", (number + 0.5) * scale, as_printed=raw,
                      half_unit=0.5 * scale)
    return Figure("ollama_ps_size_bytes", number * scale, as_printed=raw)


def _gpu_percent(raw: str, field: str) -> float | None:
    """PROCESSOR's GPU share in percent (None: "Unknown")."""
    if raw == "Unknown":
        return None
    m = _PROCESSOR.match(raw)
    if m is None:
        raise InputError(field, raw, "'100% GPU', '100% CPU' or 'C%/G% CPU/GPU'")
    if m.group(3):
        return 100.0 if m.group(3) == "GPU" else 0.0
    return float(m.group(2))


def _whole(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(field, str(value), "a whole number of bytes or tokens")
    return value
