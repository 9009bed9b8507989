"""Number patterns and unit helpers shared by the engines' startup-log readers."""

from __future__ import annotations

NUM = r"([0-9]+(?:,[0-9]{3})*)"
"""An integer as engines print it, with or without thousands separators."""
FLOAT = r"([0-9]+(?:\.[0-9]+)?)"


def to_int(s: str) -> int:
    return int(s.replace(",", ""))


def mib_bytes(s: str) -> int:
    """Bytes of ``s`` MiB as printed (rounded to the byte)."""
    return round(float(s) * 2**20)
