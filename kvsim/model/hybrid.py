"""vLLM's hybrid KV cache manager: KV cache groups of a sliding-window or Mamba-hybrid model.

Under vLLM v1 a model with full and sliding-window attention layers (Gemma 2/3, gpt-oss,
Cohere2 …) has its layers split into equal-size KV cache groups drawing pages from one pool;
a sliding group holds only the blocks still overlapping the window. One simulator block costs
``page × group_size`` bytes and a request takes blocks in every group.

A model with full attention beside recurrent (Mamba / Gated DeltaNet) layers is grouped the
same way (:func:`mamba_groups`): the attention block size is raised, in steps of
:data:`MAMBA_BLOCK_ALIGN` tokens, until its page holds one layer's recurrent state (the
convolution window in the model's 16-bit dtype, the SSM state in ``ssm_state_dtype``), a
Mamba page is padded to it, and a request holds ``ceil(max_model_len / block)`` blocks of
each attention group and :func:`mamba_blocks_per_group` blocks of each Mamba group.  vLLM
then logs "GPU KV cache size" as ``max_model_len × blocks / blocks per request`` (its
maximum concurrency times the context): vllm-011 (Qwen3.6-35B-A3B, vLLM 0.24.0) and vllm-007
(Qwen3.8-27B, TP 2) in ../shared/measurements/engine-memory-logs.csv print exactly that —
567,978 = 131,072 × 299 / 69 and 302,921 = 131,072 × 208 / 90 (tests/model/test_mamba_groups.py).

NOTE: the manager is off (every layer at full length) with
``disable_hybrid_kv_cache_manager``, a KV connector, chunked-local attention, or layouts it
cannot group; SGLang's full/SWA pool split is not modelled.
Design: docs/design/kv-cache.md (grouping and startup rules; after
docs/reference/engines.md §1.7).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.config.specs import ModelSpec
from kvsim.config.units import format_bytes
from kvsim.model.dtypes import cache_type
from kvsim.model.geometry import KvGeometry

MAMBA_BLOCK_ALIGN = 16
"""vLLM raises a Mamba hybrid's attention block size in multiples of this many tokens (its
default block size, the attention kernels' alignment)."""


@dataclass(frozen=True)
class KVCacheGroups:
    """The KV cache groups of one model under vLLM's hybrid manager.

    ``kinds`` holds one ``(kind, window_tokens)`` per group in vLLM's group order
    (``("full", 0)`` or ``("sliding", w)``); every group has ``layers_per_group``
    layers (padding included) and one block of it costs ``block_bytes``.
    """

    kinds: tuple[tuple[str, int], ...]
    layers_per_group: int
    page_bytes: int            # one block of one layer
    block_tokens: int
    padding_layers: int = 0    # groups × layers_per_group − real layers (vLLM warns)
    mamba_blocks: int = 0      # blocks one request holds in each ("mamba", 0) group

    @property
    def block_bytes(self) -> int:
        return self.page_bytes * self.layers_per_group

    @property
    def mamba(self) -> bool:
        return any(kind == "mamba" for kind, _ in self.kinds)

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return blocks_per_request(self.kinds, self.block_tokens, max_model_len,
                                  max_num_batched_tokens, self.mamba_blocks)


def blocks_per_request(kinds: tuple[tuple[str, int], ...], block_tokens: int,
                       max_model_len: int, max_num_batched_tokens: int,
                       mamba_blocks: int = 1) -> int:
    """Blocks one request of ``max_model_len`` tokens may hold at once over ``kinds``
    (vLLM ``max_memory_usage_bytes`` per group, in pages)."""
    total = 0
    for kind, window in kinds:
        if kind == "full":
            total += -(-max_model_len // block_tokens)
        elif kind == "mamba":
            total += mamba_blocks
        else:
            n = min(window - 1 + max_num_batched_tokens, max_model_len)
            total += -(-n // block_tokens) + 1
    return total


def _off_reason(model: ModelSpec, geo: KvGeometry) -> str | None:
    kinds = {g.kind for g in model.layer_groups}
    if "chunked" in kinds:
        return ("chunked-local attention: vLLM turns the hybrid KV cache manager off "
                "(VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE unset)")
    if kinds - {"full", "sliding"}:
        return "MLA or recurrent layers beside sliding ones are not grouped here"
    if len({g.bytes_per_token_per_layer for g in geo.groups}) != 1:
        return "full and sliding layers have unequal page sizes"
    if len({g.window_tokens for g in geo.windowed}) != 1:
        return "sliding layers with different windows are not grouped here"
    return None


def hybrid_off_reason(engine: Any) -> str | None:
    """Why the engine's own settings turn vLLM's hybrid manager off (None: they do not);
    a KV connector turns it off through the scenario (kvsim.scenario)."""
    if engine.preemption_mode == "swap":
        return "V0 swap preemption (V0 has no hybrid KV cache manager)"
    if engine.disable_hybrid_kv_cache_manager is True:
        return "the hybrid KV cache manager is disabled"
    return None


def _group_kinds(model: ModelSpec) -> tuple[list[tuple[str, int]], int, int]:
    """vLLM's group list over the layer types (in order of their first layer), the layers
    per group and the padding: groups of the fewest layers of a type, or of the most when
    that is under 1.5 times the fewest.  NOTE: one type per (kind, window), a recurrent
    layer being ``("mamba", 0)``; MLP-only layers hold nothing and form no group."""
    types: dict[tuple[str, int], list[int]] = {}
    for i, g in enumerate(model.layer_groups):
        if g.kind == "ffn":
            continue
        key = ("mamba", 0) if g.kind == "recurrent" else (g.kind, g.window_tokens or 0)
        first = min(g.layer_indices) if g.layer_indices else i * 10_000
        layers, seen = types.get(key, [0, first])
        types[key] = [layers + g.layers, min(seen, first)]
    counts = [n for n, _ in types.values()]
    size = min(counts)
    if max(counts) < 1.5 * size:
        size = max(counts)
    kinds: list[tuple[str, int]] = []
    for key, (n, _) in sorted(types.items(), key=lambda kv: kv[1][1]):
        kinds += [key] * -(-n // size)
    return kinds, size, len(kinds) * size - sum(counts)


def mamba_page_bytes(model: ModelSpec) -> int:
    """One recurrent layer's state as vLLM holds it: the convolution window in the model's
    16-bit dtype, the rest in ``ssm_state_dtype`` (16-bit when unset)."""
    g = next(g for g in model.layer_groups if g.kind == "recurrent")
    ssm = cache_type(model.ssm_state_dtype or "bf16").row_bytes(g.state_elements
                                                               - g.conv_state_elements)
    return 2 * g.conv_state_elements + ssm


def mamba_blocks_per_group(enable_prefix_caching: bool) -> int:
    """Blocks one request holds in each Mamba group: its running state, and with prefix
    caching a second one for the block-aligned state it caches (vLLM's "align" mode; the
    two logs of the module docstring need 2)."""
    return 2 if enable_prefix_caching else 1


def mamba_groups(model: ModelSpec, geo: KvGeometry, block_tokens: int,
                 mamba_blocks: int) -> tuple[KVCacheGroups | None, str | None]:
    """The KV cache groups of a full-attention + recurrent model (module docstring), or
    (None, why not)."""
    if {g.kind for g in geo.groups} != {"full"} or \
            len({g.bytes_per_token_per_layer for g in geo.groups}) != 1:
        return None, ("sliding-window or MLA layers beside recurrent ones are not grouped "
                      "here: the recurrent state is not counted")
    states = {(g.state_elements, g.conv_state_elements) for g in model.layer_groups
              if g.kind == "recurrent"}
    if len(states) != 1:
        return None, "recurrent layers of unequal states are not grouped here"
    per_token = geo.groups[0].bytes_per_token_per_layer
    mamba = mamba_page_bytes(model)
    step = MAMBA_BLOCK_ALIGN * per_token
    block = max(block_tokens, -(-mamba // step) * MAMBA_BLOCK_ALIGN)
    kinds, size, padding = _group_kinds(model)
    return KVCacheGroups(tuple(kinds), size, block * per_token, block, padding,
                         mamba_blocks), None


def vllm_kv_groups(model: ModelSpec, geo: KvGeometry, block_tokens: int,
                   disabled: str | None = None, mamba_blocks: int = 1
                   ) -> tuple[KVCacheGroups | None, str | None]:
    """vLLM's KV cache groups for ``model``, or (None, why the manager is off:
    ``disabled`` when given) — (None, None) for a model with neither sliding-window nor
    recurrent layers beside its attention ones.  ``mamba_blocks``: blocks a request holds
    in each Mamba group (:func:`mamba_blocks_per_group`)."""
    hybrid_mamba = geo.recurrent_layers > 0 and bool(geo.groups)
    if not geo.windowed and not hybrid_mamba:
        return None, None
    if disabled:
        return None, disabled
    if hybrid_mamba:
        return mamba_groups(model, geo, block_tokens, mamba_blocks)
    reason = _off_reason(model, geo)
    if reason:
        return None, reason
    kinds, size, padding = _group_kinds(model)
    page = block_tokens * geo.groups[0].bytes_per_token_per_layer
    return KVCacheGroups(tuple(kinds), size, page, block_tokens, padding), None


def hybrid_max_model_len(groups: KVCacheGroups, blocks: int, ctx: int, mnbt: int) -> int:
    """Largest max_model_len (≤ ``ctx``) whose one request fits ``blocks`` (0: none)."""
    lo, hi = 0, ctx
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if groups.blocks_per_request(mid, mnbt) <= blocks else (lo, mid - 1)
    return lo


def hybrid_refusal(groups: KVCacheGroups, ctx: int, per_req: int, blocks: int,
                   fit_len: int) -> str | None:
    """vLLM's start-up refusal when one ``ctx`` request needs more than the pool
    (``fit_len``: :func:`hybrid_max_model_len`)."""
    if per_req <= blocks:
        return None
    bb = groups.block_bytes
    return (f"To serve at least one request with the model's max seq len ({ctx}), "
            f"{format_bytes(per_req * bb)} KV cache is needed, which is larger than the "
            f"available KV cache memory ({format_bytes(blocks * bb)}). Based on the "
            f"available memory, the estimated maximum model length is "
            f"{fit_len}")


def hybrid_notes(geo: KvGeometry, groups: KVCacheGroups | None, off: str | None,
                 per_req: int, vllm: bool) -> list[str]:
    """The budget's note on how sliding-window layers are held."""
    if groups:
        n_swa = sum(k == "sliding" for k, _ in groups.kinds)
        n_mamba = sum(k == "mamba" for k, _ in groups.kinds)
        what = (f"{n_mamba} Mamba, attention blocks of {groups.block_tokens} tokens to hold "
                f"a layer's state, {groups.mamba_blocks} per Mamba group and request"
                if n_mamba else f"{n_swa} sliding-window")
        pad = (f" ({groups.padding_layers} padding layers, as vLLM warns)"
               if groups.padding_layers else "")
        return [(f"hybrid KV cache manager: {len(groups.kinds)} groups of "
                 f"{groups.layers_per_group} layers ({what}){pad}; one "
                 f"request holds at most {per_req} blocks of "
                 f"{format_bytes(groups.block_bytes)}")]
    if geo.recurrent_layers and geo.groups:
        return [f"recurrent state not counted in the KV pool: {off}"] if off else []
    if not geo.windowed:
        return []
    why = off if vllm else ("SGLang keeps them so for Gemma 2/3; its split into full and "
                            "SWA token pools (gpt-oss, Llama 4) is not modelled")
    return [f"sliding-window layers are held at full length: {why}"]


def too_long_refusal(ctx: int, tokens: int, groups: KVCacheGroups | None, per_req: int,
                     blocks: int, fit_len: int) -> str | None:
    """vLLM's refusal of a ``max_model_len`` one request could not hold (§1.1, §1.7).

    NOTE: paged_budget gives SGLang the same refusal; docs/reference/engines.md §2 does not
    say what SGLang does with a pool smaller than its context length.
    """
    if groups is not None:
        return hybrid_refusal(groups, ctx, per_req, blocks, fit_len)
    return None if tokens >= ctx else (
        f"The model's max seq len ({ctx}) is larger than the maximum number of "
        f"tokens that can be stored in KV cache ({tokens})")


def pool_shape(geo: KvGeometry, groups: KVCacheGroups | None, blocks: int, block: int,
               ctx: int, parallel: int, mnbt: int) -> tuple[int, int, int, float, int]:
    """(blocks a request holds (0: one group), logged pool tokens, KV bytes ``parallel``
    full-length requests need, concurrency, the largest max_model_len that starts)."""
    if groups is None:
        tokens = blocks * block
        padded = -(-ctx // block) * block
        return (0, tokens, parallel * geo.bytes_for_tokens(padded), tokens / ctx,
                min(ctx, tokens))
    # NOTE: vLLM logs a sliding-window model's pool as if every group held every token,
    # a Mamba hybrid's as max_model_len times its concurrency (module docstring)
    per_req = groups.blocks_per_request(ctx, mnbt)
    fit_len = ctx if per_req <= blocks else hybrid_max_model_len(groups, blocks, ctx, mnbt)
    tokens = blocks * ctx // per_req if groups.mamba else \
        blocks // len(groups.kinds) * groups.block_tokens
    return (per_req, tokens, parallel * per_req * groups.block_bytes, blocks / per_req,
            fit_len)
