"""The profile catalogue: YAML files shipped as package data, loaded by slug.

``hardware_profiles/{gpus,models,links,hosts,engines}/<slug>.yaml`` — one file per
item.  A name that is not a slug but an existing ``.yaml`` path is loaded from that
path, so users can keep their own profiles next to their scenarios.

NOTE: loading is pure (reads files, never writes) and memoised per process by
(kind, name); the returned objects are frozen.
"""

from __future__ import annotations

import copy
import functools
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kvsim.config.files import no_such_file, read_yaml
from kvsim.config.specs import GpuLinkSpec, GpuSpec, HostSpec, LinkSpec, ModelSpec
from kvsim.errors import InputError, from_validation_error, unknown_name

DEFAULT_HOST = "desktop-64gb"
"""The host a scenario assumes when it names none and its GPU is a discrete card (a
unified-memory GPU gets :func:`unified_host`; see :func:`default_host`)."""
KINDS = ("gpus", "models", "links", "gpu_links", "hosts", "engines")
_SPEC_BY_KIND: dict[str, type[BaseModel]] = {
    "gpus": GpuSpec, "models": ModelSpec, "links": LinkSpec, "gpu_links": GpuLinkSpec,
    "hosts": HostSpec,
}
_FIELD_BY_KIND = {"gpus": "gpu", "models": "model", "links": "link",
                  "gpu_links": "gpu_link", "hosts": "host", "engines": "engine"}
T = TypeVar("T", bound=BaseModel)


def data_root(folder: str) -> Path:
    """A bundled data folder (``hardware_profiles``, ``workloads``): the package
    ``kvsim.<folder>`` of an installed kvsim, else the folder of that name beside the
    ``kvsim`` source tree (``python -m kvsim`` run from a checkout).

    NOTE: the wheel ships the repository's top-level folders as those packages (setup.py)."""
    try:
        return Path(str(resources.files(f"kvsim.{folder}")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / folder


def _root() -> Path:
    return data_root("hardware_profiles")


def has_profile(kind: str, name: str) -> bool:
    """Is ``name`` the slug of a shipped profile of ``kind`` (case as the loader reads it)?"""
    return (_root() / kind / f"{name.lower()}.yaml").is_file()


def names_a_file(name: str) -> bool:
    """Does ``name`` read as a file path rather than a name: a ``.yaml`` profile, another
    file type kvsim knows (:data:`FILE_SUFFIXES`), or an existing path?"""
    return name.lower().endswith((".yaml", ".yml", *FILE_SUFFIXES)) or Path(name).exists()


def list_names(kind: str) -> list[str]:
    """Slugs of every shipped profile of one kind, sorted."""
    if kind not in KINDS:
        raise InputError("kind", kind, "one of " + ", ".join(KINDS))
    folder = _root() / kind
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_raw(kind: str, name: str) -> dict[str, Any]:
    """The raw mapping of one profile, by slug or by path to a YAML file (a fresh copy:
    callers may edit it; NOTE: the parsed file is cached, never handed out)."""
    return copy.deepcopy(_load_raw(kind, name))


@functools.lru_cache(maxsize=512)
def _load_raw(kind: str, name: str) -> dict[str, Any]:
    field = _FIELD_BY_KIND.get(kind, kind)
    as_path = Path(name)
    if name.endswith((".yaml", ".yml")):
        if not as_path.is_file():
            raise no_such_file(field, name, "a profile .yaml file")
        return read_yaml(as_path, field)
    candidate = _root() / kind / f"{name.lower()}.yaml"
    if not candidate.is_file():
        if as_path.suffix.lower() in FILE_SUFFIXES or "/" in name or "\\" in name:
            raise InputError(field, name, _not_a_profile(kind, as_path))
        raise unknown_name(field, name, list_names(kind))
    return read_yaml(candidate, field)


# NOTE: slugs hold dots ('llama-3.1-8b'): only these suffixes, or a slash, mark a path
FILE_SUFFIXES = (".json", ".gguf", ".safetensors", ".bin", ".txt", ".csv", ".md", ".toml")


def _not_a_profile(kind: str, path: Path) -> str:
    """What a path that is no profile YAML should be."""
    what = f"a {_FIELD_BY_KIND.get(kind, kind)} profile slug (kvsim profiles list {kind}) or a "\
        "profile .yaml file"
    if kind == "models" and path.suffix.lower() in (".json", ".gguf"):
        made = "a Hugging Face config.json" if path.suffix.lower() == ".json" else "a GGUF file"
        return (f"{what}; {made} is made into one first: kvsim profiles import {path} -o "
                f"{path.stem}.yaml" + ("" if path.is_file() else " (and this file does not "
                                       "exist)"))
    return what + ("" if path.is_file() else " (file not found)")


def _load(kind: str, name: str, spec: type[T]) -> T:
    raw = load_raw(kind, name)
    try:
        return spec.model_validate(raw)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=f"{_FIELD_BY_KIND[kind]} '{name}'",
                                    model=spec) from None


@functools.lru_cache(maxsize=512)
def load_gpu(name: str) -> GpuSpec:
    return _load("gpus", name, GpuSpec)


@functools.lru_cache(maxsize=512)
def load_model(name: str) -> ModelSpec:
    return _load("models", name, ModelSpec)


@functools.lru_cache(maxsize=64)
def load_link(name: str) -> LinkSpec:
    return _load("links", name, LinkSpec)


@functools.lru_cache(maxsize=64)
def load_gpu_link(name: str) -> GpuLinkSpec:
    return _load("gpu_links", name, GpuLinkSpec)


@functools.lru_cache(maxsize=64)
def load_host(name: str) -> HostSpec:
    return _load("hosts", name, HostSpec)


def find_any(name: str) -> tuple[str, dict[str, Any]]:
    """Look a slug up in every kind (for ``kvsim profiles show NAME``)."""
    for kind in KINDS:
        if (_root() / kind / f"{name.lower()}.yaml").is_file():
            return kind, load_raw(kind, name)
    everything = [n for k in KINDS for n in list_names(k)]
    raise unknown_name("name", name, everything)


def _workloads_root() -> Path:
    return data_root("workloads")


def list_bundled(kind: str) -> list[str]:
    """Names of bundled ``workloads/<kind>/*.yaml`` (kind: scenarios or households)."""
    return sorted(p.stem for p in (_workloads_root() / kind).glob("*.yaml"))


def bundled_path(kind: str, name: str, field: str | None = None) -> Path:
    """Path of a bundled scenario or household preset, by name (``field``: how an error
    names it; default ``scenario`` / ``preset``)."""
    p = _workloads_root() / kind / f"{name}.yaml"
    if not p.is_file():
        if kind == "scenarios":
            raise unknown_name(field or "scenario", name, list_bundled(kind),
                               also="or a path to a scenario .yaml file")
        raise unknown_name(field or "preset", name, list_bundled(kind))
    return p


def unified_host(gpu: GpuSpec) -> HostSpec:
    """The host of a unified-memory machine: the GPU's own memory, nothing else.

    Memory and bandwidth are the GPU profile's (CPU and GPU share one DRAM, with no
    PCIe hop: docs/reference/hardware-and-models.md §3), so a user's own GPU YAML gets its host too;
    ``cpu_flops`` is the catalogue's planning estimate, which every shipped host carries
    (read from :data:`DEFAULT_HOST`, not retyped).  For a shipped unified GPU the
    numbers equal its shipped host profile's (e.g. dgx-spark → dgx-spark-128gb)."""
    return HostSpec(
        name=f"{gpu.name}-unified",
        display_name=f"{gpu.display_name}: unified memory",
        memory_bytes=gpu.memory_bytes,
        memory_bandwidth_bytes_per_s=gpu.memory_bandwidth_bytes_per_s,
        cpu_flops=load_host(DEFAULT_HOST).cpu_flops,
        unified_with_gpu=True,
        source=f"gpu profile '{gpu.name}' (memory, bandwidth): {gpu.source}; cpu_flops: "
               f"host profile '{DEFAULT_HOST}' (planning estimate)",
        notes="Derived: no host was named and the GPU has unified memory, so the host is "
              "the GPU's own memory (no separate RAM, no host tier over PCIe).")


def default_host(gpu: GpuSpec) -> HostSpec:
    """The host assumed when none is named: the GPU's own memory on a unified-memory
    machine (:func:`unified_host`), else the :data:`DEFAULT_HOST` desktop."""
    return unified_host(gpu) if gpu.unified_memory else load_host(DEFAULT_HOST)


def check_host_matches(gpu: GpuSpec, host: HostSpec, field: str = "host") -> None:
    """Refuse a host whose memory kind contradicts the GPU's: a unified-memory GPU has no
    separate RAM, and a unified host's memory is its own SoC GPU's, not a discrete
    card's (either way the host RAM check and the host tier would model a machine that
    does not exist)."""
    def matches(h: HostSpec) -> bool:  # NOTE: a unified host is its own SoC's memory
        return h.unified_with_gpu == gpu.unified_memory and (not gpu.unified_memory or (
            h.memory_bytes, h.memory_bandwidth_bytes_per_s)
            == (gpu.memory_bytes, gpu.memory_bandwidth_bytes_per_s))

    if matches(host):
        return
    same_kind = [n for n in list_names("hosts") if matches(load_host(n))]
    if gpu.unified_memory:
        why = (f"the host of {gpu.name}'s own memory (unified: its host RAM is the GPU's "
               f"{gpu.memory_bytes} bytes at {gpu.memory_bandwidth_bytes_per_s:.4g} B/s)")
        unset = "leave it unset (the GPU's own memory)"
    else:
        why = (f"a host with unified_with_gpu: false ({gpu.name} is a discrete card; a "
               "unified host's memory is its own SoC GPU's, not this card's over PCIe: no "
               "host tier)")
        unset = "leave it unset"
    raise InputError(field, host.name, f"{why}: one of {', '.join(same_kind)}, or {unset}")

