"""KV quantization policies (docs/reference/kv-policies.md §2).

The cache *storage type* of a whole engine (llama.cpp ``-ctk/-ctv`` incl. mixed K/V,
vLLM/SGLang ``--kv-cache-dtype``) is engine configuration (kvsim.engines.config);
its exact bytes come from kvsim.model.dtypes and its dequantization cost from the
latency model.  This module adds the KIVI-style policy (§2.1): tokens older than a
recent full-precision window of ``residual_tokens`` are quantized in groups of
``group_tokens`` to ``bits`` (b + 32/G bits per value with an fp16 scale and an fp16
zero point per group of G: :meth:`KiviConfig.bytes_per_element`, §2.1(b); G = 32 is
``kivi_int{bits}`` in kvsim.model.dtypes), shrinking their GPU bytes exactly
(QUANT(b), no host copy: the error is permanent).  Quantized tokens are read at
their quantized bytes and pay a dequantization cost on every read: the latency
model's ``kv_dequant_factor`` × the time to read those bytes (kvsim.latency.roofline,
kvsim.policies.runtime).

:func:`nominal_bits` maps a cache type to the bit width the accuracy proxy uses
(§6.4 rows are by nominal bits: KIVI-2 at ~3 b_eff is the "2-bit grouped" row).
"""

from __future__ import annotations

from fractions import Fraction
from typing import ClassVar, Literal

from pydantic import Field

from kvsim.core.kv.slots import Slot
from kvsim.policies.base import Evictor
from kvsim.policies.registry import PolicyBase, register_policy

_BITS = {"f32": 32, "f16": 16, "bf16": 16, "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8,
         "q8_0": 8, "exl2_q8": 8, "mlx_8bit": 8, "q5_0": 5, "q5_1": 5, "q4_0": 4, "q4_1": 4,
         "iq4_nl": 4, "exl2_q4": 4, "mlx_4bit": 4, "kivi_int4": 4, "kivi_int2": 2}


def nominal_bits(cache_type_k: str, cache_type_v: str | None = None) -> float:
    """Lowest nominal bit width of the K/V storage types (exl2_q6 stores V at 4 bits)."""
    k = cache_type_k.lower()
    v = (cache_type_v or cache_type_k).lower()
    v = "exl2_q4" if v == "exl2_q6" else v
    k = "exl2_q8" if k == "exl2_q6" else k
    return float(min(_BITS.get(k, 16), _BITS.get(v, 16)))


@register_policy
class KiviConfig(PolicyBase):
    """KIVI: quantize tokens older than a full-precision residual window."""

    kind: Literal["kivi"] = "kivi"
    bits: Literal[2, 4] = 2
    group_tokens: int = Field(32, gt=0, description="G: tokens per quantization group")
    residual_tokens: int = Field(128, ge=0, description="R: newest tokens kept in f16")
    sink_tokens: int = Field(0, ge=0, description="leading tokens kept in f16")
    pin_system_prompt: bool = False
    pin_turn_boundaries: bool = False  # KIVI quantizes every old token alike
    boundary_tokens: int = Field(4, ge=0)
    evicts: ClassVar[bool] = True
    host_backed: ClassVar[bool] = False  # the error is permanent: no host copy
    demotes: ClassVar[bool] = True
    size_field: ClassVar[str] = "residual_tokens"  # the key an over-size error names

    @property
    def cache_type(self) -> str:
        return f"kivi_int{self.bits}"

    def bytes_per_element(self) -> Fraction:
        """Exact bytes per stored value: b/8 + (2 + 2 bytes of fp16 scale and zero) / G,
        i.e. b + 32/G bits (2-bit: G=32 → 3 bits, G=128 → 2.25 bits)."""
        return Fraction(self.bits, 8) + Fraction(4, self.group_tokens)

    @property
    def chunk_tokens(self) -> int:
        return self.group_tokens

    @property
    def page_tokens(self) -> int:
        return 1

    def global_budget_tokens(self) -> int | None:
        return None

    def keep_recent(self) -> int:
        return self.residual_tokens

    def size_tokens(self) -> int:
        return self.residual_tokens

    def quiet_steps(self, n: int, pin: int, wm: int) -> int:
        """Decode steps before a demotion may act (``wm``: the slot's watermark)."""
        return wm + self.residual_tokens + self.chunk_tokens - n - 1

    def act(self, evictor: Evictor, slot: Slot, now_s: float) -> None:
        evictor.demote_old(slot, now_s)
