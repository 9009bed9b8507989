"""Random-weight decoder layers with a model's real shapes, and KV storage formats.

Only :mod:`kvsim.calibrate.kernels` imports this module (torch is the optional extra
``calibrate``).  It builds what one engine step really runs for a GQA decoder —
RMSNorm, Q/K/V projections, attention over the KV cache, output projection, SwiGLU
MLP, and the LM head for each sequence's last token — with random weights, so timings
and memory follow the model's shapes without downloading it.

KV storage mirrors llama.cpp's cache types (``docs/reference/engines.md`` §0):

- ``f16``: half-precision K and V (2 bytes/value);
- ``q8_0``: blocks of 32 values = one f16 scale + 32 int8 (34 bytes per 32 values);
- ``q4_0``: blocks of 32 values = one f16 scale + 16 bytes of packed 4-bit codes
  (18 bytes per 32 values).

Quantized caches are dequantized to the compute dtype before attention (no fused
kernel), so the measured step times include the dequantization cost.

NOTE: rotary position embeddings are not applied: their cost is an element-wise
O(tokens × hidden) term, negligible next to the projections, and they do not change
which bytes are stored or read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

QBLOCK = 32
KV_DTYPES: tuple[str, ...] = ("f16", "q8_0", "q4_0")
BYTES_PER_VALUE = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


def quantize(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, ...]:
    """Store ``x`` (last dim a multiple of 32) as ``kind``; returns the stored tensors."""
    if kind == "f16":
        return (x.to(torch.float16),)
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // QBLOCK, QBLOCK)
    if kind == "q8_0":
        scale = blocks.abs().amax(dim=-1, keepdim=True) / 127.0
        codes = torch.round(blocks / torch.where(scale == 0, 1.0, scale)).to(torch.int8)
        return codes.reshape(x.shape), scale.squeeze(-1).to(torch.float16)
    if kind == "q4_0":
        idx = blocks.abs().argmax(dim=-1, keepdim=True)
        scale = torch.gather(blocks, -1, idx) / -8.0
        q = torch.round(blocks / torch.where(scale == 0, 1.0, scale)) + 8
        q = q.clamp(0, 15).to(torch.uint8)
        packed = q[..., : QBLOCK // 2] | (q[..., QBLOCK // 2:] << 4)
        return packed.reshape(*x.shape[:-1], x.shape[-1] // 2), scale.squeeze(-1).half()
    raise ValueError(kind)


def dequantize(stored: tuple[torch.Tensor, ...], kind: str, dtype: torch.dtype
               ) -> torch.Tensor:
    """Inverse of :func:`quantize` into ``dtype``."""
    if kind == "f16":
        return stored[0].to(dtype)
    codes, scale = stored
    if kind == "q8_0":
        blocks = codes.reshape(*codes.shape[:-1], -1, QBLOCK).to(dtype)
        return (blocks * scale.to(dtype).unsqueeze(-1)).reshape(codes.shape)
    packed = codes.reshape(*codes.shape[:-1], -1, QBLOCK // 2)
    q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).to(dtype) - 8
    out = q * scale.to(dtype).unsqueeze(-1)
    return out.reshape(*codes.shape[:-1], codes.shape[-1] * 2)


def stored_bytes(stored: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in stored)


class KvCache:
    """One layer's K and V for ``batch`` sequences of up to ``capacity`` tokens."""

    def __init__(self, kind: str, batch: int, n_kv: int, capacity: int, head_dim: int,
                 device: torch.device) -> None:
        self.kind = kind
        zeros = torch.zeros(batch, n_kv, capacity, head_dim, device=device)
        self.k = list(quantize(zeros, kind))
        self.v = list(quantize(zeros, kind))

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize and store new tokens at positions ``start`` ….(k: B, H, T, D)."""
        n = k.shape[2]
        for dst, src in ((self.k, quantize(k, self.kind)), (self.v, quantize(v, self.kind))):
            for d, s in zip(dst, src):
                d[:, :, start:start + n] = s

    def read(self, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        k = tuple(t[:, :, :length] for t in self.k)
        v = tuple(t[:, :, :length] for t in self.v)
        return dequantize(k, self.kind, dtype), dequantize(v, self.kind, dtype)

    def nbytes(self) -> int:
        return stored_bytes(tuple(self.k)) + stored_bytes(tuple(self.v))


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


class DecoderLayer:
    """One GQA decoder layer with random weights (no autograd)."""

    def __init__(self, s: LayerShape, device: torch.device, dtype: torch.dtype,
                 gen: torch.Generator) -> None:
        def w(rows: int, cols: int) -> torch.Tensor:
            t = torch.randn(rows, cols, generator=gen) * cols ** -0.5
            return t.to(device=device, dtype=dtype)

        self.s = s
        self.wq = w(s.n_heads * s.head_dim, s.hidden)
        self.wkv = w(2 * s.n_kv_heads * s.head_dim, s.hidden)
        self.wo = w(s.hidden, s.n_heads * s.head_dim)
        self.wgu = w(2 * s.intermediate, s.hidden)
        self.wd = w(s.hidden, s.intermediate)
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, cache: KvCache, start: int) -> torch.Tensor:
        """x: (B, T, hidden) new tokens at positions ``start`` …; returns (B, T, hidden)."""
        s = self.s
        b, t, _ = x.shape
        h = _rms(x, self.norm)
        q = (h @ self.wq.T).view(b, t, s.n_heads, s.head_dim).transpose(1, 2)
        kv = (h @ self.wkv.T).view(b, t, 2, s.n_kv_heads, s.head_dim)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        cache.write(start, k, v)
        keys, values = cache.read(start + t, x.dtype)
        mask = None
        if t > 1:
            pos_q = torch.arange(start, start + t, device=x.device)[:, None]
            mask = torch.arange(start + t, device=x.device)[None, :] <= pos_q
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        x = x + o.transpose(1, 2).reshape(b, t, -1) @ self.wo.T
        gate, up = (_rms(x, self.norm) @ self.wgu.T).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ self.wd.T


class LmHead:
    """Final norm + a vocabulary slice of the output projection (time scales by vocab)."""

    def __init__(self, s: LayerShape, vocab_slice: int, device: torch.device,
                 dtype: torch.dtype, gen: torch.Generator) -> None:
        self.scale = s.vocab / vocab_slice
        self.w = (torch.randn(vocab_slice, s.hidden, generator=gen) * s.hidden ** -0.5).to(
            device=device, dtype=dtype)
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)

    def forward(self, last: torch.Tensor) -> torch.Tensor:
        return _rms(last, self.norm) @ self.w.T


def attention_error(kind: str, n_heads: int, n_kv: int, head_dim: int, tokens: int,
                    device: torch.device, gen: torch.Generator) -> float:
    """Relative L2 error of one decode attention output with ``kind`` KV vs float32."""
    q = torch.randn(1, n_heads, 1, head_dim, generator=gen).to(device)
    k = torch.randn(1, n_kv, tokens, head_dim, generator=gen).to(device)
    v = torch.randn(1, n_kv, tokens, head_dim, generator=gen).to(device)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    kq = dequantize(quantize(k, kind), kind, torch.float32)
    vq = dequantize(quantize(v, kind), kind, torch.float32)
    out = F.scaled_dot_product_attention(q, kq, vq, enable_gqa=True)
    return float((out - ref).norm() / ref.norm())
