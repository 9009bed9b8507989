"""The devices a backend's start-up lines name in pasted llama.cpp tool output.

llama-bench's markdown table carries no device column; people paste it together with
the backend's start-up lines, which do name the cards.
"""

from __future__ import annotations

import re

_DEVICE_LINES = (
    re.compile(r"^\s*Device \d+: ([^,]+),", re.M),          # ggml_cuda_init (CUDA, ROCm)
    re.compile(r"^ggml_vulkan: \d+ = (.+?) \(", re.M),       # ggml_vulkan device list
    re.compile(r"GPU name:\s+(.+?)\s*$", re.M),              # ggml_metal device info
)


def printed_devices(text: str) -> str:
    """The devices the backend's start-up lines name in pasted output, joined as
    llama-bench's ``gpu_info`` joins them ("" when none is printed)."""
    for pattern in _DEVICE_LINES:
        names = [n.strip() for n in pattern.findall(text)]
        if names:
            return ", ".join(names)
    return ""
