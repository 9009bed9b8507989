"""Model profiles from a local Hugging Face ``config.json`` or a GGUF file header.

Both importers read only metadata — the GGUF reader (the ``gguf`` package) maps the
file and parses the key/value header and tensor descriptors; tensor data is never
read.  Layer layouts follow ``docs/reference/hardware-and-models.md`` §2:

- sliding windows: ``layer_types`` lists, Gemma 2 (even layers local), Gemma 3
  (global iff ``(i+1) % sliding_window_pattern == 0``), gpt-oss (even layers local),
  otherwise every layer when a window is set and not disabled;
- Llama 4 chunked attention (``attention_chunk_size``, ``no_rope_layers``);
- Gemma 4's full-attention layers: ``global_head_dim``, and ``num_global_key_value_heads``
  where ``attention_k_eq_v`` (as HF Gemma4; K and V both cached), else the sliding layers';
- MLA latent = ``kv_lora_rank + qk_rope_head_dim``;
- recurrent state per layer, the SSM state plus the convolution window of ``d_conv - 1``
  columns (llama.cpp ``n_embd_s`` / ``n_embd_r``; vLLM's conv state has ``conv_kernel - 1``
  rows): Mamba-1/Jamba ``d_inner*d_state + (d_conv-1)*d_inner``, Mamba-2 and Nemotron-H
  ``nheads*headdim*d_state + (d_conv-1)*(d_inner + 2*ngroups*d_state)`` (Nemotron-H's
  ``d_inner = mamba_num_heads*mamba_head_dim``), Gated DeltaNet
  ``v_heads*k_dim*v_dim + (kernel-1)*(2*k_heads*k_dim + v_heads*v_dim)``; the window's
  part is kept as ``conv_state_elements``;
- Nemotron-H's ``hybrid_override_pattern``: ``M`` Mamba-2, ``*`` attention, ``E`` / ``-``
  MoE / MLP-only layers (``ffn``: no cache); a GGUF's per-layer KV heads and FFN widths
  tell the same apart (no KV heads and no FFN: recurrent).

``params_total`` comes from the GGUF tensor shapes; config.json has no parameter count, so
it is estimated and marked in ``notes``; its ``vision_config``: kvsim.model.vision.

NOTE: every problem with the input file is an InputError naming the file, field, expectation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvsim.config.files import no_such_file
from kvsim.config.specs import ModelSpec
from kvsim.errors import InputError, from_validation_error
from kvsim.model.import_checks import check_gguf_sizes, check_hf_sizes, ffn_widths, hf_params
from kvsim.model.vision import vision_from_hf

NO_POSITION_LIMIT_TOKENS = 1048576   # same planning cap as the shipped Mamba-2 profile


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "imported-model"


def _attn(kind: str, idx: list[int], kv: int, hk: int, hv: int, window: int | None = None
          ) -> dict[str, Any]:
    g: dict[str, Any] = {"kind": kind, "layers": len(idx), "layer_indices": idx,
                         "n_kv_heads": kv, "head_dim_k": hk, "head_dim_v": hv}
    if window:
        g["window_tokens"] = window
    return g


def _split(kinds: list[str], kv: int, hk: int, hv: int, window: int | None,
           state: tuple[int, int] = (0, 0), full: tuple[int, int] | None = None
           ) -> list[dict[str, Any]]:
    """Layer groups from a per-layer kind list (full/sliding/chunked/recurrent/ffn);
    ``state``: a recurrent layer's (state elements, of which the convolution window's);
    ``full``: the full-attention layers' own (KV heads, head_dim) where they differ."""
    groups: list[dict[str, Any]] = []
    for kind in ("full", "sliding", "chunked", "recurrent", "ffn"):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if not idx:
            continue
        if kind == "recurrent":
            groups.append({"kind": kind, "layers": len(idx), "layer_indices": idx,
                           "state_elements": state[0], "conv_state_elements": state[1]})
        elif kind == "ffn":
            groups.append({"kind": kind, "layers": len(idx), "layer_indices": idx})
        elif kind == "full" and full:
            groups.append(_attn(kind, idx, full[0], full[1], full[1]))
        else:
            groups.append(_attn(kind, idx, kv, hk, hv, window if kind != "full" else None))
    return groups


def _build(data: dict[str, Any], where: str) -> ModelSpec:
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=where) from None


# ---------------------------------------------------------------- config.json


def _need(cfg: dict[str, Any], keys: tuple[str, ...], where: str) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    raise InputError(where, keys[0], "missing from config.json (needed for the KV geometry)")


def _mamba2_state(nheads: int, hd: int, d_state: int, groups: int, conv: int
                  ) -> tuple[int, int]:
    """(state, window) of a Mamba-2 mixer: heads x head_dim x d_state, and ``conv - 1``
    columns of d_inner + 2 x groups x d_state."""
    window = (conv - 1) * (nheads * hd + 2 * groups * d_state)
    return nheads * hd * d_state + window, window


def _hf_state(cfg: dict[str, Any], mtype: str, hidden: int, where: str) -> tuple[int, int]:
    """(state elements per recurrent layer, of which the convolution window's)."""
    if mtype == "nemotron_h":
        heads, hd, d_state, groups = (int(_need(cfg, (k,), where)) for k in (
            "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups"))
        return _mamba2_state(heads, hd, d_state, groups, int(cfg.get("conv_kernel", 4)))
    if mtype == "mamba2":
        d_inner, hd = cfg.get("expand", 2) * hidden, cfg.get("head_dim", 64)
        return _mamba2_state(cfg.get("num_heads", d_inner // hd), hd,
                             cfg.get("state_size", 128), cfg.get("n_groups", 1),
                             cfg.get("conv_kernel", 4))
    if mtype in ("mamba", "jamba"):
        d_inner = cfg.get("mamba_expand", cfg.get("expand", 2)) * hidden
        window = d_inner * (cfg.get("mamba_d_conv", cfg.get("conv_kernel", 4)) - 1)
        return d_inner * cfg.get("mamba_d_state", cfg.get("state_size", 16)) + window, window
    if "linear_num_value_heads" in cfg:   # Gated DeltaNet (Qwen3-Next, Qwen3.5/3.6)
        vh, kh, kd, vd = (_need(cfg, (k,), where) for k in (
            "linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
            "linear_value_head_dim"))
        window = (cfg.get("linear_conv_kernel_dim", 4) - 1) * (2 * kh * kd + vh * vd)
        return vh * kd * vd + window, window
    return 0, 0


def _global_attn(cfg: dict[str, Any], kv: int) -> tuple[int, int] | None:
    """Gemma 4's full-attention layers' own (KV heads, head_dim) (module docstring)."""
    if not cfg.get("global_head_dim"):
        return None
    heads = cfg.get("num_global_key_value_heads") if cfg.get("attention_k_eq_v") else None
    return int(heads or kv), int(cfg["global_head_dim"])


_SSM_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
_NEMOTRON_H = {"M": "recurrent", "*": "full", "E": "ffn", "-": "ffn"}


def _hf_kinds(cfg: dict[str, Any], mtype: str, n: int) -> tuple[list[str], int | None]:
    window = cfg.get("sliding_window")
    if mtype in ("mamba", "mamba2"):
        return ["recurrent"] * n, None
    if mtype == "nemotron_h" and isinstance(cfg.get("hybrid_override_pattern"), str):
        pattern = cfg["hybrid_override_pattern"]
        if len(pattern) == n and set(pattern) <= set(_NEMOTRON_H):
            return [_NEMOTRON_H[c] for c in pattern], None
    if mtype == "jamba":
        per, off = cfg.get("attn_layer_period", 8), cfg.get("attn_layer_offset", 4)
        return ["full" if i % per == off else "recurrent" for i in range(n)], None
    if isinstance(cfg.get("layer_types"), list) and len(cfg["layer_types"]) == n:
        names = {"full_attention": "full", "sliding_attention": "sliding",
                 "chunked_attention": "chunked", "linear_attention": "recurrent"}
        return [names.get(t, "full") for t in cfg["layer_types"]], window
    if "full_attention_interval" in cfg:
        k = cfg["full_attention_interval"]
        return ["full" if (i + 1) % k == 0 else "recurrent" for i in range(n)], None
    if cfg.get("attention_chunk_size"):
        rope = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(n)]
        return ["chunked" if rope[i] else "full" for i in range(n)], cfg["attention_chunk_size"]
    max_pos = cfg.get("max_position_embeddings") or 0
    if not window or cfg.get("use_sliding_window") is False or window >= max_pos:
        return ["full"] * n, None
    if mtype.startswith(("gemma2", "gpt_oss")):
        return ["sliding" if i % 2 == 0 else "full" for i in range(n)], window
    if every := _global_every(mtype, cfg.get("sliding_window_pattern")):
        return ["full" if (i + 1) % every == 0 else "sliding" for i in range(n)], window
    return ["sliding"] * n, window


def _global_every(arch: str, pattern: Any) -> int:
    """Gemma 3 / Command R7B (``cohere2``): every how many layers one has full attention
    (the file's pattern, else llama.cpp's 6 / 4); 0 for other architectures."""
    default = next((p for a, p in (("gemma3", 6), ("cohere2", 4)) if arch.startswith(a)), 0)
    return int(pattern or default) if default else 0


def _hf_tied(cfg: dict[str, Any]) -> bool | None:
    """``tie_word_embeddings`` from the config; unset, the class's default: True for the
    Gemma families and ``cohere`` / ``cohere2`` (HF CohereConfig / Cohere2Config default to
    tied; Command-R's checkpoints have no lm_head), unknown (None) else."""
    if "tie_word_embeddings" in cfg:
        return bool(cfg["tie_word_embeddings"])
    mtype = str(cfg.get("model_type", ""))
    return True if mtype.startswith("gemma") or mtype in ("cohere", "cohere2") else None


_HF_CACHE = re.compile(r"^models--([^/]+?)--(.+)$")


def _hf_repo(raw: dict[str, Any], p: Path, cfg: dict[str, Any], params: int
             ) -> tuple[str, str]:
    """The model's name and where it came from: ``_name_or_path`` in the file; else the
    Hugging Face cache folder the file sits in (``models--ORG--NAME/snapshots/…``);
    else its ``model_type`` and estimated size (``llama-8.0b``) — never a folder name
    that may say nothing of the model (``snapshots``, a hash, ``path``)."""
    if raw.get("_name_or_path"):
        return str(raw["_name_or_path"]), "config.json's _name_or_path"
    for folder in p.resolve().parents:
        m = _HF_CACHE.match(folder.name)
        if m:
            return f"{m.group(1)}/{m.group(2)}", "the Hugging Face cache folder"
    kind = str(cfg.get("model_type") or raw.get("model_type") or "model")
    return f"{kind}-{params / 1e9:.1f}b", "model_type and the estimated size (--name sets it)"


def model_from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a local HF ``config.json`` (its sizes checked by
    :func:`check_hf_sizes` before any is used)."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError("config.json", str(p), f"cannot read file ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InputError("config.json", str(p), "not valid JSON") from None
    if not isinstance(raw, dict):
        raise InputError("config.json", str(p), "must be a JSON object")
    cfg = {**raw, **raw.get("text_config", {})} if isinstance(raw.get("text_config"), dict) \
        else raw
    where = f"config.json '{p.name}'"
    check_hf_sizes(cfg, where)
    mtype = str(cfg.get("model_type", ""))
    n = int(_need(cfg, ("num_hidden_layers", "n_layer", "num_layers"), where))
    hidden = int(_need(cfg, ("hidden_size", "d_model", "n_embd"), where))
    _need(cfg, ("vocab_size",), where)
    recurrent_only = mtype in ("mamba", "mamba2")
    heads = 0 if recurrent_only else int(_need(cfg, ("num_attention_heads", "n_head"), where))
    kv = 0 if recurrent_only else int(cfg.get("num_key_value_heads") or heads)
    hd = 0 if recurrent_only else int(cfg.get("head_dim") or hidden // heads)
    kinds, window = _hf_kinds(cfg, mtype, n)
    state = _hf_state(cfg, mtype, hidden, where)
    if "recurrent" in kinds and not state[0]:
        raise InputError(where, "state_size", "recurrent layers need their state dimensions")
    if cfg.get("kv_lora_rank"):
        latent = int(cfg["kv_lora_rank"]) + int(_need(cfg, ("qk_rope_head_dim",), where))
        groups: list[dict[str, Any]] = [{"kind": "mla", "layers": n, "latent_dim": latent}]
        kv, hd = 1, latent
    else:
        groups = _split(kinds, kv, hd, hd, window, state, _global_attn(cfg, kv))
    max_pos = max(cfg.get("max_position_embeddings") or cfg.get("n_positions") or 0,
                  cfg.get("model_max_length") or 0)   # Command-R: 8,192 beside 131,072 trained
    notes = "imported from config.json; params_total ESTIMATED from layer shapes"
    if not max_pos:
        if not recurrent_only:
            _need(cfg, ("max_position_embeddings",), where)
        max_pos = NO_POSITION_LIMIT_TOKENS
        notes += f"; no positional limit, {NO_POSITION_LIMIT_TOKENS} is a planning cap"
    params = hf_params(cfg, n, hidden, heads, kv, hd, _hf_tied(cfg))
    repo, named = _hf_repo(raw, p, cfg, params)
    slug = name or slugify(repo.split("/")[-1] if "/" in repo else repo)
    notes += f"; name from {named}" if name is None else ""
    return _build({
        "name": slug, "display_name": slug, "hf_repo": repo if "/" in repo else "",
        "params_total": params, "params_active": params, "num_layers": n,
        "hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": kv,
        "head_dim": hd, "vocab_size": int(cfg["vocab_size"]), "max_context_tokens": int(max_pos),
        "layer_groups": groups, "attention_kind": mtype, "source": f"config.json {p}",
        "tied_embeddings": _hf_tied(cfg), "notes": notes, "vision_encoder": vision_from_hf(raw),
        **ffn_widths(cfg.get("intermediate_size") or cfg.get("shared_expert_intermediate_size"),
                     cfg.get("moe_intermediate_size")),
        "ssm_state_dtype": _SSM_DTYPES.get(str(cfg.get("mamba_ssm_dtype", "")))}, where)


# ---------------------------------------------------------------- GGUF header


def _gguf_fields(p: Path) -> tuple[dict[str, Any], float, bool | None]:
    """Header key/values, the total parameter count from tensor shapes, and whether the
    head is tied to the embedding (no ``output.weight``; None without tensors)."""
    if not p.is_file():
        raise no_such_file("gguf", p, "a .gguf file")
    try:
        from gguf import GGUFReader
        reader = GGUFReader(p, "r")
        fields = {k: f.contents() for k, f in reader.fields.items()}
        params = float(sum(int(t.n_elements) for t in reader.tensors))
        # NOTE: llama.cpp reuses token_embd as the head when the file has no output tensor
        tied = None if not reader.tensors else all(
            t.name != "output.weight" for t in reader.tensors)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parse failure is a bad file
        reason = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
        raise InputError("gguf", str(p), f"not a GGUF file or truncated header ({reason})"
                         ) from None
    return fields, params, tied


def _gguf_kinds(f: dict[str, Any], arch: str, n: int, kv_arr: list[int] | None
                ) -> tuple[list[str], int | None]:
    if arch in ("mamba", "mamba2"):
        return ["recurrent"] * n, None
    ff = f.get(f"{arch}.feed_forward_length")
    if kv_arr is not None:  # a layer with no KV heads: an FFN-only one where it has an FFN
        ffn = [bool(ff[i]) if isinstance(ff, list) else False for i in range(n)]
        base = ["full" if kv_arr[i] else "ffn" if ffn[i] else "recurrent" for i in range(n)]
    else:
        base = ["full"] * n
    window = f.get(f"{arch}.attention.sliding_window")
    if not window:
        return base, None
    pattern = f.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):      # per-layer booleans: True = sliding
        return ["sliding" if pattern[i] else base[i] for i in range(n)], window
    if every := _global_every(arch, pattern):
        return ["full" if (i + 1) % every == 0 else "sliding" for i in range(n)], window
    if arch.startswith(("gemma2", "gpt-oss")):
        return ["sliding" if i % 2 == 0 else "full" for i in range(n)], window
    return ["sliding"] * n, window


def _gguf_state(f: dict[str, Any], arch: str) -> tuple[int, int]:
    """llama.cpp's ``n_embd_s`` + ``n_embd_r`` (module docstring), and the latter."""
    inner, d_state = f.get(f"{arch}.ssm.inner_size", 0), f.get(f"{arch}.ssm.state_size", 0)
    conv = f.get(f"{arch}.ssm.conv_kernel", 0)
    groups = f.get(f"{arch}.ssm.group_count", 0)
    window = max(0, conv - 1) * (inner + 2 * groups * d_state)
    return inner * d_state + window, window


def model_from_gguf(path: str | Path, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from the header of a local GGUF file (metadata only)."""
    p = Path(path)
    f, params, tied = _gguf_fields(p)
    where = f"gguf '{p.name}'"
    arch = f.get("general.architecture")
    if not isinstance(arch, str):
        raise InputError(where, "general.architecture", "missing from the GGUF header")

    check_gguf_sizes(f, arch, where)

    def need(key: str) -> Any:
        v = f.get(f"{arch}.{key}")
        if v is None:
            raise InputError(where, f"{arch}.{key}", "missing from the GGUF header")
        return v

    n, hidden = int(need("block_count")), int(need("embedding_length"))
    ssm_only = arch in ("mamba", "mamba2")
    heads = 0 if ssm_only else need("attention.head_count")
    heads = int(max(heads) if isinstance(heads, list) else heads)
    kv_raw = f.get(f"{arch}.attention.head_count_kv", heads)
    kv_arr = kv_raw if isinstance(kv_raw, list) else None
    kv = int(max(kv_raw) if kv_arr else kv_raw)
    hk = int(f.get(f"{arch}.attention.key_length") or (hidden // heads if heads else 0))
    hv = int(f.get(f"{arch}.attention.value_length") or hk)
    vocab = f.get(f"{arch}.vocab_size") or len(f.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise InputError(where, f"{arch}.vocab_size", "missing (and no tokenizer.ggml.tokens)")
    kinds, window = _gguf_kinds(f, arch, n, kv_arr)
    state = _gguf_state(f, arch) if "recurrent" in kinds else (0, 0)
    if "recurrent" in kinds and not state[0]:
        raise InputError(where, f"{arch}.ssm.state_size", "missing for recurrent layers")
    lora = f.get(f"{arch}.attention.kv_lora_rank")
    if lora:
        latent = int(lora) + int(need("rope.dimension_count"))
        groups: list[dict[str, Any]] = [{"kind": "mla", "layers": n, "latent_dim": latent}]
        kv, hk = 1, latent
    else:
        groups = _split(kinds, kv, hk, hv, window, state)
    ctx = f.get(f"{arch}.context_length") or (NO_POSITION_LIMIT_TOKENS if ssm_only else 0)
    if not ctx:
        need("context_length")
    notes = "imported from a GGUF header; params_total from tensor shapes"
    if not params:
        params = float(n * 12 * hidden * hidden + 2 * vocab * hidden)
        notes = "imported from a GGUF header without tensors; params_total ESTIMATED (12 h^2/layer)"
    slug = name or slugify(str(f.get("general.name") or p.stem))
    return _build({
        "name": slug, "display_name": str(f.get("general.name") or p.stem), "hf_repo": "",
        "params_total": params, "params_active": params, "num_layers": n,
        "hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": kv,
        "head_dim": hk, "vocab_size": int(vocab), "max_context_tokens": int(ctx),
        "layer_groups": groups, "attention_kind": arch, "source": f"GGUF header {p.name}",
        "tied_embeddings": tied, "notes": notes, **ffn_widths(
            f.get(f"{arch}.feed_forward_length"), f.get(f"{arch}.expert_feed_forward_length"))
    }, where)


def import_model(path: str | Path, name: str | None = None) -> ModelSpec:
    """Dispatch on the file: ``.gguf`` (or GGUF magic) → header, else config.json."""
    p = Path(path)
    if not p.exists():
        raise InputError("path", str(p), "file not found")
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise InputError("path", str(path), "directory without a config.json")
    with p.open("rb") as fh:
        magic = fh.read(4)
    if p.suffix.lower() == ".gguf" or magic == b"GGUF":
        return model_from_gguf(p, name)
    return model_from_hf_config(p, name)
