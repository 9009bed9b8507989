"""KV-cache storage types: exact bytes per element, as block layouts.

Every cache type is the block the engine really stores: ``block_elems`` values in
``block_bytes`` bytes (scales included), so bytes per element are an exact
:class:`fractions.Fraction` (q8_0 = 34/32) and a row of ``n`` values costs
``ceil(n / block_elems) * block_bytes`` — ggml's ``ggml_row_size``. fp8's per-tensor scales
are a fixed cost per model (:attr:`CacheType.tensor_scale_bytes`), never per token.

NOTE: sizes are exact integers for any row whose length is a multiple of the block; engines
reject quantized K rows that are not (docs/reference/engines.md §3.2).
Design: docs/design/memory-layout.md (every type's layout and source).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from kvsim.errors import unknown_name


@dataclass(frozen=True)
class CacheType:
    """One KV storage type as the engine lays it out."""

    name: str
    block_elems: int
    block_bytes: int
    tensor_scale_bytes: int = 0      # fixed per layer per K or V tensor (fp8 per-tensor scale)
    residual_tokens: int = 0         # newest tokens kept in f16 (KIVI)
    v_type: str | None = None        # type used when this name is given for V (exl2_q6)

    @property
    def bytes_per_element(self) -> Fraction:
        return Fraction(self.block_bytes, self.block_elems)

    @property
    def bits_per_element(self) -> Fraction:
        return self.bytes_per_element * 8

    def row_bytes(self, n_elems: int) -> int:
        """Bytes of one row of ``n_elems`` values (ggml_row_size)."""
        return -(-n_elems // self.block_elems) * self.block_bytes

    @property
    def quantized(self) -> bool:
        return self.name not in ("f32", "f16", "bf16")


def _kivi(bits: int, group: int = 32, residual: int = 128) -> CacheType:
    # bits per value + fp16 scale + fp16 zero point per group of `group` values.
    return CacheType(f"kivi_int{bits}", group, group * bits // 8 + 4, residual_tokens=residual)


_TYPES: dict[str, CacheType] = {t.name: t for t in (
    CacheType("f32", 1, 4),
    CacheType("f16", 1, 2),
    CacheType("bf16", 1, 2),
    CacheType("fp8", 1, 1, tensor_scale_bytes=4),
    CacheType("fp8_e4m3", 1, 1, tensor_scale_bytes=4),
    CacheType("fp8_e5m2", 1, 1, tensor_scale_bytes=4),
    CacheType("q8_0", 32, 34),
    CacheType("q5_1", 32, 24),
    CacheType("q5_0", 32, 22),
    CacheType("q4_1", 32, 20),
    CacheType("q4_0", 32, 18),
    CacheType("iq4_nl", 32, 18),
    CacheType("exl2_q8", 32, 34),
    CacheType("exl2_q6", 32, 34, v_type="exl2_q4"),
    CacheType("exl2_q4", 32, 18),
    CacheType("mlx_8bit", 64, 68),
    CacheType("mlx_4bit", 64, 36),
    _kivi(4),
    _kivi(2),
)}
ALIASES = {"fp16": "f16", "float16": "f16", "float32": "f32", "auto": "f16",
           "int8": "q8_0", "exl2_fp16": "f16"}


def cache_type_names() -> list[str]:
    return sorted(_TYPES)


def cache_type(name: str, field: str = "cache_type", role: str = "k") -> CacheType:
    """Look a cache type up by name; ``role='v'`` applies K/V-asymmetric layouts."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in _TYPES:
        raise unknown_name(field, name, cache_type_names())
    t = _TYPES[key]
    if role == "v" and t.v_type:
        return _TYPES[t.v_type]
    return t


def bytes_per_element(name: str, role: str = "k") -> Fraction:
    """Exact bytes per stored value: ``bytes_per_element('q8_0') == Fraction(17, 16)``."""
    return cache_type(name, role=role).bytes_per_element
