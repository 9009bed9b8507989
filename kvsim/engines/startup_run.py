"""What an engine's start-up log says it ran: the card, the model, the weights, the
release, the settings and the figure lines (kvsim.validate.startup_paste compares them
with kvsim's layout).  Each engine's own lines:

- the card: llama.cpp's ``Device 0: NAME, compute capability …`` (several devices: the
  list), ``using device CUDA0 (NAME)``, ``ggml_vulkan: 0 = NAME (…)``, Metal's ``GPU
  name: NAME``; Ollama's ``name="NAME"`` / ``description="NAME"`` of its GPU discovery;
  vLLM prints none;
- the model: the GGUF file llama.cpp loaded (``… from /path/NAME.gguf``), else its
  ``general.name``; vLLM's ``model='…'``;
- the weights: llama.cpp's ``file type = Q4_K - Medium`` (older ``model ftype``); vLLM's
  ``quantization=…`` (none: its ``dtype``);
- the release: llama.cpp's ``build: N``, Ollama's ``(version X)``, vLLM's ``LLM engine
  (vX)``; the date, Ollama's ``time=YYYY-MM-DD…``;
- the settings, by the engine's own knob names: llama.cpp's context, slots, batches,
  flash attention (as printed: ``auto`` stays ``auto``), cache types and the layers
  offloaded; Ollama's num_ctx per slot, parallel (its runner's command line) and free
  memory; vLLM's from its config line and non-default args.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath

from kvsim.engines.startup_log import LogFacts, last_startup

_DEVICES = (re.compile(r"Device \d+: (.+?), compute capability"),
            re.compile(r"using device \w+ \((.+?)\)"),
            re.compile(r"ggml_vulkan: \d+ = (.+?) \("),
            re.compile(r"GPU name:\s+(.+?)\s*$", re.MULTILINE),
            re.compile(r'\b(?:description|name)="([^"]*(?:NVIDIA|AMD|Radeon|Apple|Intel)[^"]*)"'))
_GGUF = re.compile(r"from (\S+\.gguf)\b", re.IGNORECASE)
_GENERAL_NAME = re.compile(r"general\.name\s+(?:str\s+)?=\s+(.+?)\s*$", re.MULTILINE)
_FILE_TYPE = re.compile(r"(?:file type|model ftype)\s+=\s+(\S+)(?: - (Medium|Small|Large))?",
                        re.IGNORECASE)
_VERSIONS = (re.compile(r"LLM engine \(v([^)\s]+)\)"), re.compile(r"\(version (\d+\.\d+\.\d+)\)"),
             re.compile(r"^build: (\d+) ", re.MULTILINE))
_VLLM_KEYS = {"max_seq_len": "max_model_len", "tensor_parallel_size": "tensor_parallel_size",
              "pipeline_parallel_size": "pipeline_parallel_size",
              "kv_cache_dtype": "kv_cache_dtype", "enforce_eager": "enforce_eager",
              "gpu_memory_utilization": "gpu_memory_utilization",
              "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens"}


@dataclass(frozen=True)
class StartupRun:
    """What the log says the engine ran ("" where it does not say)."""

    engine_version: str
    gpu: str
    vram_total: str                 # Ollama's ``memory.available=[…]``
    model: str
    weight_format: str
    date: str
    figure_text: str                # the lines the figures are read from
    settings: dict[str, object] = field(default_factory=dict)


def startup_run(text: str, facts: LogFacts) -> StartupRun:
    """The run of the log's last start-up (module docstring); ``facts``: its capacity lines
    (:func:`kvsim.engines.startup_log.read_log_text`)."""
    start = last_startup(text)
    date = re.search(r"time=(\d{4}-\d{2}-\d{2})", start)
    return StartupRun(
        engine_version=_first(_VERSIONS, text), gpu=_devices(text), vram_total=_available(start),
        model=_model(text, facts.engine), weight_format=_weights(text, facts.engine),
        date=date.group(1) if date else "", figure_text=_figure_text(start, facts),
        settings=_settings(facts, text))


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> str:
    return next((m.group(1).strip() for p in patterns if (m := p.search(text))), "")


def _devices(text: str) -> str:
    """The card(s) the paste names, by the first kind of line that names any: ``NAME``,
    ``2x NAME`` for several of one kind, ``A, B`` (device order) for mixed ones."""
    for p in _DEVICES:
        names = [m.group(1).strip() for m in p.finditer(text)]
        if names:
            if len(set(names)) == 1:
                return names[0] if len(names) == 1 else f"{len(names)}x {names[0]}"
            return ", ".join(names)
    return ""


def _model(text: str, engine: str) -> str:
    if engine == "vllm":
        return m.group(1) if (m := re.search(r"\bmodel='([^']+)'", text)) else ""
    if (m := _GGUF.search(text)) and not re.search(r"sha256-", m.group(1)):
        path = m.group(1)
        return (PureWindowsPath(path) if "\\" in path else PurePosixPath(path)).name
    return m.group(1) if (m := _GENERAL_NAME.search(text)) else ""


def _weights(text: str, engine: str) -> str:
    if engine == "vllm":
        q = re.search(r"\bquantization=(\w+)", text)
        if q and q.group(1) != "None":
            return q.group(1)
        d = re.search(r"\bdtype=(?:torch\.)?(\w+)", text)
        return d.group(1) if d else ""
    m = _FILE_TYPE.search(text)
    if m is None:
        return ""
    suffix = {"medium": "_M", "small": "_S", "large": "_L"}.get((m.group(2) or "").lower(), "")
    return m.group(1) + suffix


def _available(text: str) -> str:
    m = re.search(r'memory\.available="?(\[[^\]]*\])', text)
    return f"memory.available={m.group(1)}" if m else ""


def _settings(f: LogFacts, text: str) -> dict[str, object]:
    """The knobs the start-up ran with, by the engine's own names (as
    kvsim.validate.memlog_text reads them)."""
    if f.engine == "vllm":
        return _vllm_settings(text)
    out: dict[str, object] = {}
    slots = f.n_seq_max or (f.n_ctx // f.n_ctx_seq if f.n_ctx and f.n_ctx_seq else None)
    if f.engine == "ollama":  # its runner's command line: --ctx-size num_ctx x --parallel
        runner = dict(re.findall(r"--(ctx-size|parallel) (\d+)", text))
        slots = slots or (int(runner["parallel"]) if "parallel" in runner else None)
        per_slot = f.n_ctx_seq or (int(runner["ctx-size"]) // (slots or 1)
                                   if "ctx-size" in runner else None)
        out.update(num_ctx=per_slot, parallel=slots)
    else:
        out.update(ctx_size=f.n_ctx, parallel=slots, kv_unified=f.kv_unified,
                   batch_size=f.n_batch, ubatch_size=f.n_ubatch)
    fa = f.flash_attn if f.flash_attn is not None else f.flash_attn_setting
    out.update(flash_attn=fa, cache_type_k=f.k_type, cache_type_v=f.v_type)
    if f.gpu_layers is not None and f.layers_total and f.gpu_layers < f.layers_total:
        out["n_gpu_layers"] = f.gpu_layers
    return {k: ("on" if v is True else "off" if v is False else v)
            for k, v in out.items() if v is not None}


def _vllm_settings(text: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, knob in _VLLM_KEYS.items():
        m = re.search(rf"['\"]?\b{key}['\"]?\s*[=:]\s*([\w.]+)", text)
        if m and m.group(1) not in ("None",):
            out[knob] = m.group(1).replace("True", "on").replace("False", "off")
    return out


def _figure_text(start: str, f: LogFacts) -> str:
    """The figures' text: the start-up's lines, with Ollama's ``offload`` line's
    ``key="value"`` pairs as ``key=value`` items."""
    if f.engine != "ollama":
        return start
    line = next((ln for ln in start.splitlines() if "memory.required" in ln), "")
    pairs = re.findall(r'((?:memory|layers)\.[\w.]+)="?([^"\s]+(?: [KMGT]?i?B)?)"?', line)
    return "; ".join(f"{k}={v}" for k, v in pairs) + "\n" + start.replace(line, "")
