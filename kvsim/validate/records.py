"""The value types every measurement reader returns and the validator consumes.

A reader (``kvsim.validate.shared`` for the layouts in ``docs/reference/measurements``,
``kvsim.validate.llamabench`` for llama-bench / llama-batched-bench output) turns each
row it understands into :class:`Measurement` values and each row it cannot use into a
:class:`Skipped` with the reason; nothing is dropped silently.

NOTE: throughput is what the tools print — tokens per second; ``n_prompt`` /
``n_gen`` / ``depth`` / ``batch`` describe the measured step exactly as llama-bench
and llama-batched-bench define them (``S_PP`` and ``S_TG`` are aggregates over all
``batch`` sequences).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

# llama.cpp's ``-fa auto`` (llama-bench's -1, its default once it took auto, and
# llama-server's) resolves to on wherever the layer's device runs flash attention: CUDA,
# ROCm, Metal, Vulkan and the CPU all do for the catalogue's head sizes (llama.cpp issue
# #27086 shows auto resolving to on even on Arm CPUs, where it is the slower choice).
FA_AUTO = True


def flash_flag(text: str) -> bool | None:
    """A printed flash-attention setting — on / off / true / false, llama-bench's 1 / 0 and
    its -1 or ``auto`` (:data:`FA_AUTO`) — as a flag; None where it shows none."""
    t = (text or "").strip().lower()
    if t.startswith(("-1", "auto")):
        return FA_AUTO
    if t.startswith(("1", "on")) or t == "true":
        return True
    if t.startswith(("0", "off")) or t == "false":
        return False
    return None

Metric = Literal["pp_tps", "tg_tps", "pg_tps"]
"""``pp_tps``: prompt tokens processed per second; ``tg_tps``: tokens generated per
second, summed over every sequence that decodes in parallel; ``pg_tps``: llama-bench's
``-pg P,G`` test, one sequence's ``n_prompt`` prompt tokens and then ``n_gen`` generated
ones, both counted, over the whole time (no shipped fit has such rows)."""


def parse_tensor_split(text: str) -> tuple[float, ...] | None:
    """llama-bench's ``tensor_split`` / ``-ts`` ("0.60/0.40", "3,1"; "0.00" or "": not
    set); ValueError on a share that is not a number."""
    values = [float(x) for x in re.split(r"[/,;]", text or "") if x.strip()]
    return tuple(values) if values and sum(values) > 0 else None


def split_knobs(mode: str, shares: str, main_gpu: str) -> dict[str, object]:
    """llama.cpp's split knobs as :class:`Measurement` fields: ``-sm`` (unset: layer),
    ``-ts`` (:func:`parse_tensor_split`), ``-mg`` (unset: 0); ValueError naming the one
    that does not read."""
    try:
        ts = parse_tensor_split(shares)
    except ValueError:
        raise ValueError(f"tensor_split {shares!r}: shares such as '3/1'") from None
    if not re.fullmatch(r"\d*", (main_gpu or "").strip()):
        raise ValueError(f"main_gpu {main_gpu!r}: a GPU index such as 0")
    return {"split_mode": (mode or "layer").lower(), "tensor_split": ts,
            "main_gpu": int(main_gpu.strip() or 0)}


def test_name(metric: str, n_prompt: int, n_gen: int) -> str:
    """llama-bench's name of a test: ``pp512``, ``tg128``, ``pp4096+tg128``."""
    if metric == "pg_tps":
        return f"pp{n_prompt}+tg{n_gen}"
    return f"pp{n_prompt}" if metric == "pp_tps" else f"tg{n_gen}"


@dataclass(frozen=True)
class Measurement:
    """One measured throughput and the setup it was measured in."""

    id: str                 # the row's id in its file ("SB001", "bench.json:3")
    gpu: str                # the device as the source names it
    backend: str            # CUDA, ROCm, Vulkan, Metal, SYCL, CPU, ... (as normalised)
    model: str              # the model as the source names it (file name, model_type)
    weight_format: str      # Q4_0, Q8_0, Q4_K_M, F16, MXFP4, ...
    metric: Metric
    value: float            # tokens/s
    n_prompt: int = 0       # prompt tokens of the prefill measured (pp)
    n_gen: int = 0          # tokens generated per sequence (tg)
    depth: int = 0          # tokens already in the KV cache before the measured part
    batch: int = 1          # sequences in parallel (llama-batched-bench B)
    flash_attn: bool | None = None
    n_ubatch: int | None = None
    n_batch: int | None = None
    n_gpus: int = 1
    split_mode: str = "layer"   # llama.cpp -sm on several GPUs (layer, row, none)
    tensor_split: tuple[float, ...] | None = None   # -ts shares (None: by free memory)
    main_gpu: int = 0           # -mg
    gpu_layers: int | None = None   # -ngl as given (-1: fit); None: not stated
    model_size_bytes: int | None = None   # as the tool printed it, when it did
    model_params: int | None = None
    kv_type: str = "f16"
    source: str = ""
    cuda_graphs_since: str = "volta"   # the build's oldest architecture with CUDA graphs
    cublas_prompts: bool = False   # a CUDA build from before MMQ by default (2024-06)
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def kind(self) -> str:
        """The summary's grouping: ``single`` (batch 1, empty cache), ``depth`` (decode
        or prefill after ``depth`` cached tokens), ``parallel`` (batch > 1)."""
        if self.batch > 1:
            return "parallel"
        return "depth" if self.depth > 0 else "single"


@dataclass(frozen=True)
class Skipped:
    """A row that was read but cannot be predicted (or could not be read), and why."""

    id: str
    reason: str
