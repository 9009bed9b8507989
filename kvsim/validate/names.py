"""Profiles named on the command line of ``kvsim validate`` and ``kvsim calibrate bench``.

A model is a catalogue name, a profile YAML, a GGUF file or a Hugging Face
``config.json`` (read with kvsim.model.importers); a device is a catalogue name or a
printed one (kvsim.config.gpu_names), or for a CPU-only run the host profile's CPU.

NOTE: an unknown or ambiguous name is an InputError naming the flag.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from kvsim.config.catalog import load_gpu, load_host, load_model
from kvsim.config.files import no_such_file
from kvsim.config.gpu_names import resolve_gpu
from kvsim.config.specs import GpuSpec, HostSpec, ModelSpec
from kvsim.errors import InputError
from kvsim.model.names import resolve_model
from kvsim.model.weights import weight_format_names
from kvsim.validate.engine_speed import EngineSpeed
from kvsim.validate.memlogs import MemoryMeasurement
from kvsim.validate.records import Measurement

R = TypeVar("R")


def model_spec(text: str, flag: str = "--model") -> ModelSpec:
    """The model ``text`` names (module docstring)."""
    low = text.lower()
    if low.endswith((".gguf", ".json")):
        from kvsim.model.importers import import_model

        if not Path(text).is_file():
            raise no_such_file(flag, text, "a profile .yaml file")
        return import_model(text)
    if low.endswith((".yaml", ".yml")):
        return load_model(text)
    m = resolve_model(text)
    if m.slug is None:
        raise InputError(flag, text, m.reason)
    return load_model(m.slug)


def gguf_weight_format(text: str) -> str | None:
    """The weight format a GGUF file's header names (``general.file_type``:
    ``MOSTLY_Q4_K_M`` -> ``q4_k_m``, ``MOSTLY_MXFP4_MOE`` -> ``mxfp4_moe``); None for
    another file, a header naming none, or a type kvsim does not model."""
    if not text.lower().endswith(".gguf") or not Path(text).is_file():
        return None
    try:
        from gguf import GGUFReader, LlamaFileType

        field = GGUFReader(text, "r").fields.get("general.file_type")
        name = LlamaFileType(int(field.contents())).name if field is not None else ""
    except Exception:  # noqa: BLE001 - model_spec has already read this header
        return None
    fmt = re.sub(r"^(?:MOSTLY|ALL)_", "", name).lower()
    return fmt if fmt in weight_format_names() else None


def with_file_format(rows: list[R], model_text: str | None) -> list[R]:
    """``rows`` with the weight format ``--model`` states — a GGUF file's header, or the
    name ("llama-3.1-8b-Q4_K_M") — on every speed row that names none
    (llama-batched-bench prints no model; vLLM's benchmark printouts, no card or model):
    the rest unchanged."""
    if not model_text:
        return rows
    fmt = gguf_weight_format(model_text) if model_text.lower().endswith(".gguf") \
        else resolve_model(model_text).weight_format
    if fmt is None:
        return rows
    return [replace(r, weight_format=fmt) if isinstance(r, Measurement) and not r.weight_format
            else replace(r, weights=fmt) if isinstance(r, EngineSpeed) and not r.weights
            else r for r in rows]


_RELEASE = re.compile(r"v?\d+\.\d+(?:\.\d+)?")


def with_engine_version(rows: list[R], version: str | None) -> list[R]:
    """``rows`` with ``--engine-version`` on every start-up memory row that shows no
    release (``ollama ps``, a log pasted without its banner); InputError for a value that
    is no release number."""
    if not version:
        return rows
    if not _RELEASE.fullmatch(version.strip()):
        raise InputError("--engine-version", version, "a release number such as 0.10.1")
    shown = version.strip().lstrip("v")
    return [replace(r, engine_version=shown) if isinstance(r, MemoryMeasurement)
            and not re.search(r"\d+\.\d+", r.engine_version or "") else r for r in rows]


def cpu_device(host: HostSpec) -> GpuSpec:
    """The device spec of a CPU-only llama.cpp run: the host's memory and FLOP rates."""
    return GpuSpec(name=f"cpu-{host.name}", display_name=f"CPU ({host.display_name})",
                   vendor="CPU", segment="cpu", memory_bytes=host.memory_bytes,
                   memory_bandwidth_bytes_per_s=host.memory_bandwidth_bytes_per_s,
                   fp16_tensor_flops=host.cpu_flops, fp16_fp32acc_tensor_flops=host.cpu_flops,
                   fp32_flops=host.cpu_flops, unified_memory=True, architecture="cpu",
                   source=f"host profile {host.name} ({host.source})")


def device_spec(text: str | None, *, backend: str, host: str,
                flag: str = "--gpu") -> GpuSpec:
    """The device of a run: ``text`` resolved, or the host's CPU for a CPU run."""
    if text is None:
        if backend == "CPU":
            return cpu_device(load_host(host))
        raise InputError(flag, None, "the card the runs were measured on (a profile name "
                         "or the name llama-bench printed): the output names none")
    if text.lower().endswith((".yaml", ".yml")):
        return load_gpu(text)
    g = resolve_gpu(text)
    if g.slug is None:
        raise InputError(flag, text, g.reason)
    return load_gpu(g.slug)
