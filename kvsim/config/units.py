"""Unit strings → SI numbers.

Users write "24 GiB", "25 GB/s", "5 ms", "1.5k tokens"; everything inside kvsim is
SI: bytes, seconds, bytes per second, FLOP/s.  Decimal prefixes (kB, MB, GB, TB)
are powers of 1000, binary ones (KiB, MiB, GiB, TiB) powers of 1024, exactly as
the engines print them (llama.cpp prints MiB, vLLM prints GiB, PCIe specs GB/s).

NOTE: plain numbers are accepted and taken as already SI (bytes, seconds, B/s).
"""

from __future__ import annotations

import functools
import math
import re
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from kvsim.errors import InputError

_BYTE_UNITS = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
}
_AMBIGUOUS_BYTE_UNITS = {"k": "K", "m": "M", "g": "G", "t": "T"}
"""A bare K/M/G/T is refused: llama.cpp, Ollama and nvidia-smi mean binary units by it,
other tools decimal ones; the user says which."""
_TIME_UNITS = {
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9,
    "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}
# NOTE: counts are tokens and slots, and "32k" of context is 32,768 to every engine's
# users (llama.cpp, Ollama, vLLM docs): k/M mean 1024/1024², as Ki/Mi do
_COUNT_UNITS = {"": 1, "k": 2**10, "m": 2**20, "ki": 2**10, "mi": 2**20}
_NUM = r"([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?)"
_PATTERN = re.compile(rf"^\s*{_NUM}\s*([A-Za-zµ/]*)\s*$")


def _split(text: str, field: str, kind: str, example: str) -> tuple[float, str]:
    m = _PATTERN.match(text)
    if not m:
        raise InputError(field, text, f"not a {kind}; write e.g. '{example}'")
    return float(m.group(1)), m.group(2).lower()


def _finite_nonneg(x: float, field: str, raw: Any, kind: str) -> float:
    if not math.isfinite(x) or x < 0:
        raise InputError(field, raw, f"{kind} must be a finite number >= 0")
    return x


def check_finite_positive(field: str, value: Any, allowed: str = "a finite number > 0"
                          ) -> None:
    """Refuse ``value`` unless it is a number in (0, inf): NaN, inf, bools and
    non-positive numbers name ``field`` with ``allowed``."""
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0 < value < math.inf:
        raise InputError(field, value, allowed)


def parse_bytes(value: Any, field: str = "bytes") -> int:
    """'24 GiB' → 25769803776; '512 MB' → 512000000; 1024 → 1024 (already bytes)."""
    if isinstance(value, bool):
        raise InputError(field, value, "a byte size such as '24 GiB' or an integer")
    if isinstance(value, (int, float)):
        return round(_finite_nonneg(float(value), field, value, "a byte size"))
    if not isinstance(value, str):
        raise InputError(field, value, "a byte size such as '24 GiB' or an integer")
    num, unit = _split(value, field, "byte size", "24 GiB")
    if unit in _AMBIGUOUS_BYTE_UNITS:
        p = _AMBIGUOUS_BYTE_UNITS[unit]
        raise InputError(field, value, f"say which unit '{p}' is: {num:g} {p}iB (binary, "
                         f"what llama.cpp, Ollama and nvidia-smi print) or {num:g} {p}B "
                         "(decimal)")
    if unit not in _BYTE_UNITS:
        raise InputError(field, value, "unit must be one of B, kB, MB, GB, TB, KiB, MiB, GiB, TiB")
    return round(_finite_nonneg(num * _BYTE_UNITS[unit], field, value, "a byte size"))


def parse_bandwidth(value: Any, field: str = "bandwidth") -> float:
    """'25 GB/s' → 25e9 bytes/s; '1.5 TB/s' → 1.5e12; plain numbers are bytes/s."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(field, value, "a bandwidth such as '25 GB/s'")
    if not isinstance(value, str):
        return _finite_nonneg(float(value), field, value, "a bandwidth")
    num, unit = _split(value, field, "bandwidth", "25 GB/s")
    if not unit.endswith("/s"):
        raise InputError(field, value, "bandwidth needs a per-second unit, e.g. '25 GB/s'")
    base = unit[:-2]
    if base not in _BYTE_UNITS:
        raise InputError(field, value, "unit must be B/s, kB/s, MB/s, GB/s, TB/s or KiB/s..TiB/s")
    return _finite_nonneg(num * _BYTE_UNITS[base], field, value, "a bandwidth")


def parse_duration(value: Any, field: str = "duration") -> float:
    """'5 ms' → 0.005; '2s' → 2.0; '30 min' → 1800.0; plain numbers are seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(field, value, "a duration such as '5 ms' or '2 s'")
    if not isinstance(value, str):
        return _finite_nonneg(float(value), field, value, "a duration")
    num, unit = _split(value, field, "duration", "150 ms")
    if unit == "":
        return _finite_nonneg(num, field, value, "a duration")
    if unit not in _TIME_UNITS:
        raise InputError(field, value, "unit must be one of ns, us, ms, s, min, h, d")
    return _finite_nonneg(num * _TIME_UNITS[unit], field, value, "a duration")


def parse_count(value: Any, field: str = "count") -> int:
    """'32k' → 32768 (token counts in k mean 1024, as engines use them); '32Ki' → 32768;
    '1M' → 1048576; 4096 → 4096.  Token counts, slots, etc."""
    if isinstance(value, bool):
        raise InputError(field, value, "an integer count such as 4096 or '32Ki'")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise InputError(field, value, "an integer count")
        return int(value)
    if not isinstance(value, str):
        raise InputError(field, value, "an integer count such as 4096 or '32Ki'")
    num, unit = _split(value, field, "count", "32768")
    if unit not in _COUNT_UNITS:
        raise InputError(field, value, "suffix must be k, M, Ki or Mi")
    out = num * _COUNT_UNITS[unit]
    if not out.is_integer():
        raise InputError(field, value, "an integer count")
    return int(out)


def format_bytes(n: float) -> str:
    """Human form in binary units, as engines print memory: '17.00 MiB'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def format_duration(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.1f} µs"


def format_latency(s: float) -> str:
    """A latency as people read it (benchmark_serving, GuideLLM): milliseconds below 10 s
    ('38.9 ms', '1,980 ms'), seconds above ('14.0 s'); '-' when unknown."""
    if math.isnan(s):
        return "-"
    if s < 10:
        ms = s * 1e3
        return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"
    return f"{s:.1f} s" if s < 100 else f"{s:,.0f} s"


def humanize_duration(s: float) -> str:
    """A span of time in the two largest units: '12.3 s', '4 min 3 s', '23 h 26 min',
    '3 d 4 h'."""
    if math.isnan(s):
        return "-"
    if s < 60:
        return f"{s:.1f} s"
    whole = round(s)
    for big, size, small, sub in (("d", 86400, "h", 3600), ("h", 3600, "min", 60),
                                  ("min", 60, "s", 1)):
        if whole >= size:
            return f"{whole // size} {big} {(whole % size) // sub} {small}"
    return f"{s:.1f} s"


# Pydantic field types that accept unit strings and store SI numbers.
Bytes = Annotated[int, BeforeValidator(lambda v: parse_bytes(v, "bytes"))]
BytesPerS = Annotated[float, BeforeValidator(lambda v: parse_bandwidth(v, "bandwidth"))]
Seconds = Annotated[float, BeforeValidator(lambda v: parse_duration(v, "duration"))]
Count = Annotated[int, BeforeValidator(lambda v: parse_count(v, "count"))]


@functools.cache
def _numeric(annotation: Any) -> bool:
    """Whether a field's type is a number (int/float, optionally ``| None``), not a bool."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return bool(args) and all(_numeric(a) for a in args)
    return annotation in (int, float)


class FrozenModel(BaseModel):
    """Base of kvsim's frozen input models: unknown keys are errors, numbers are finite
    (no ``.inf``/``.nan``), and a YAML ``true``/``false`` is never taken as a number
    (pydantic would read it as 1/0)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for key, value in raw.items():
                field = cls.model_fields.get(key) if isinstance(value, bool) else None
                if field is not None and _numeric(field.annotation):
                    raise InputError(str(key), value, "a number, not true/false")
        return raw
