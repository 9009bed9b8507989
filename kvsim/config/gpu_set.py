"""Several GPUs in one box: how a user names them, and the link between the cards.

A scenario's ``gpu`` (and ``kvsim fit --gpu``, a ``kvsim compare --gpus`` candidate) is
one GPU profile name, ``N x NAME`` (``2x rtx-3090``), names joined by ``+``
(``rtx-3090+rtx-3060``; ``2x rtx-3090+rtx-3060``), or, in YAML, a list of names or inline
profiles.  A name is a slug or what drivers and tools print (``NVIDIA GeForce RTX 3090``,
``Apple M2 Max (38-core GPU) 32GB``: kvsim.config.gpu_names.gpu_profiles).  :func:`gpu_items`
turns any of these into the list of cards in device order (CUDA device 0 first).

The link between the cards is a ``gpu_links`` profile (``hardware_profiles/gpu_links/``:
PCIe with P2P or staged through host RAM, NVLink bridges).  Unnamed, it is
:func:`default_gpu_link`: PCIe at the slowest card's generation and lanes, staged through
host RAM on GeForce cards (their stock drivers disable P2P over PCIe:
``docs/reference/hardware-and-models.md`` §3 measures 3× RTX 4090 with P2P disabled and
only with a patched driver enabled) and P2P on workstation and data-centre cards.

NOTE: consumer boards often run two cards at x8/x8; the default takes each card's own
lanes, so name the link (``gpu_link: pcie4-x8-host``) when the board splits them.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from kvsim.config.gpu_names import gpu_profiles
from kvsim.config.specs import GpuLinkSpec, GpuSpec
from kvsim.errors import InputError

MAX_GPUS = 16
"""The most cards one box may name (the largest setups in the published logs are 8)."""
_COUNT = re.compile(r"^\s*(\d+)\s*[x×*]\s*(\S.*?)\s*$", re.IGNORECASE)


def _one_part(part: str, field: str, whole: str) -> list[Any]:
    """The cards one ``+`` part names: ``NAME`` or ``N x NAME``, the name resolved once."""
    m = _COUNT.match(part)
    if m is None:
        return gpu_profiles(part.strip(), field)
    n = int(m.group(1))
    if not 1 <= n <= MAX_GPUS:
        raise InputError(field, whole, f"a GPU count from 1 to {MAX_GPUS} before 'x NAME'")
    return gpu_profiles(m.group(2), field) * n


def gpu_items(value: Any, field: str = "gpu") -> list[Any]:
    """The cards ``value`` names, in device order: profile slugs or paths (str; a printed
    name resolved to its slug) or inline profiles (mappings / GpuSpec) as given;
    InputError for an empty or oversized set, or an ambiguous printed name."""
    if isinstance(value, (list, tuple)):
        items: list[Any] = []
        for v in value:
            items += gpu_items(v, field) if isinstance(v, str) else [v]
    elif isinstance(value, str):
        parts = [p for p in value.split("+")]
        if any(not p.strip() for p in parts):
            raise InputError(field, value, "GPU profile names joined by '+', each one "
                             "NAME or N x NAME (e.g. 2x rtx-3090+rtx-3060)")
        items = [card for p in parts for card in _one_part(p, field, value)]
    else:
        items = [value]
    if not items:
        raise InputError(field, value, "at least one GPU")
    if len(items) > MAX_GPUS:
        raise InputError(field, value, f"at most {MAX_GPUS} GPUs in one box")
    return items


def gpu_set_label(names: Sequence[str]) -> str:
    """How kvsim writes a set of GPU names back: ``rtx-3090``, ``2x rtx-3090``,
    ``rtx-3090+rtx-3060`` (runs of one card counted, device order kept)."""
    return "+".join(name if n == 1 else f"{n}x {name}"
                    for name, n in ((k, len(list(g))) for k, g in itertools.groupby(names)))


def gpu_set_display(gpus: Sequence[GpuSpec]) -> str:
    """A set's display name: ``GeForce RTX 3090``, ``2 × GeForce RTX 3090``, joined by ' + '."""
    return " + ".join(g[0].display_name if len(g) == 1 else f"{len(g)} × {g[0].display_name}"
                      for g in (list(v) for _, v in itertools.groupby(gpus, key=lambda x: x.name)))


def default_gpu_link(gpus: tuple[GpuSpec, ...]) -> str | None:
    """The link profile a box of ``gpus`` gets when none is named (module docstring);
    None for one GPU, or when a card has no PCIe figures (a unified-memory machine)."""
    if len(gpus) < 2 or any(g.pcie_gen is None or g.pcie_lanes is None for g in gpus):
        return None
    gen = min(min(int(g.pcie_gen or 0) for g in gpus), 5)
    lanes = min(int(g.pcie_lanes or 0) for g in gpus)
    lanes = max(n for n in (4, 8, 16) if n <= max(lanes, 4))
    geforce = any(g.segment == "consumer" for g in gpus)
    return f"pcie{max(gen, 3)}-x{lanes}-{'host' if geforce else 'p2p'}"


def check_gpu_link(gpus: tuple[GpuSpec, ...], link: GpuLinkSpec) -> None:
    """A link the cards can have: NVLink only between cards with an NVLink connector,
    a PCIe generation / lane count no card exceeds, no link on a unified-memory SoC."""
    if any(g.unified_memory for g in gpus):
        raise InputError("gpu_link", link.name, "no GPU link on a unified-memory machine: "
                         "it has one GPU")
    if link.kind == "nvlink":
        lacking = sorted({g.name for g in gpus if not g.nvlink})
        if lacking:
            raise InputError("gpu_link", link.name, "a PCIe link (pcieG-xN-host / -p2p): "
                             f"no NVLink connector on {', '.join(lacking)}")
        return
    gen = min(int(g.pcie_gen or 0) for g in gpus)
    lanes = min(int(g.pcie_lanes or 0) for g in gpus)
    if (link.pcie_gen or 0) > gen or (link.pcie_lanes or 0) > lanes:
        raise InputError("gpu_link", link.name, f"PCIe {gen}.0 x{lanes} or slower: the "
                         "slowest card's own link (" + ", ".join(
                             f"{g.name} PCIe {g.pcie_gen}.0 x{g.pcie_lanes}" for g in gpus)
                         + ")")
