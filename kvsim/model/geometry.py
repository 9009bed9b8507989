"""KV geometry: how many bytes one sequence's cache costs, per layer group.

``docs/reference/engines.md`` §0 and ``docs/reference/hardware-and-models.md`` §2 give the
arithmetic this module implements exactly:

- **full** attention layers grow with context: per token and layer
  ``n_kv_heads * (row(head_dim_k) in K type + row(head_dim_v) in V type)``;
- **sliding** / **chunked** layers have the same per-token cost but a sequence never
  needs more than ``window_tokens`` of them (chunked: at most one chunk);
- **mla** layers store one latent of ``latent_dim`` values per token (K type), no V;
- **recurrent** layers hold a fixed state of ``state_elements`` values per sequence,
  independent of context (f32 in llama.cpp; the caller picks ``state_dtype``);
- **ffn** layers (MLP / MoE only) hold nothing.

For ``T`` tokens of one sequence (:meth:`KvGeometry.bytes_for_tokens`)::

    full_bytes_per_token * T + sum_w(bytes_per_token_w * min(T, window_w))
        + recurrent_bytes_per_seq

KIVI types keep the newest ``residual_tokens`` at f16; fp8 adds per-tensor scales that
are a fixed cost per model instance (:attr:`KvGeometry.fixed_bytes`), not per token.

NOTE: every byte count here is an exact integer; nothing is rounded to blocks or
pages — that is the engine's job (kvsim.engines.budget, kvsim.core).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvsim.config.specs import ATTENTION_KINDS, LayerGroup, ModelSpec
from kvsim.model.dtypes import CacheType, cache_type


@dataclass(frozen=True)
class GroupBytes:
    """The KV cost of one attention layer group (all its layers together)."""

    kind: str                          # full | sliding | chunked | mla
    layers: int
    bytes_per_token: int               # K + V of all layers in the group, per token
    window_tokens: int | None = None   # None: grows with context
    residual_bytes_per_token: int = 0  # rate of the f16 residual tokens (KIVI); else = above

    @property
    def bytes_per_token_per_layer(self) -> int:
        return self.bytes_per_token // self.layers

    @property
    def cap_bytes_per_seq(self) -> int | None:
        """Most bytes one sequence can hold in this group (None if unbounded)."""
        return None if self.window_tokens is None else self.bytes_per_token * self.window_tokens


@dataclass(frozen=True)
class KvGeometry:
    """Per-token and per-sequence KV bytes of one model at one K/V cache type pair.

    Attributes other modules rely on:

    - ``full_bytes_per_token``: bytes per token of the layers that grow with context
      (full attention + MLA latents), all layers, K and V.
    - ``windowed``: the sliding/chunked groups, each with ``bytes_per_token`` and
      ``window_tokens``; ``windowed_bytes_per_token`` / ``windowed_cap_bytes_per_seq``
      sum them.
    - ``recurrent_bytes_per_seq``: fixed recurrent state per sequence (``state_dtype``).
    - ``kv_bytes_per_token``: one token in *every* attention layer (full + windowed) —
      the per-token cost while a sequence is shorter than every window, and what an
      engine pays per cell when it allocates all layers at full length.
    - ``bytes_for_tokens(n)``: exact bytes of one sequence holding ``n`` tokens.
    """

    model_name: str
    cache_type_k: str
    cache_type_v: str
    state_dtype: str
    groups: tuple[GroupBytes, ...]
    recurrent_layers: int
    recurrent_state_elements: int      # per sequence, summed over recurrent layers
    recurrent_bytes_per_seq: int
    residual_tokens: int = 0           # KIVI: newest tokens kept at f16
    fixed_bytes: int = 0               # fp8 per-tensor scales, once per model instance

    @property
    def full_bytes_per_token(self) -> int:
        return sum(g.bytes_per_token for g in self.groups if g.window_tokens is None)

    @property
    def full_layers(self) -> int:
        """Layers whose tokens attend every key before them (no window)."""
        return sum(g.layers for g in self.groups if g.window_tokens is None)

    @property
    def windowed(self) -> tuple[GroupBytes, ...]:
        return tuple(g for g in self.groups if g.window_tokens is not None)

    @property
    def windowed_bytes_per_token(self) -> int:
        return sum(g.bytes_per_token for g in self.windowed)

    @property
    def windowed_cap_bytes_per_seq(self) -> int:
        return sum(g.bytes_per_token * (g.window_tokens or 0) for g in self.windowed)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.full_bytes_per_token + self.windowed_bytes_per_token

    @property
    def attention_layers(self) -> int:
        return sum(g.layers for g in self.groups)

    def rates(self, windows_capped: bool = True) -> dict[str, Any]:
        """What an engine's cache costs per token and per sequence (``kvsim fit``).

        ``kv_bytes_per_token`` is the cache that grows with context
        (docs/reference/hardware-and-models.md §2,
        docs/reference/models.csv ``kv_bytes_per_token_fp16``): the
        full-attention layers, or every attention layer where the engine holds the
        sliding-window ones at full length (``windows_capped=False``).  The windowed
        layers are then counted apart: ``kv_windowed_bytes_per_token`` for the newest
        ``kv_window_tokens`` of a sequence, ``kv_windowed_cap_bytes_per_seq`` at most.
        """
        capped = windows_capped and bool(self.windowed)
        return {"kv_bytes_per_token": self.full_bytes_per_token if capped
                else self.kv_bytes_per_token,
                "kv_windowed_bytes_per_token": self.windowed_bytes_per_token if capped else 0,
                "kv_window_tokens": sorted({g.window_tokens or 0 for g in self.windowed})
                if capped else [],
                "kv_windowed_cap_bytes_per_seq": self.windowed_cap_bytes_per_seq
                if capped else 0,
                "kv_windowed_at_full_length": bool(self.windowed) and not capped,
                "kv_recurrent_bytes_per_seq": self.recurrent_bytes_per_seq}

    def windows_read_as(self, cells: Callable[[int], int]) -> KvGeometry:
        """This geometry with each sliding group's window replaced by ``cells(window)``.

        The latency model reads and attends a windowed layer's cells through its groups
        (kvsim.latency.roofline). An engine whose attention kernel walks more cells than
        the window passes its own count here, as llama.cpp's SWA ring does
        (kvsim.engines.llama_cpp.swa_read_geometry). Chunked groups are unchanged.
        NOTE: for reads only; memory comes from the engine's layout, never from this."""
        return replace(self, groups=tuple(
            replace(g, window_tokens=cells(g.window_tokens))
            if g.kind == "sliding" and g.window_tokens else g for g in self.groups))

    def bytes_for_tokens(self, n_tokens: int) -> int:
        """Exact bytes of one sequence holding ``n_tokens`` tokens (plus its state)."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        total = self.recurrent_bytes_per_seq if n_tokens > 0 else 0
        for g in self.groups:
            held = n_tokens if g.window_tokens is None else min(n_tokens, g.window_tokens)
            resid = min(held, self.residual_tokens)
            total += (held - resid) * g.bytes_per_token + resid * g.residual_bytes_per_token
        return total

    def bytes_for_token_array(self, n: np.ndarray) -> np.ndarray:
        """:meth:`bytes_for_tokens` of every element of ``n`` (float64; the same values:
        integer-exact below 2**53).  NOTE: the latency models' numpy decode path."""
        n = np.asarray(n, dtype=np.int64)
        total = np.where(n > 0, self.recurrent_bytes_per_seq, 0).astype(np.float64)
        for g in self.groups:
            held = n if g.window_tokens is None else np.minimum(n, g.window_tokens)
            resid = np.minimum(held, self.residual_tokens)
            total = total + (held - resid) * g.bytes_per_token \
                + resid * g.residual_bytes_per_token
        return total

    def attended_pairs(self, ctx_after: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Layer-weighted query-key pairs of ``new`` tokens ending at ``ctx_after``: a
        full-attention layer's tokens attend every key before them, a sliding one's at
        most its window.  NOTE: the latency models' numpy decode path (the scalar twin
        is kvsim.latency.roofline's ``_shape``): the same floats, element by element."""
        c0 = ctx_after - new
        pairs = self.full_layers * (new * c0 + new * (new + 1) / 2.0)
        for g in self.groups:
            if g.window_tokens is not None:
                w = g.window_tokens
                pairs = pairs + g.layers * (_keys(ctx_after, w) - _keys(c0, w))
        return pairs


def _keys(a: np.ndarray, w: float) -> np.ndarray:
    """Sum over positions ``q = 1..a`` of ``min(q, w)`` keys attended."""
    return np.where(a <= w, a * (a + 1) / 2.0, w * (w + 1) / 2.0 + (a - w) * w)


def _attn_layer_bytes(g: LayerGroup, k: CacheType, v: CacheType) -> int:
    if g.kind == "mla":
        return k.row_bytes(g.latent_dim)
    return g.n_kv_heads * (k.row_bytes(g.head_dim_k) + v.row_bytes(g.head_dim_v))


def _group_bytes(g: LayerGroup, k: CacheType, v: CacheType) -> GroupBytes:
    f16 = cache_type("f16")
    per_layer = _attn_layer_bytes(g, k, v)
    resid = _attn_layer_bytes(g, f16, f16) if k.residual_tokens or v.residual_tokens \
        else per_layer
    window = g.window_tokens if g.kind in ("sliding", "chunked") else None
    return GroupBytes(kind=g.kind, layers=g.layers, bytes_per_token=per_layer * g.layers,
                      window_tokens=window, residual_bytes_per_token=resid * g.layers)


def kv_geometry(model: ModelSpec, cache_type_k: str = "f16", cache_type_v: str = "f16",
                state_dtype: str = "f32") -> KvGeometry:
    """KV bytes of ``model`` with K stored as ``cache_type_k`` and V as ``cache_type_v``.

    ``state_dtype`` is the recurrent-state storage type (llama.cpp: always f32;
    ``docs/reference/models.csv`` quotes it at f16).  Unknown type names raise InputError.
    """
    k = cache_type(cache_type_k, "cache_type_k", role="k")
    v = cache_type(cache_type_v, "cache_type_v", role="v")
    state = cache_type(state_dtype, "state_dtype")
    groups = tuple(_group_bytes(g, k, v) for g in model.layer_groups
                   if g.kind in ATTENTION_KINDS)
    rec = [g for g in model.layer_groups if g.kind == "recurrent"]
    rec_layers = sum(g.layers for g in rec)
    rec_elems = sum(g.state_elements * g.layers for g in rec)
    rec_bytes = sum(state.row_bytes(g.state_elements) * g.layers for g in rec)
    n_tensor_layers = sum(g.layers for g in model.layer_groups if g.kind in ATTENTION_KINDS)
    n_v = sum(g.layers for g in model.layer_groups if g.kind in ATTENTION_KINDS - {"mla"})
    fixed = k.tensor_scale_bytes * n_tensor_layers + v.tensor_scale_bytes * n_v
    return KvGeometry(
        model_name=model.name, cache_type_k=k.name, cache_type_v=v.name,
        state_dtype=state.name, groups=groups, recurrent_layers=rec_layers,
        recurrent_state_elements=rec_elems, recurrent_bytes_per_seq=rec_bytes,
        residual_tokens=max(k.residual_tokens, v.residual_tokens), fixed_bytes=fixed)
