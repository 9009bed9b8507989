"""llama.cpp's buffer and batch lines in a startup log (docs/reference/engines.md §3.1),
beside the KV lines :func:`kvsim.engines.llama_cpp.read_llama_cpp_log` reads:

- ``load_tensors: <dev> model buffer size = X MiB`` (weights per device; ``CPU_Mapped``
  / ``CPU`` for what stays in host memory) and ``offloaded N/M layers to GPU``;
- ``llama_context: <dev> compute buffer size = X MiB`` (per device, ``CUDA_Host`` /
  ``CPU`` for host buffers);
- ``llama_context: n_batch = …``, ``n_ubatch = …``, ``flash_attn = auto|enabled|…`` and
  the newer ``Flash Attention was auto, set to enabled``.

NOTE: a log may hold a second context (a draft model's) after the served one: the first
line per device is the served model's.
"""

from __future__ import annotations

import re

from kvsim.engines._log_patterns import FLOAT, mib_bytes

_HOST = re.compile(r"^(CPU|CUDA_Host|Metal_Mapped|CPU_Mapped|CPU_REPACK|ROCm_Host|"
                   r"Vulkan_Host|SYCL_Host)", re.IGNORECASE)
_ON = {"1", "on", "true", "enabled", "yes"}
_OFF = {"0", "off", "false", "disabled", "no"}


def _first_per_device(text: str, what: str, prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in re.finditer(prefix + r":\s+(\S+)\s+" + what + r" buffer size\s*=\s*" + FLOAT
                         + r" MiB", text):
        out.setdefault(m.group(1), mib_bytes(m.group(2)))
    return out


def _on_device(buffers: dict[str, int]) -> int:
    return sum(v for dev, v in buffers.items() if not _HOST.match(dev))


def _flash_attn(text: str) -> dict[str, object]:
    """The flash-attention setting asked for and, where the log says, what it became."""
    out: dict[str, object] = {}
    if m := re.search(r"llama_context:\s*flash_attn\s*=\s*(\w+)", text):
        out["flash_attn_setting"] = m.group(1).lower()
    if m := re.search(r"Flash Attention was \w+, set to (\w+)", text):
        out["flash_attn"] = m.group(1).lower() in _ON
    elif out.get("flash_attn_setting") in _ON | _OFF:
        out["flash_attn"] = out["flash_attn_setting"] in _ON
    return out


def read_llama_buffers(text: str) -> dict[str, object]:
    """The :class:`kvsim.engines.startup_log.LogFacts` buffer and batch fields ({} where
    none of these lines is printed)."""
    out: dict[str, object] = {}
    for key in ("n_batch", "n_ubatch"):
        if m := re.search(r"llama_context:\s*" + key + r"\s*=\s*(\d+)", text):
            out[key] = int(m.group(1))
    if m := re.search(r"offloaded (\d+)/(\d+) layers to GPU", text):
        out.update(gpu_layers=int(m.group(1)), layers_total=int(m.group(2)))
    model = _first_per_device(text, "model", r"load_tensors")
    compute = _first_per_device(text, "compute", r"llama_context")
    if model:
        out.update(model_buffers=model, model_buffer_bytes=_on_device(model))
    if compute:
        out.update(compute_buffers=compute, compute_buffer_bytes=_on_device(compute))
    return {**out, **_flash_attn(text)}
