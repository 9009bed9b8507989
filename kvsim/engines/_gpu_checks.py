"""How an engine's knobs must agree with the GPUs of the box (several-GPU scenarios).

- vLLM / SGLang: ``tensor_parallel_size x pipeline_parallel_size`` ranks, one per GPU:
  the product must equal the GPUs named (the scenario names the cards the engine uses,
  as ``CUDA_VISIBLE_DEVICES`` does);
- llama.cpp: ``--tensor-split`` has one share per GPU, ``--main-gpu`` is one of them;
- Ollama: places layers itself; it takes no split knobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsim.errors import InputError

if TYPE_CHECKING:
    from kvsim.engines.config import PagedEngineConfig, SlotEngineConfig


def check_parallel_sizes(cfg: PagedEngineConfig, n_gpus: int) -> None:
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    if tp * pp != n_gpus:
        raise InputError("engine.tensor_parallel_size", tp, (
            f"tensor_parallel_size x pipeline_parallel_size ({tp} x {pp} = {tp * pp}) must "
            f"equal the scenario's GPUs ({n_gpus}): one rank per GPU"))


def check_split(cfg: SlotEngineConfig, n_gpus: int) -> None:
    if cfg.tensor_split is not None and len(cfg.tensor_split) != n_gpus:
        raise InputError("engine.tensor_split", list(cfg.tensor_split),
                         f"one share per GPU: {n_gpus} value(s) for the scenario's "
                         f"{n_gpus} GPU(s)")
    if cfg.main_gpu >= n_gpus:
        raise InputError("engine.main_gpu", cfg.main_gpu,
                         f"a device index from 0 to {n_gpus - 1} (the scenario's GPUs)")


def refuse_split_knobs(cfg: SlotEngineConfig, engine: str) -> None:
    """An engine that places layers over the GPUs itself (Ollama) takes no split knobs."""
    split = list(cfg.tensor_split) if cfg.tensor_split is not None else None
    for knob, value, unset in (("split_mode", cfg.split_mode, "layer"),
                               ("tensor_split", split, None), ("main_gpu", cfg.main_gpu, 0)):
        if value != unset:
            raise InputError(f"engine.{knob}", value, f"not a knob of the {engine} preset: "
                             "it places layers over the GPUs by their free memory itself")

