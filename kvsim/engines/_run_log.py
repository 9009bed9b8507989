"""What an engine ran, read from its own start-up lines: the pieces the engines'
``startup_run`` methods share (kvsim.engines.startup_run assembles them).

- ggml's device list (llama.cpp and Ollama's runner): ``Device 0: NAME, compute
  capability …`` (several devices: the list), ``using device CUDA0 (NAME)``,
  ``ggml_vulkan: 0 = NAME (…)``, Metal's ``GPU name: NAME``; Ollama's discovery
  ``name="NAME"`` / ``description="NAME"``;
- the GGUF loaded (``… from /path/NAME.gguf``; a content-addressed blob, Ollama's
  ``sha256-…``, names nothing), else its ``general.name``;
- its file type (``file type = Q4_K - Medium``, older ``model ftype``) as a format name.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath, PureWindowsPath

DEVICE_LINES = (re.compile(r"Device \d+: (.+?), compute capability"),
                re.compile(r"using device \w+ \((.+?)\)"),
                re.compile(r"ggml_vulkan: \d+ = (.+?) \("),
                re.compile(r"GPU name:\s+(.+?)\s*$", re.MULTILINE),
                re.compile(r'\b(?:description|name)="([^"]*(?:NVIDIA|AMD|Radeon|Apple|Intel)'
                           r'[^"]*)"'))
_GGUF = re.compile(r"from (\S+\.gguf)\b", re.IGNORECASE)
_GENERAL_NAME = re.compile(r"general\.name\s+(?:str\s+)?=\s+(.+?)\s*$", re.MULTILINE)
_FILE_TYPE = re.compile(r"(?:file type|model ftype)\s+=\s+(\S+)(?: - (Medium|Small|Large))?",
                        re.IGNORECASE)


def match(pattern: str, text: str) -> str:
    """The first group of ``pattern``'s first match in ``text`` ("" where none)."""
    m = re.search(pattern, text, re.MULTILINE)
    return m.group(1).strip() if m else ""


def devices(text: str) -> str:
    """The card(s) the log names, by the first kind of line that names any: ``NAME``,
    ``2x NAME`` for several of one kind, ``A, B`` (device order) for mixed ones."""
    for p in DEVICE_LINES:
        names = [m.group(1).strip() for m in p.finditer(text)]
        if names:
            if len(set(names)) == 1:
                return names[0] if len(names) == 1 else f"{len(names)}x {names[0]}"
            return ", ".join(names)
    return ""


def gguf_model(text: str) -> str:
    """The GGUF file's name, else the model's ``general.name``."""
    if (m := _GGUF.search(text)) and "sha256-" not in m.group(1):
        path = m.group(1)
        return (PureWindowsPath(path) if "\\" in path else PurePosixPath(path)).name
    m = _GENERAL_NAME.search(text)
    return m.group(1).strip() if m else ""


def gguf_weights(text: str) -> str:
    """The file type as a format name ("Q4_K - Medium" → Q4_K_M)."""
    m = _FILE_TYPE.search(text)
    if m is None:
        return ""
    return m.group(1) + {"medium": "_M", "small": "_S", "large": "_L"}.get(
        (m.group(2) or "").lower(), "")


def ggml_names(text: str) -> dict[str, str]:
    """The card, the GGUF and its format, as llama.cpp's lines name them."""
    return {"gpu": devices(text), "model": gguf_model(text), "weights": gguf_weights(text)}


def slot_knobs(facts: dict) -> dict[str, object]:
    """Flash attention (whether it ran, else as printed), the cache types and an offload
    short of every layer (``offloaded N/M layers``: -ngl N)."""
    fa = facts.get("flash_attn")
    out: dict[str, object] = {
        "flash_attn": fa if fa is not None else facts.get("flash_attn_setting"),
        "cache_type_k": facts.get("k_type"), "cache_type_v": facts.get("v_type")}
    on_gpu, total = facts.get("gpu_layers"), facts.get("layers_total")
    if on_gpu is not None and total and on_gpu < total:
        out["n_gpu_layers"] = on_gpu
    return out


def slots_of(facts: dict) -> int | None:
    """The sequences the context serves: ``n_seq_max``, else ``n_ctx / n_ctx_seq``."""
    n_ctx, per_seq = facts.get("n_ctx"), facts.get("n_ctx_seq")
    return facts.get("n_seq_max") or (n_ctx // per_seq if n_ctx and per_seq else None)


def as_words(settings: dict[str, object]) -> dict[str, object]:
    """Switches as ``on``/``off``, unknowns dropped (the settings cell's words)."""
    return {k: ("on" if v is True else "off" if v is False else v)
            for k, v in settings.items() if v is not None}
