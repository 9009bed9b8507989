"""Read llama-bench and llama-batched-bench output into :class:`Measurement` rows.

:func:`read_bench` takes the tool's output (``-oe``: stderr) and detects the layout
(:data:`FORMATS`: llama-bench json/jsonl/csv/md, llama-batched-bench table and jsonl); text in
none of them raises :class:`InputError`. Ids are ``f"{origin}:{n}"`` (batched-bench:
``...:n:pp`` and ``...:n:tg``); a ``-pg`` test is one ``pg_tps`` Measurement. Markdown and
llama-batched-bench leave fields unknown or "" (:func:`dataclasses.replace` fills them).

NOTE: every result row becomes Measurements or a Skipped naming the row and the field, never
nothing; the value is the rate the tool printed, never recomputed; a JSON without ``n_depth``
is read as depth 0.
Design: docs/design/calibration.md (field by field).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from kvsim.errors import InputError
from kvsim.validate.devices import printed_devices
from kvsim.validate.records import Measurement, Metric, Skipped, flash_flag, split_knobs

BENCH_JSON = "llama-bench json"
BENCH_JSONL = "llama-bench jsonl"
BENCH_CSV = "llama-bench csv"
BENCH_MD = "llama-bench markdown"
BATCHED_MD = "llama-batched-bench table"
BATCHED_JSONL = "llama-batched-bench jsonl"
FORMATS = (BENCH_JSON, BENCH_JSONL, BENCH_CSV, BENCH_MD, BATCHED_MD, BATCHED_JSONL)

_BENCH_KEYS = {"avg_ts", "n_prompt", "n_gen", "model_type", "build_commit"}
_BATCHED_KEYS = {"speed_pp", "speed_tg", "pl"}
# NOTE: [ \t], not \s, before the first "|": \s would match the blank line above
_MD_HEADER = re.compile(r"^[ \t]*\|\s*model\s*\|.*\|\s*test\s*\|\s*t/s\s*\|[ \t]*$",
                        re.MULTILINE)
_BATCHED_HEADER = re.compile(r"^[ \t]*\|\s*PP\s*\|\s*TG\s*\|\s*B\s*\|", re.MULTILINE)
_SEPARATOR = re.compile(r"^[\s|:\-]+$")

Row = dict[str, Any]


class _RowError(Exception):
    """A row (or one of its fields) that cannot be read; the message says which field."""


def detect_format(text: str) -> str | None:
    """The layout of ``text`` (one of :data:`FORMATS`), or None when it is none of them."""
    body = text.strip()
    if body.startswith("["):
        try:
            data = json.loads(body)
        except ValueError:
            return None
        ok = isinstance(data, list) and all(isinstance(r, dict) for r in data)
        return BENCH_JSON if ok else None
    if body.startswith("{"):
        try:
            first = json.loads(body.splitlines()[0])
        except ValueError:
            return None
        if isinstance(first, dict) and _BATCHED_KEYS <= first.keys():
            return BATCHED_JSONL
        return BENCH_JSONL if isinstance(first, dict) and _BENCH_KEYS & first.keys() else None
    if _BATCHED_HEADER.search(text):
        return BATCHED_MD
    if _MD_HEADER.search(text):
        return BENCH_MD
    return BENCH_CSV if _csv_header_at(text.splitlines()) is not None else None


def read_bench(text: str, *, origin: str) -> tuple[list[Measurement], list[Skipped]]:
    """Every result row of llama-bench / llama-batched-bench output ``text``, read.

    ``origin`` names the text in ids and errors (a file name).  Raises
    :class:`InputError` when the text is in none of :data:`FORMATS`."""
    fmt = detect_format(text)
    if fmt is None:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        raise InputError(origin, first[:60] or "empty",
                         "not llama-bench or llama-batched-bench output; formats read: "
                         + ", ".join(FORMATS))
    rows = {BENCH_JSON: _json_rows, BENCH_JSONL: _jsonl_rows, BENCH_CSV: _csv_rows,
            BENCH_MD: _md_rows, BATCHED_MD: _batched_md_rows,
            BATCHED_JSONL: _jsonl_rows}[fmt](text)
    steps = ("pp", "tg") if fmt in (BATCHED_MD, BATCHED_JSONL) else ("",)
    devices = printed_devices(text)
    measured: list[Measurement] = []
    skipped: list[Skipped] = []
    for n, row in rows:
        if isinstance(row, str):
            skipped.append(Skipped(f"{origin}:{n}", row))
            continue
        for step in steps:
            rid = f"{origin}:{n}:{step}" if step else f"{origin}:{n}"
            try:
                m = _batched_measurement(row, rid, step, origin) if step else \
                    _bench_measurement(row, rid, origin)
            except _RowError as e:
                skipped.append(Skipped(rid, str(e)))
                continue
            m.extra["format"] = fmt
            measured.append(replace(m, gpu=devices) if devices and not m.gpu else m)
    return measured, skipped


# ---------------------------------------------------------------- row sources
# Each yields (row number from 1, the row's fields by llama-bench's own field names,
# or a str saying why the row could not be split into fields).

def _json_rows(text: str) -> Iterator[tuple[int, Row | str]]:
    yield from enumerate(json.loads(text), 1)


def _jsonl_rows(text: str) -> Iterator[tuple[int, Row | str]]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            yield n, f"not a JSON object ({e.msg} at column {e.colno})"
            continue
        yield n, row if isinstance(row, dict) else "not a JSON object"


def _csv_header_at(lines: list[str]) -> int | None:
    for i, line in enumerate(lines):
        cells = next(csv.reader([line]), [])
        if "avg_ts" in cells and "n_prompt" in cells:
            return i
    return None


def _csv_rows(text: str) -> Iterator[tuple[int, Row | str]]:
    lines = text.splitlines()
    start = _csv_header_at(lines)
    assert start is not None
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    header = next(reader)
    for n, cells in enumerate((c for c in reader if c), 1):
        if len(cells) != len(header):
            yield n, f"{len(cells)} values, the header has {len(header)}"
            continue
        yield n, dict(zip(header, cells, strict=True))


_MD_FIELDS = {"model": "model_type", "backend": "backends", "ngl": "n_gpu_layers",
              "threads": "n_threads", "sm": "split_mode", "nkvo": "no_kv_offload",
              "fa": "flash_attn", "lm": "load_mode", "embd": "embeddings",
              "nopo": "no_op_offload", "noh": "no_host", "rpk": "repack", "dev": "devices",
              "ts": "tensor_split", "ot": "tensor_buft_overrides", "fitt": "fit_target",
              "fitc": "fit_min_ctx", "mg": "main_gpu"}


def _table(text: str, header_at: int) -> Iterator[tuple[int, list[str], list[str] | str]]:
    """The rows of the markdown table whose header starts at offset ``header_at``."""
    lines = text[header_at:].splitlines()
    header = _cells(lines[0])
    n = 0
    for line in lines[1:]:
        if not line.strip().startswith("|"):
            break
        if _SEPARATOR.match(line):
            continue
        n += 1
        cells = _cells(line)
        yield n, header, cells if len(cells) == len(header) else \
            f"{len(cells)} cells, the header has {len(header)}"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().removeprefix("|").removesuffix("|").split("|")]


def _md_rows(text: str) -> Iterator[tuple[int, Row | str]]:
    match = _MD_HEADER.search(text)
    assert match is not None
    for n, header, cells in _table(text, match.start()):
        yield n, cells if isinstance(cells, str) else _md_row(header, cells)


def _md_row(header: list[str], cells: list[str]) -> Row | str:
    row: Row = {}
    for name, cell in zip(header, cells, strict=True):
        try:
            row.update(_md_cell(name, cell))
        except _RowError as e:
            return str(e)
    return row


_TEST = re.compile(r"^(?:pp\s*(?P<pp>\d+))?(?:\s*\+\s*)?(?:tg\s*(?P<tg>\d+))?"
                   r"(?:\s*@\s*d(?P<d>\d+))?$")
_UNIT = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
         "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def _md_cell(name: str, cell: str) -> Row:
    """One markdown cell as llama-bench fields (``test`` and ``t/s`` give several)."""
    if name == "test":
        m = _TEST.match(cell)
        if not m or not (m["pp"] or m["tg"]):
            raise _RowError(f"test {cell!r} is not a llama-bench test name "
                            "(ppN, tgN, ppN+tgN, each optionally ' @ dN')")
        return {"n_prompt": int(m["pp"] or 0), "n_gen": int(m["tg"] or 0),
                "n_depth": int(m["d"] or 0)}
    if name == "t/s":
        avg, _, sd = cell.partition("±")
        return {"avg_ts": avg.strip(), "stddev_ts": sd.strip()}
    if name in ("size", "params"):
        num, _, unit = cell.partition(" ")
        if unit not in _UNIT:
            raise _RowError(f"field {name}: {cell!r} is not a number with a unit")
        value = round(_number(name, num) * _UNIT[unit])
        return {"model_size" if name == "size" else "model_n_params": value}
    return {_MD_FIELDS.get(name, name): cell}


_BATCHED_COLUMNS = {"PP": "pp", "TG": "tg", "B": "pl", "N_KV": "n_kv", "T_PP s": "t_pp",
                    "S_PP t/s": "speed_pp", "T_TG s": "t_tg", "S_TG t/s": "speed_tg",
                    "T s": "t", "S t/s": "speed"}
_SETTING = re.compile(r"\b(\w+) = (-?\d+)")


def _batched_md_rows(text: str) -> Iterator[tuple[int, Row | str]]:
    """The table, each row with the settings line printed above it (n_kv_max, ...)."""
    match = _BATCHED_HEADER.search(text)
    assert match is not None
    above = text[:match.start()].splitlines()
    line = next((ln for ln in reversed(above) if "n_kv_max = " in ln), "")
    settings = dict(_SETTING.findall(line))
    for n, header, cells in _table(text, match.start()):
        if isinstance(cells, str):
            yield n, cells
            continue
        yield n, settings | {_BATCHED_COLUMNS.get(h, h): c
                             for h, c in zip(header, cells, strict=True)}


# ---------------------------------------------------------------- conversion

def _bench_measurement(f: Mapping[str, Any], rid: str, origin: str) -> Measurement:
    """One llama-bench result (by llama-bench's field names) as a Measurement."""
    value = _rate(f, "avg_ts")
    n_prompt, n_gen = _int(f, "n_prompt"), _int(f, "n_gen")
    depth = _int(f, "n_depth", 0)
    if n_prompt <= 0 and n_gen <= 0:
        raise _RowError("fields n_prompt and n_gen: neither is positive")
    model_type = str(f.get("model_type", ""))
    used = {"avg_ts", "n_prompt", "n_gen", "n_depth", "gpu_info", "model_filename",
            "model_size", "model_n_params", "flash_attn", "n_batch", "n_ubatch", "type_k",
            "samples_ns", "samples_ts"}
    return Measurement(
        id=rid, gpu=str(f.get("gpu_info", "")), backend=_backend(f),
        model=str(f.get("model_filename") or model_type), weight_format=weight_format(model_type),
        metric=_bench_metric(n_prompt, n_gen), value=value,
        n_prompt=n_prompt, n_gen=n_gen, depth=depth,
        flash_attn=flash_flag(_text(f.get("flash_attn", ""))),
        n_ubatch=_int(f, "n_ubatch", None), n_batch=_int(f, "n_batch", None),
        model_size_bytes=_int(f, "model_size", None), model_params=_int(f, "model_n_params", None),
        kv_type=str(f.get("type_k") or "f16"), source=origin, **_split(f),
        gpu_layers=_int(f, "n_gpu_layers", None),
        extra={k: _text(v) for k, v in f.items() if k not in used and not isinstance(v, list)})


def _split(f: Mapping[str, Any]) -> dict[str, Any]:
    """llama-bench's split knobs (``extra`` keeps them too; records.split_knobs)."""
    try:
        return split_knobs(*(_text(f.get(k, "")) for k in ("split_mode", "tensor_split",
                                                              "main_gpu")))
    except ValueError as e:
        raise _RowError(f"field {e}") from None


def _bench_metric(n_prompt: int, n_gen: int) -> Metric:
    """A llama-bench test's metric: ``pp``, ``tg``, or both (``pg``: ``-pg`` / ``ppP+tgG``)."""
    if n_prompt > 0 and n_gen > 0:
        return "pg_tps"
    return "pp_tps" if n_prompt > 0 else "tg_tps"


def _batched_measurement(f: Mapping[str, Any], rid: str, step: str,
                         origin: str) -> Measurement:
    """The prompt (``step`` "pp") or decode ("tg") half of a llama-batched-bench row."""
    pp, tg, batch = _int(f, "pp"), _int(f, "tg"), _int(f, "pl")
    if step == "pp":
        shape = {"metric": "pp_tps", "value": _rate(f, "speed_pp", "S_PP t/s"), "n_prompt": pp}
    else:
        shape = {"metric": "tg_tps", "value": _rate(f, "speed_tg", "S_TG t/s"), "n_gen": tg,
                 "depth": pp}
    used = {"pp", "tg", "pl", "flash_attn", "n_batch", "n_ubatch"}
    return Measurement(
        id=rid, gpu="", backend="", model="", weight_format="", batch=batch,
        flash_attn=flash_flag(_text(f.get("flash_attn", ""))), n_ubatch=_int(f, "n_ubatch", None),
        n_batch=_int(f, "n_batch", None), source=origin,
        extra={k: _text(v) for k, v in f.items() if k not in used}, **shape)


_MISSING = object()


def _int(f: Mapping[str, Any], key: str, default: Any = _MISSING) -> Any:
    raw = f.get(key, _MISSING)
    if raw is _MISSING or raw == "":
        if default is _MISSING:
            raise _RowError(f"field {key} missing")
        return default
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    try:
        return int(str(raw).strip())
    except ValueError:
        raise _RowError(f"field {key}: {raw!r} is not a whole number") from None


def _number(key: str, raw: Any) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise _RowError(f"field {key}: {raw!r} is not a number") from None
    if isinstance(raw, bool) or not math.isfinite(value):
        raise _RowError(f"field {key}: {raw!r} is not a finite number")
    return value


def _rate(f: Mapping[str, Any], key: str, shown: str = "") -> float:
    """A throughput: present, numeric, finite and positive."""
    name = shown or key
    if f.get(key, "") == "":
        raise _RowError(f"field {name} missing")
    value = _number(name, f[key])
    if value <= 0:
        raise _RowError(f"field {name}: {f[key]!r} is not a positive rate")
    return value


def _text(v: Any) -> str:
    return ("1" if v else "0") if isinstance(v, bool) else str(v)


_GPU_BACKENDS = {"cuda": "CUDA", "rocm": "ROCm", "hip": "ROCm", "vulkan": "Vulkan",
                 "metal": "Metal", "sycl": "SYCL", "musa": "MUSA", "cann": "CANN",
                 "opencl": "OpenCL", "kompute": "Kompute"}
_CPU_BACKENDS = {"cpu", "blas", "accelerate", "openblas", "zendnn", "amx"}
_OLD_FLAGS = ("cuda", "vulkan", "kompute", "metal", "sycl", "opencl")


def _backend(f: Mapping[str, Any]) -> str:
    """The GPU backend of a run ("CUDA", "Metal,BLAS" -> "Metal"), "CPU" for CPU/BLAS.

    Before the ``backends`` field, llama-bench wrote one bool per backend."""
    raw = f.get("backends")
    if raw is None:
        flags = [k for k in _OLD_FLAGS if str(f.get(k, "")).lower() in ("true", "1")]
        if not flags and not any(k in f for k in _OLD_FLAGS):
            raise _RowError("field backends missing")
        raw = ",".join(flags) or "CPU"
    names = [n for n in re.split(r"[,+\s]+", str(raw)) if n]
    for name in names:
        if name.lower() in _GPU_BACKENDS:
            return _GPU_BACKENDS[name.lower()]
    others = [n for n in names if n.lower() not in _CPU_BACKENDS]
    return ",".join(others) if others else "CPU"


_QUANT = re.compile(r"\b(?:[IT]?Q\d\w*|B?F16|F32|MXFP4|NVFP4)\b")
_SIZE_SUFFIX = {"small": "_S", "medium": "_M", "large": "_L"}


def weight_format(model_type: str) -> str:
    """The weights' quantisation from llama-bench's model_type ("<arch> <size> <ftype>").

    "llama 7B Q4_0" -> "Q4_0", "Q4_K - Medium" -> "Q4_K_M", "all F32" -> "F32",
    "IQ2_XXS - 2.0625 bpw" -> "IQ2_XXS", "MXFP4 MoE" -> "MXFP4_MOE" (llama.cpp's
    MXFP4_MOE file type); "" when none is named."""
    ftype = re.sub(r"\((?:guessed)\)\s*|\b(?:mostly|all)\s+", "", model_type)
    m = _QUANT.search(ftype)
    if not m:
        return ""
    base, rest = m.group(0), ftype[m.end():].lower()
    if base == "IQ3_S" and rest.startswith(" mix"):
        return "IQ3_M"
    if base == "MXFP4" and rest.startswith(" moe"):
        return "MXFP4_MOE"
    size = re.match(r"\s*-\s*(small|medium|large)\b", rest)
    if size and not (base == "Q2_K" and size.group(1) == "medium"):
        return base + _SIZE_SUFFIX[size.group(1)]
    return base
