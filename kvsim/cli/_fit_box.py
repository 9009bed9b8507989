"""``kvsim fit`` on a box of several GPUs: the cards ``--gpu`` names and the engine's
split flags (vLLM / SGLang ``--tensor-parallel-size`` / ``--pipeline-parallel-size``,
llama.cpp ``--split-mode`` / ``--tensor-split`` / ``--main-gpu``).

Split from :mod:`kvsim.cli.fit`; the knobs and their checks are the scenario's
(kvsim.engines.config, kvsim.engines._gpu_checks).
"""

from __future__ import annotations

from typing import Any

import click

from kvsim.config.catalog import load_gpu
from kvsim.config.gpu_set import gpu_items
from kvsim.engines.config import MAX_SPLIT_SHARE
from kvsim.errors import InputError

GPU_HELP = ("GPU profile slug, e.g. rtx-4090, or the name drivers print ('NVIDIA GeForce "
            "RTX 4090'); several GPUs in one box as '2x rtx-3090' or "
            "'rtx-3090+rtx-3060-12gb' (device 0 first)")

BOX_FLAGS: dict[str, tuple[str, str]] = {
    "tensor_parallel_size": ("--tensor-parallel-size", "tensor-parallel ranks"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "pipeline stages"),
    "split_mode": ("--split-mode", "a split mode over the GPUs"),
    "tensor_split": ("--tensor-split", "a tensor split over the GPUs"),
    "main_gpu": ("--main-gpu", "a main GPU"),
}
"""Engine knob → (fit flag, what it sets), for the engine-only flag check and errors."""


def box_options(f: Any) -> Any:
    """The split flags, as click options on ``f``."""
    options = [
        click.option("--tensor-parallel-size", "tensor_parallel_size", type=int, default=None,
                     help="vllm/sglang: ranks each layer is split over (default: every GPU "
                     "named, over the pipeline stages)"),
        click.option("--pipeline-parallel-size", "pipeline_parallel_size", type=int,
                     default=None, help="vllm/sglang: stages the layers run in (default 1); "
                     "tensor x pipeline = the GPUs named"),
        click.option("--split-mode", "split_mode", default=None,
                     help="llama.cpp -sm: layer (default), row or none"),
        click.option("--tensor-split", "tensor_split", default=None,
                     help="llama.cpp -ts: one share per GPU, e.g. '3,1' (default: by free "
                     "memory)"),
        click.option("--main-gpu", "main_gpu", type=int, default=None,
                     help="llama.cpp -mg: the one GPU used with --split-mode none"),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def load_box(text: str) -> tuple[Any, ...]:
    """The GPU profiles ``--gpu`` names, device 0 first."""
    return tuple(load_gpu(c) if isinstance(c, str) else c for c in gpu_items(text, "--gpu"))


def box_knobs(given: dict[str, Any], n_gpus: int) -> dict[str, Any]:
    """The engine knobs the split flags set (None = not given); a split flag on one GPU
    is refused."""
    knobs = {k: v for k, v in given.items() if v is not None}
    if "tensor_split" in knobs:
        knobs["tensor_split"] = _shares(knobs["tensor_split"])
    if knobs and n_gpus == 1 and set(knobs) - {"split_mode", "main_gpu"}:
        key = next(iter(set(knobs) - {"split_mode", "main_gpu"}))
        raise InputError(BOX_FLAGS[key][0], given[key], "needs two or more GPUs in --gpu "
                         "(e.g. --gpu '2x rtx-3090')")
    return knobs


def _shares(text: str) -> list[float]:
    try:
        shares = [float(x) for x in str(text).split(",")]
    except ValueError:
        shares = []
    if not shares or any(not 0 <= s <= MAX_SPLIT_SHARE for s in shares) or sum(shares) <= 0:
        raise InputError("--tensor-split", text, "one share per GPU from 0 to 1e30, "
                         "comma-separated, not all 0 (e.g. '3,1')")
    return shares


def device_rows(b: Any) -> list[dict[str, Any]]:
    """One row per GPU of a several-GPU layout (JSON and the per-GPU table)."""
    return [{"index": d.index, "gpu": d.gpu, "layers": d.layers,
             "weight_fraction": d.weight_fraction, "weights_bytes": d.weights_bytes,
             "kv_bytes": d.kv_bytes, "compute_bytes": d.compute_bytes,
             "overhead_bytes": d.overhead_bytes, "total_bytes": d.total_bytes,
             "device_bytes": d.device_bytes, "device_fraction": round(d.fraction, 6),
             "holds_output": d.holds_output} for d in b.devices]
