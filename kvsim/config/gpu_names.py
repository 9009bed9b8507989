"""Resolve a GPU name as tools and people print it to one catalogue profile.

Give :func:`resolve_gpu` any published device string: a slug (``rtx-4090``), a profile's
display name, what nvidia-smi / CUDA, ROCm / Vulkan, Metal or Intel's driver print
(``NVIDIA GeForce RTX 4090``, ``Tesla V100-PCIE-32GB``, ``AMD Radeon RX 7900 XTX``,
``Apple M2 Max``, ``Intel(R) Arc(TM) A770 Graphics``), a loose spelling (``RTX 3070
8GB``, ``A100 PCIe 80GB``, ``Apple M1 Pro (14-core GPU)``) or a multi-GPU string
(``2x NVIDIA GeForce RTX 3090``; llama-bench's comma-separated ``gpu_info``).

What a caller must know: :class:`GpuMatch` ``slug`` is set only when exactly one profile
fits; ``count`` is the number of devices the string names, whether or not it resolved;
``reason`` (empty on success) says why not — unknown, ambiguous (and what to add: the
memory size, the GPU core count, the form factor), or several kinds of device.

NOTE: resolution is by normalised tokens, never by closeness: case, brand noise words
(NVIDIA, GeForce, AMD, Radeon, Instinct, Tesla, Intel, Apple, Graphics, GPU), "(R)",
"(TM)" and other parenthesised remarks, spaces vs hyphens and letter/digit boundaries
("4090D" = "4090 D") do not matter; a memory size ("12GB") and an Apple GPU core count
("14-core GPU", "14c") are qualifiers that must fit the profile, and a name that carries
one only matches with it.  A string with fewer tokens than a profile's names matches it
only when nothing matches exactly, and a token that tells profiles apart (Ti, SUPER, XT,
D, Laptop…) never matches a profile without it.  Close spellings appear only in the
reason for an unknown name.  The index is built once from the shipped catalogue
(``lru_cache``) and never changed.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass

from kvsim.config.catalog import has_profile, list_names, load_gpu, names_a_file
from kvsim.config.specs import GpuSpec
from kvsim.errors import InputError

_NOISE = frozenset({"nvidia", "geforce", "amd", "radeon", "instinct", "tesla", "intel",
                    "apple", "graphics", "gpu", "igpu", "generation", "the"})
_SYNONYMS = {"mobile": "laptop"}
_MARKERS = frozenset({"nvidia", "geforce", "rtx", "gtx", "quadro", "tesla", "amd", "radeon",
                      "rx", "instinct", "intel", "arc", "iris", "apple"})
"""Words that make a comma-separated part of a string a device rather than a remark."""
_PAREN = re.compile(r"\([^()]*\)")
_CPU_CORES = re.compile(r"\d+\s*-?\s*core\s+cpu", re.IGNORECASE)
_GPU_CORES = re.compile(r"\b(\d+)\s*-?\s*(?:core\s+gpu|c)\b", re.IGNORECASE)
_MEMORY = re.compile(r"\b(\d+(?:\.\d+)?)\s*gi?b\b", re.IGNORECASE)
_COUNT = re.compile(r"^\s*(\d+)\s*(?:nodes?\s*)?[x×]\s*", re.IGNORECASE)


@dataclass(frozen=True)
class GpuMatch:
    """What a device string names: one profile (``slug``) or why not (``reason``)."""

    slug: str | None
    count: int
    reason: str = ""
    candidates: tuple[str, ...] = ()
    """When ``reason`` is "ambiguous" and the string names one kind of device: the
    profiles that fit it, in catalogue order (a caller whose answer is the same for
    each may take any)."""


@dataclass(frozen=True)
class _Query:
    tokens: frozenset[str]
    memory_gib: float | None
    cores: int | None


@dataclass(frozen=True)
class _Entry:
    slug: str
    memory_gib: float | None  # the qualifier this name carries, if any
    cores: int | None


@dataclass(frozen=True)
class _Profile:
    slug: str
    display: str
    memory_gib: float
    cores: int | None
    unified: bool


@dataclass(frozen=True)
class _Index:
    keys: dict[frozenset[str], tuple[_Entry, ...]]
    profiles: dict[str, _Profile]
    vocab: frozenset[str]
    spellings: dict[str, str]  # normalised name -> slug, for "closest" hints only


def _words(text: str) -> list[str]:
    """Lower-case words of ``text`` with parenthesised remarks, memory sizes and core
    counts removed and letters split from digits (noise words kept)."""
    t = text.lower()
    while _PAREN.search(t):
        t = _PAREN.sub(" ", t)
    t = _GPU_CORES.sub(" ", _CPU_CORES.sub(" ", t))
    t = _MEMORY.sub(" ", t)
    t = re.sub(r"(?<=\d)(?=[a-z])|(?<=[a-z])(?=\d)", " ", t)
    return [_SYNONYMS.get(w, w) for w in re.findall(r"[a-z0-9]+", t)]


def _query(text: str) -> _Query:
    no_cpu = _CPU_CORES.sub(" ", text)
    cores = _GPU_CORES.search(no_cpu)
    bare = no_cpu
    while _PAREN.search(bare):
        bare = _PAREN.sub(" ", bare)
    memory = _MEMORY.search(bare)
    return _Query(frozenset(w for w in _words(text) if w not in _NOISE),
                  float(memory.group(1)) if memory else None,
                  int(cores.group(1)) if cores else None)


@functools.lru_cache(maxsize=1)
def _index() -> _Index:
    keys: dict[frozenset[str], list[_Entry]] = {}
    profiles, spellings = {}, {}
    for slug in list_names("gpus"):
        g = load_gpu(slug)
        profiles[slug] = _Profile(slug, g.display_name, g.memory_bytes / 2**30,
                                  g.compute_units, g.unified_memory)
        for name in (g.display_name, *g.aliases):
            q = _query(name)
            if q.tokens:
                keys.setdefault(q.tokens, []).append(_Entry(slug, q.memory_gib, q.cores))
                spellings[" ".join(sorted(q.tokens))] = slug
    vocab = frozenset(w for k in keys for w in k)
    return _Index({k: tuple(v) for k, v in keys.items()}, profiles, vocab, spellings)


def _memory_fits(want: float, p: _Profile) -> bool:
    """A stated memory size fits the profile: the marketed size (within 4 %, what CUDA
    reports), or any configuration up to the largest on a unified-memory machine."""
    if p.unified:
        return want <= p.memory_gib + 0.5
    return abs(want - p.memory_gib) <= max(0.5, 0.04 * p.memory_gib)


def _fits(e: _Entry, q: _Query, p: _Profile, strict: bool = True) -> bool:
    """The query's qualifiers fit the profile, and (``strict``) the query states every
    qualifier this name of the profile carries."""
    mem_ok = _memory_fits(q.memory_gib, p) if q.memory_gib is not None \
        else not strict or e.memory_gib is None
    cores_ok = p.cores == q.cores if q.cores is not None else not strict or e.cores is None
    return mem_ok and cores_ok


def _candidates(q: _Query, idx: _Index) -> list[_Entry]:
    """Entries of the names the query spells exactly; else of the names that contain
    all its tokens; else of the names it contains plus only words no name uses."""
    if q.tokens in idx.keys:
        return list(idx.keys[q.tokens])
    wider = [e for k, es in idx.keys.items() if q.tokens < k for e in es]
    if wider:
        return wider
    return [e for k, es in idx.keys.items()
            if k < q.tokens and not (q.tokens - k) & idx.vocab for e in es]


def _listing(slugs: list[str], idx: _Index) -> str:
    return ", ".join(f"{s} ({idx.profiles[s].display})" for s in slugs)


def _ambiguous(text: str, q: _Query, slugs: list[str], idx: _Index) -> str:
    """Why several profiles (or one, only with a qualifier the string lacks) fit."""
    ps = [idx.profiles[s] for s in slugs]
    cores = sorted({p.cores for p in ps if p.cores})
    if q.cores is None and len(cores) == len(ps) > 1 and all(p.unified for p in ps):
        sold = ", ".join(f"{c}-" for c in cores[:-1]) + f" or {cores[-1]}-core GPUs"
        return (f"ambiguous: {text!r} is sold with {sold}; name the core count, e.g. "
                f"'{text} ({cores[-1]}-core GPU)'")
    mems = sorted({round(p.memory_gib) for p in ps})
    one_name = len(ps) == 1 or q.tokens in idx.keys  # variants of one name, not cards
    if q.memory_gib is None and len(mems) == len(ps) and one_name:
        if len(ps) == 1:
            return (f"ambiguous: {text!r} also names cards kvsim does not have; kvsim has "
                    f"the {mems[0]} GB one ({slugs[0]}): name the memory, e.g. "
                    f"'{text} {mems[0]}GB'")
        sold = ", ".join(str(m) for m in mems[:-1]) + f" or {mems[-1]} GB"
        return (f"ambiguous: {text!r} is sold with {sold}; name the memory, e.g. "
                f"'{text} {mems[-1]}GB'")
    return f"ambiguous: {text!r} matches {_listing(slugs, idx)}: name which one"


def _unknown(text: str, q: _Query, named: list[str], idx: _Index) -> str:
    if named:  # the name fits, the stated memory or core count does not
        p = idx.profiles[named[0]]
        what = (f"{q.cores}-core GPU" if q.cores is not None and p.cores != q.cores
                else f"{q.memory_gib:g} GB")
        return (f"unknown GPU {text!r}: kvsim has {_listing(named, idx)}, "
                f"not a {what} variant")
    close = difflib.get_close_matches(" ".join(sorted(q.tokens)), list(idx.spellings),
                                      n=3, cutoff=0.5)
    hint = ", ".join(dict.fromkeys(idx.spellings[c] for c in close)) or "none"
    return f"unknown GPU {text!r} (closest: {hint})"


def _resolve_one(text: str) -> tuple[str | None, str, tuple[str, ...]]:
    """(slug, "", ()) for one device name, or (None, why, the profiles that fit an
    ambiguous one)."""
    idx = _index()
    q = _query(text)
    if not q.tokens:
        return None, f"unknown GPU {text!r}: no device model named", ()
    entries = _candidates(q, idx)
    named = list(dict.fromkeys(e.slug for e in entries))
    fit = list(dict.fromkeys(e.slug for e in entries if _fits(e, q, idx.profiles[e.slug])))
    if len(fit) == 1:
        return fit[0], "", ()
    if fit:
        return None, _ambiguous(text, q, fit, idx), tuple(fit)
    lacking = list(dict.fromkeys(e.slug for e in entries
                                 if _fits(e, q, idx.profiles[e.slug], strict=False)))
    if len(lacking) == 1 and (q.memory_gib is not None or q.cores is not None):
        return lacking[0], "", ()  # the qualifier it states leaves one variant ("M3 Max 128GB")
    if lacking:  # they fit once the string names the qualifier it leaves out
        # NOTE: one profile lacking the qualifier is no candidate: the name also
        # names cards kvsim does not have ("RTX 2060": the 6 GB card)
        return None, _ambiguous(text, q, lacking, idx), \
            tuple(lacking) if len(lacking) > 1 else ()
    return None, _unknown(text, q, named, idx), ()


def printed_parts(text: str) -> list[str]:
    """Comma-separated parts outside parentheses (llama-bench's gpu_info lists)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p.strip() for p in [*parts, cur] if p.strip()]


def _count(part: str) -> tuple[int, str]:
    """Leading multiplicity ("2x ", "2 nodes x 8x ") and the rest of the part."""
    n = 1
    while m := _COUNT.match(part):
        n, part = n * int(m.group(1)), part[m.end():]
    return n, part.strip()


def resolve_gpu(text: str) -> GpuMatch:
    """The catalogue profile ``text`` names, and how many devices (module docstring)."""
    raw = (text or "").strip()
    if raw.lower() in _index().profiles:
        return GpuMatch(raw.lower(), 1)
    devices: list[tuple[int, str | None, str]] = []
    fits: list[tuple[str, ...]] = []
    first = ""
    for part in printed_parts(raw):
        n, body = _count(part)
        slug, why, fit = _resolve_one(body)
        first = first or why
        if slug is None and why.startswith("unknown") and not set(_words(body)) & _MARKERS:
            continue  # a remark ("all slots PCIe Gen4 x16", "250W cap"), not a device
        devices.append((n, slug, why))
        fits.append(fit)
    total = sum(n for n, _, _ in devices)
    if not devices:
        return GpuMatch(None, 0, first or f"unknown GPU {raw!r}: no device model named")
    failed = next((why for _, slug, why in devices if slug is None), "")
    if failed:
        one_kind = len(set(fits)) == 1 and all(slug is None for _, slug, _ in devices)
        return GpuMatch(None, total, failed, fits[0] if one_kind else ())
    kinds = list(dict.fromkeys(slug for _, slug, _ in devices))
    if len(kinds) > 1:
        return GpuMatch(None, total, f"several kinds of device in {raw!r}: "
                        f"{', '.join(str(k) for k in kinds)}")
    return GpuMatch(kinds[0], total)


def gpu_profiles(text: str, field: str) -> list[str | GpuSpec]:
    """What a user typed for a card (``--gpu``, a scenario's ``gpu``) as profiles, one per
    device: a slug or a profile path as given; a printed name (``NVIDIA GeForce RTX
    4090``, ``Apple M3 Max (40-core GPU)``, llama-bench's ``gpu_info``) as the slug it
    names (module docstring); a unified-memory machine named with a smaller memory than
    its profile's largest configuration (``Apple M2 Max (38-core GPU) 32GB``,
    ``apple-m2-max-38c-32gb``) as that configuration (:func:`unified_config`).

    NOTE: an ambiguous name is an InputError naming ``field`` and saying what to add; an
    unknown one is returned as given, so the catalogue's own error (closest slugs) names it.
    """
    if has_profile("gpus", text) or names_a_file(text):
        return [text]
    m = resolve_gpu(text)
    if m.slug is not None:
        gib = _query(text).memory_gib
        g = load_gpu(m.slug)
        if g.unified_memory and gib is not None and gib < g.memory_bytes / 2**30 - 0.5:
            return [unified_config(g, gib)] * m.count
        return [m.slug] * m.count
    if m.reason.startswith(("ambiguous", "several kinds")):
        raise InputError(field, text, m.reason)
    return [text]


def unified_config(g: GpuSpec, gib: float) -> GpuSpec:
    """A unified-memory profile (its largest configuration) with ``gib`` GiB of memory:
    the GPU's default share scaled with it (Apple's 70 %, docs/reference/
    hardware-and-models.md §4), named ``<slug>-<N>gb`` (which resolves to it again)."""
    mem = round(gib * 2**30)
    limit = g.gpu_memory_limit_bytes
    return g.model_copy(update={
        "name": f"{g.name}-{gib:g}gb", "display_name": f"{g.display_name} {gib:g} GB",
        "memory_bytes": mem,
        "gpu_memory_limit_bytes": None if limit is None else int(limit * mem / g.memory_bytes),
        "notes": f"{g.notes} | this configuration: {gib:g} GB of unified memory (the "
                 f"profile {g.name} is the largest, {g.memory_bytes / 2**30:g} GB)"})
