"""Readers for the measurement layouts of ``docs/reference/measurements`` (detected from the header).

- ``llamabench-scoreboard.csv``: one row = pp512 and tg128 of one device × backend ×
  model file × flash-attention setting -> two :class:`Measurement` values;
- ``speed-vs-load.csv`` (long format, one metric per row): llama-bench prefill/decode
  versus KV depth, llama-batched-bench aggregates versus parallel sequences, and
  single-stream prompt-eval / generation speeds; link-bandwidth rows are not speeds
  of a model and are listed as skipped;
- an engine-speed file (``docs/reference/vllm-speed``): a serving engine's own speed
  figures, one :class:`~kvsim.validate.engine_speed.EngineSpeed` per row, replayed
  through ``kvsim simulate`` (:mod:`kvsim.validate.engine_speed`);
- ``engine-memory-logs.csv``: start-up memory figures, one
  :class:`~kvsim.validate.memlogs.MemoryMeasurement` per row (read by
  :mod:`kvsim.validate.memlogs`, compared with kvsim's load-time memory layout by
  :mod:`kvsim.validate.memlog_predict`).

A caller must know: values "as printed" may carry "(rounded)" or "(inferred)"
qualifiers; the number is read and the qualifier kept in ``extra``.  Every row of these
files was published before llama.cpp captured CUDA graphs on Volta and Turing (PR
#25749, 2026-07): their ``cuda_graphs_since`` is Ampere (:data:`PUBLISHED_GRAPHS_SINCE`).

NOTE: every row ends up as a Measurement (a MemoryMeasurement) or a Skipped with the row
id and the reason.
"""

from __future__ import annotations

import csv
import io
import re

from kvsim.errors import InputError
from kvsim.latency.backend import BACKENDS
from kvsim.validate.engine_speed import (
    ENGINE_SPEED,
    KNOWN_COLUMNS,
    EngineSpeed,
    read_engine_speed_rows,
)
from kvsim.validate.memlogs import MemoryMeasurement, read_memory_row
from kvsim.validate.records import Measurement, Skipped, flash_flag, split_knobs

PUBLISHED_GRAPHS_SINCE = "ampere"
"""The builds behind the published rows replayed CUDA graphs from Ampere on only
(kvsim.latency.backend.cuda_graphs)."""

CUBLAS_BUILD = "LLAMA_CUBLAS"
"""A row whose settings name this build flag ran a llama.cpp configured before 2024-03
(renamed LLAMA_CUDA then), so before MMQ became CUDA's default in 2024-06: its quantized
prompts dequantized for cuBLAS (kvsim.latency.prompt_family.MMQ_PP_FAMILY)."""

SCOREBOARD = ("id", "gpu", "backend", "model", "pp512_tps", "tg128_tps")
SPEED_VS_LOAD = ("id", "engine", "gpu", "model", "metric", "value", "unit")
MEMORY_LOGS = ("id", "engine", "engine_version", "gpu", "printed_figures")
KNOWN = {  # every column each layout has (docs/reference/measurements/README.md)
    "scoreboard": set(SCOREBOARD) | {"model_size_gib", "weight_format", "flash_attn", "ngl",
                                     "build", "source", "notes"},
    "speed-vs-load": set(SPEED_VS_LOAD) | {"weight_format", "kv_type", "settings",
                                           "context_or_depth", "batch_or_concurrency",
                                           "source", "notes"},
    "memory-logs": set(MEMORY_LOGS) | {"vram_total", "model", "weight_format", "settings",
                                       "latency_figures", "source", "date", "notes"},
    "engine-speed": KNOWN_COLUMNS,
}
_NUM = re.compile(r"[-+]?\d+(?:[.,]\d+)*(?:\.\d+)?")


def layout(header: list[str]) -> str | None:
    """Which of the layouts a CSV header is (None: none of them); an engine-speed file
    (kvsim.validate.engine_speed) has every speed-vs-load column too, so it goes first."""
    cols = set(header)
    for name, need in (("engine-speed", ENGINE_SPEED), ("scoreboard", SCOREBOARD),
                       ("speed-vs-load", SPEED_VS_LOAD), ("memory-logs", MEMORY_LOGS)):
        if set(need) <= cols:
            return name
    return None


def number(text: str) -> float | None:
    """The first number in ``text`` ("3890 (rounded)" -> 3890.0); None when there is none."""
    m = _NUM.search(text or "")
    return float(m.group(0).replace(",", "")) if m else None


def backend_name(text: str) -> str:
    """Normalise a printed backend ("HIP (rocWMMA)" -> ROCm, "Vulkan (RADV)" -> Vulkan)."""
    t = (text or "").lower()
    for key, name in (("cuda", "CUDA"), ("rocm", "ROCm"), ("hip", "ROCm"), ("vulkan", "Vulkan"),
                      ("metal", "Metal"), ("sycl", "SYCL"), ("cpu", "CPU"), ("blas", "CPU")):
        if key in t:
            return name
    return text.strip()


def _flags(text: str) -> dict[str, str]:
    """``-fa 1 -ub 2048`` / ``n_ubatch 2048, flash_attn 1`` settings as a mapping."""
    out: dict[str, str] = {}
    # NOTE: a value may be a negative number (``-ngl -1``), never another flag
    for key, val in re.findall(r"(-\w+|n_ubatch|n_batch|flash_attn)\s+(-\d[\w.]*|[\w.,/]+)",
                               text or ""):
        out[key] = val.rstrip(",")
    return out


def read_scoreboard(rows: list[dict[str, str]], origin: str) -> tuple[list[Measurement],
                                                                      list[Skipped]]:
    meas: list[Measurement] = []
    skipped: list[Skipped] = []
    for row in rows:
        rid = row.get("id") or origin
        common = dict(gpu=row["gpu"], backend=backend_name(row["backend"]), model=row["model"],
                      weight_format=(row.get("weight_format") or "").split(" ")[0],
                      flash_attn=flash_flag(row.get("flash_attn", "")),
                      source=row.get("source", ""), n_ubatch=512, n_batch=2048,
                      cuda_graphs_since=PUBLISHED_GRAPHS_SINCE)
        size = number(row.get("model_size_gib", ""))
        if size:
            common["model_size_bytes"] = int(size * 2**30)
        for col, metric, shape in (("pp512_tps", "pp_tps", dict(n_prompt=512)),
                                   ("tg128_tps", "tg_tps", dict(n_gen=128))):
            val = number(row.get(col, ""))
            if val is None or val <= 0:
                skipped.append(Skipped(f"{rid}:{col}", f"{col} is empty or not a number "
                                       f"({row.get(col, '')!r})"))
                continue
            meas.append(Measurement(id=f"{rid}:{metric.split('_')[0]}", metric=metric,
                                    value=val, extra={"as_printed": row.get(col, "")},
                                    **common, **shape))
    return meas, skipped


def _long_backend(engine: str, gpu: str) -> str:
    """The backend a long-format row ran on: named in parentheses after the engine
    ("llama.cpp llama-bench (ROCm)"), else Metal on an Apple device and CUDA elsewhere
    (the rows of ``speed-vs-load.csv`` name none)."""
    named = re.search(r"\(([^)]*)\)\s*$", engine or "")
    if named and backend_name(named.group(1)) in (*BACKENDS, "CPU"):
        return backend_name(named.group(1))
    return "Metal" if "apple" in gpu.lower() else "CUDA"


def _long_row(row: dict[str, str]) -> Measurement | Skipped:
    """One row of speed-vs-load.csv (module docstring)."""
    rid, metric, engine = row["id"], row["metric"], row["engine"]
    val = number(row["value"])
    unit = row.get("unit", "")
    if val is None:
        return Skipped(rid, f"value {row['value']!r} is not a number")
    if "tok/s" not in unit:
        what = "a link or copy bandwidth" if re.search(r"[GMK]i?B/s", unit) else \
            "the unit must be tok/s"
        return Skipped(rid, f"unit {unit!r} of metric {metric!r} is not a token throughput "
                       f"({what})")
    flags = _flags(row.get("settings", ""))
    try:
        split = split_knobs(flags.get("-sm", ""), flags.get("-ts", ""), flags.get("-mg", ""))
    except ValueError as e:
        return Skipped(rid, f"settings {row.get('settings')!r}: {e}")
    fa = flash_flag(flags.get("-fa", flags.get("flash_attn", "")))
    ub = number(flags.get("-ub", flags.get("n_ubatch", "")) or "")
    ngl = number(flags.get("-ngl", "") or "")
    depth = int(number(row.get("context_or_depth", "")) or 0)
    batch = int(number(row.get("batch_or_concurrency", "")) or 1)
    size = re.search(r"(\d+(?:\.\d+)?)\s*GiB\)?\s*$", row["model"].strip().rstrip(")"))
    base = dict(id=rid, gpu=row["gpu"], model=row["model"], value=val,
                model_size_bytes=int(float(size.group(1)) * 2**30) if size else None,
                weight_format=row.get("weight_format", ""), flash_attn=fa,
                n_ubatch=int(ub) if ub else 512, source=row.get("source", ""),
                gpu_layers=None if ngl is None else int(ngl),
                backend=_long_backend(engine, row["gpu"]),
                kv_type=(row.get("kv_type") or "f16").split(" ")[0],
                cuda_graphs_since=PUBLISHED_GRAPHS_SINCE, **split,
                cublas_prompts=CUBLAS_BUILD in row.get("settings", ""))
    m = re.match(r"(pp|tg)(\d+)_tps", metric)
    if "batched-bench" in engine:
        pp = int(number(row.get("context_or_depth", "")) or 0)
        tgm = re.search(r"TG=(\d+)", row.get("settings", ""))
        tg = int(tgm.group(1)) if tgm else 32
        if metric.startswith("S_PP"):
            return Measurement(metric="pp_tps", n_prompt=pp, batch=batch, **base)
        return Measurement(metric="tg_tps", n_gen=tg, depth=pp, batch=batch, **base)
    if m:
        n = int(m.group(2))
        shape = dict(n_prompt=n) if m.group(1) == "pp" else dict(n_gen=n)
        return Measurement(metric=f"{m.group(1)}_tps", depth=depth, **shape, **base)
    if metric.startswith("prompt_eval_tps_"):
        return Measurement(metric="pp_tps", n_prompt=int(number(metric) or 512), **base)
    if metric.startswith("avg_generation_tps_"):
        return Measurement(metric="tg_tps", n_gen=int(number(metric) or 128), **base)
    return Skipped(rid, f"metric {metric!r}: not a prefill or decode throughput kvsim predicts")


def read_speed_vs_load(rows: list[dict[str, str]], origin: str) -> tuple[list[Measurement],
                                                                         list[Skipped]]:
    meas, skipped = [], []
    for row in rows:
        got = _long_row(row)
        (meas if isinstance(got, Measurement) else skipped).append(got)
    return _shared_file_sizes(meas), skipped


def _file_key(m: Measurement) -> tuple[str, str, str]:
    return m.gpu, m.model.split(" (")[0].strip().lower(), m.weight_format.lower()


def _shared_file_sizes(meas: list[Measurement]) -> list[Measurement]:
    """A row without a printed model size takes the size another row printed for the
    same model file on the same device (llama-batched-bench prints none; llama-bench
    does, for the same file in the same source)."""
    from dataclasses import replace

    sizes = {_file_key(m): m.model_size_bytes for m in meas if m.model_size_bytes}
    return [m if m.model_size_bytes or _file_key(m) not in sizes
            else replace(m, model_size_bytes=sizes[_file_key(m)]) for m in meas]


def read_memory_logs(rows: list[dict[str, str]], origin: str
                     ) -> tuple[list[MemoryMeasurement], list[Skipped]]:
    """Every row that reads; a row with a bad number is a skipped row naming the row and
    the field (the others still validated). InputError when no row reads."""
    meas: list[MemoryMeasurement] = []
    skipped: list[Skipped] = []
    first: InputError | None = None
    for row in rows:
        try:
            meas.append(read_memory_row(row, origin))
        except InputError as exc:
            first = first or exc
            skipped.append(Skipped((row.get("id") or "").strip() or origin, exc.one_line()))
    if first is not None and not meas:
        raise first
    return meas, skipped


def read_shared_csv(text: str, origin: str
                    ) -> tuple[list[Measurement | MemoryMeasurement | EngineSpeed],
                               list[Skipped]] | None:
    """Measurements of a file in one of the layouts; None when it is none of them."""
    reader = csv.DictReader(io.StringIO(text))
    kind = layout(list(reader.fieldnames or []))
    if kind is None:
        return None
    rows = list(reader)
    if not rows:
        raise InputError(origin, "no rows", f"a {kind} CSV with at least one row")
    fn = {"scoreboard": read_scoreboard, "speed-vs-load": read_speed_vs_load,
          "memory-logs": read_memory_logs, "engine-speed": read_engine_speed_rows}[kind]
    meas, skipped = fn(rows, origin)  # type: ignore[operator]
    unknown = [c for c in reader.fieldnames or [] if c not in KNOWN[kind]]
    skipped += [Skipped(f"{origin}:column {c}", f"unknown column {c!r} of a {kind} CSV, not "
                        f"read (known: {', '.join(sorted(KNOWN[kind]))})") for c in unknown]
    return list(meas), skipped
