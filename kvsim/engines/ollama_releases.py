"""Ollama releases (docs/reference/engines.md §4): which defaults and memory layout one release has.

Ollama changed its defaults and its engine between releases; the ``ollama`` preset
follows one, ``engine.ollama_version`` (default :data:`OLLAMA_LATEST`).  For every knob a
scenario leaves unset, :func:`ollama_defaults` derives what that release does:

- ``num_ctx`` (§4.1): 2048 up to v0.6.6, 4096 to v0.15.4, then by the GPU's memory less
  OLLAMA_GPU_OVERHEAD (< 23 GiB 4096, < 47 GiB 32768, else 262144), clamped to the
  model's training length, per slot (not divided by OLLAMA_NUM_PARALLEL, ollama #14116);
- flash attention (§4.1): off, on for qwen3 / qwen3moe / gpt-oss from v0.12.4 and gemma3
  from v0.12.7; from v0.30 ``--flash-attn auto`` (§4.4) = on (§3.2);
- OLLAMA_NUM_PARALLEL (§4.1): 1, automatic from v0.1.49 to v0.9.6;
- era D (v0.30+, §4.4): llama-server's slot choice and RAM prompt cache (§3.4).

:func:`ollama_memory_mode` says how the release places layers (§4.2-§4.4), read by
:func:`kvsim.engines.ollama.ollama_budget`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import parse_bytes
from kvsim.engines.base import BudgetOf
from kvsim.errors import InputError

if TYPE_CHECKING:
    from kvsim.engines.config import SlotEngineConfig

Version = tuple[int, int, int]
OLLAMA_LATEST = "0.33.0"
"""The newest release docs/reference/engines.md §4 describes (Ollama's history read up to
v0.33.0-rc2); the preset's ``ollama_version``.  A later release is refused
(:func:`known_ollama_release`): kvsim does not describe it."""
OLLAMA_ERA_B, OLLAMA_ERA_C, OLLAMA_ERA_D = (0, 11, 5), (0, 12, 11), (0, 30, 0)  # §4 table
OLLAMA_NUM_CTX_4096, OLLAMA_NUM_CTX_BY_VRAM = (0, 6, 7), (0, 15, 5)             # §4.1
OLLAMA_NUM_CTX_TIERS = ((47 * 2**30, 262_144), (23 * 2**30, 32_768))            # §4.1
"""v0.15.5+: total VRAM minus OLLAMA_GPU_OVERHEAD ≥ 47 GiB → 262144, ≥ 23 GiB → 32768,
else 4096 (server/routes.go: "slightly lower thresholds (47/23 GiB vs. 48/24 GiB)")."""
OLLAMA_AUTO_PARALLEL = (0, 1, 49), (0, 9, 7)   # §4.1: unset = auto from v0.1.49 until v0.9.7
OLLAMA_AUTO_PARALLEL_2 = (0, 6, 7)             # §4.1: the auto value 4, then 2 from v0.6.7
OLLAMA_FLASH_ATTENTION_SINCE: dict[str, Version] = {
    # §4.1: on by default "by v0.12.x" for a per-architecture list; =0 forces it off from
    # v0.12.4 (the release of the qwen3 default, ollama PR #12482); gemma3 from v0.12.7
    # (its release notes; PR #12639).  qwen3vl (PR #12862) has no catalogue model.
    "qwen3": (0, 12, 4), "qwen3moe": (0, 12, 4), "gptoss": (0, 12, 4), "gemma3": (0, 12, 7)}
OLLAMA_ENGINE_ARCHS = frozenset({"gemma3", "gptoss", "qwen3", "qwen3moe", "llama4"})
"""Era B (§4.3): architectures the Go "ollama engine" runs (fs/ggml/ggml.go
OllamaEngineRequired), whose layers it places by measured sizes; others still by §4.2."""
LLAMA_SERVER_DEFAULTS = {"slot_prompt_similarity": 0.10, "cache_ram_bytes": 8192 * 2**20,
                         "cache_idle_slots": True}
"""Era D: Ollama launches llama-server with only the flags of §4.4, so its slots and prompt
cache are llama-server's own defaults (§3.4), not the Go runners' (§4.5)."""
OLLAMA_RELEASE_MONTHS: tuple[tuple[str, Version], ...] = (
    ("2024-06", OLLAMA_AUTO_PARALLEL[0]), ("2025-04", OLLAMA_NUM_CTX_4096),
    ("2025-07", OLLAMA_AUTO_PARALLEL[1]), ("2025-08", OLLAMA_ERA_B),
    ("2025-11", OLLAMA_ERA_C), ("2026-02", OLLAMA_NUM_CTX_BY_VRAM), ("2026-05", OLLAMA_ERA_D))
"""The month each release that changes what kvsim lays out came out, as §4 dates them
(v0.1.49 Jun 2024, v0.6.7 Apr 2025, v0.9.7 Jul 2025, era B Aug 2025, era C Nov 2025,
v0.15.5 Feb 2026, era D late May 2026): kvsim describes every release between two of
them alike (the v0.12.4 / v0.12.7 flash-attention defaults, undated there, aside)."""
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")
_ARCHS = ((r"qwen3[-_.]?next", "qwen3next"), (r"qwen3[-_.]?vl", "qwen3vl"),
          (r"qwen3(?![\d.])", "qwen3"), (r"gemma[-_]?3(?![\dn])", "gemma3"),
          (r"gpt[-_]?oss", "gptoss"), (r"llama[-_]?4", "llama4"),
          # NOTE: DeepSeek-V2/V3 (and R1, V3's geometry); R1's distills are Qwen2 / Llama
          (r"deepseek[-_]?(?:v\d|r1(?![-_]distill))", "deepseek2"),
          (r"gemma[-_]?2(?!\d)", "gemma2"), (r"command[-_]?r", "command-r"),
          (r"qwen2\.5[-_]?vl", "qwen25vl"), (r"qwen2[-_]?vl", "qwen2vl"),
          (r"qwen(?:1\.5|2(?:\.5)?)(?![\d.])|distill[-_]qwen", "qwen2"),
          # NOTE: Mistral's and Mixtral's GGUFs are "llama"
          (r"llama[-_]?[23](?!\d)|mistral(?!ai)|mixtral|distill[-_]llama", "llama"))


def parse_ollama_version(text: Any, field: str = "engine.ollama_version") -> Version:
    """'0.15.5' / 'v0.12.4' / '0.6' → a comparable ``(major, minor, patch)``."""
    m = _VERSION.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise InputError(field, text, "an Ollama release as MAJOR.MINOR[.PATCH] in quotes, "
                         f"e.g. '0.15.5' or 'v0.12.4' (newest described: {OLLAMA_LATEST})")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def _shown(v: Version) -> str:
    return ".".join(map(str, v))


def known_ollama_release(text: Any, field: str = "engine.ollama_version") -> Version:
    """:func:`parse_ollama_version`, and refused (InputError) when newer than
    :data:`OLLAMA_LATEST`: a release kvsim does not know."""
    v = parse_ollama_version(text, field)
    if v > parse_ollama_version(OLLAMA_LATEST):
        eras = (f"the estimator up to v0.11.4, measured placement from "
                f"v{_shown(OLLAMA_ERA_B)} (all models from v{_shown(OLLAMA_ERA_C)}), "
                f"llama-server from v{_shown(OLLAMA_ERA_D)}")
        raise InputError(field, text, f"an Ollama release kvsim describes: up to "
                         f"{OLLAMA_LATEST} ({eras}; docs/reference/engines.md §4); a newer "
                         "release's defaults and memory layout are not described")
    return v


def ollama_arch(model: ModelSpec | None) -> str:
    """The GGUF ``general.architecture`` Ollama keys its per-model rules on, from the
    profile's name or HF repo ('' when kvsim cannot tell, or no model is known: no
    per-architecture rule)."""
    if model is None:
        return ""
    text = f"{model.name} {model.hf_repo}".lower()
    arch = next((a for pattern, a in _ARCHS if re.search(pattern, text)), "")
    return "qwen3moe" if arch == "qwen3" and model.num_experts else arch


def ollama_default_num_ctx(version: Version, gpu: GpuSpec | None = None,
                           gpu_overhead_bytes: int = 0,
                           more_gpus: tuple[GpuSpec, ...] = ()) -> int:
    """num_ctx when none is set (§4.1): 2048 up to v0.6.6, 4096 to v0.15.4, then by the
    GPUs' memory (a unified-memory GPU: its default share) each less OLLAMA_GPU_OVERHEAD,
    summed over the box; no GPU known counts as none found (0 bytes: 4096)."""
    if version < OLLAMA_NUM_CTX_4096:
        return 2048
    if version < OLLAMA_NUM_CTX_BY_VRAM or gpu is None:
        return 4096
    vram = sum(g.usable_memory_bytes - gpu_overhead_bytes for g in (gpu, *more_gpus))
    return next((n for floor, n in OLLAMA_NUM_CTX_TIERS if vram >= floor), 4096)


def ollama_default_flash_attn(version: Version, model: Any = None) -> bool:
    """OLLAMA_FLASH_ATTENTION unset (§4.1): off, except for the listed architectures from
    their release; from v0.30 (era D) Ollama passes ``--flash-attn auto`` (§4.4), which
    llama-server turns on where the backend supports it (§3.2): every catalogue GPU."""
    if version >= OLLAMA_ERA_D:
        return True
    since = OLLAMA_FLASH_ATTENTION_SINCE.get(ollama_arch(model)) if model is not None else None
    return since is not None and version >= since


def ollama_memory_mode(cfg: SlotEngineConfig, model: Any
                       ) -> Literal["estimate", "measured", "llama-server"]:
    """How the release places layers (§4 table): the era-A estimator (§4.2), measured
    sizes (§4.3: era B on the Go engine's architectures, era C all) or llama-server's
    ``--fit`` (era D, §4.4)."""
    v = known_ollama_release(cfg.ollama_version)
    if v >= OLLAMA_ERA_D:
        return "llama-server"
    if v >= OLLAMA_ERA_C or (v >= OLLAMA_ERA_B and ollama_arch(model) in OLLAMA_ENGINE_ARCHS):
        return "measured"
    return "estimate"


def ollama_llama_server(cfg: SlotEngineConfig) -> SlotEngineConfig:
    """Era D (§4.4): the llama-server Ollama starts, ``-c num_ctx × parallel -np parallel``
    (an explicit -np without -kvu: per-slot streams, §3.1), ``-ngl`` only when num_gpu is
    set (else --fit places the layers, §3.6)."""
    return cfg.model_copy(update={"ctx_size": cfg.context_tokens * cfg.parallel,
                                  "allocator": "slots", "fit_context": False})


def ollama_defaults(merged: dict[str, Any], given: set[str], gpu: GpuSpec | None,
                    model: Any, weights: str | None, budget_of: BudgetOf,
                    more_gpus: tuple[GpuSpec, ...] = ()) -> dict[str, Any]:
    """The defaults Ollama ``merged['ollama_version']`` derives for the knobs not in
    ``given`` (docs/reference/engines.md §4.1, §4.4): num_ctx (clamped to the model's training
    length), flash attention, OLLAMA_NUM_PARALLEL and, in era D, llama-server's slot and
    prompt-cache defaults.  The tiered num_ctx is per slot: it is not divided by the parallel count
    (ollama #14116), so 4 slots on a 24 GiB card hold 4 × 32768 cells.  ``budget_of``
    sizes a candidate parallel count where the release chose it itself (on the whole box:
    ``gpu`` and ``more_gpus``)."""
    v = known_ollama_release(merged.get("ollama_version"))
    fill: dict[str, Any] = {}
    if "context_tokens" not in given:
        overhead = parse_bytes(merged.get("gpu_overhead_bytes") or 0,
                               "engine.gpu_overhead_bytes")
        ctx = ollama_default_num_ctx(v, gpu, overhead, more_gpus)
        fill["context_tokens"] = ctx if model is None else min(ctx, model.max_context_tokens)
    if "flash_attn" not in given:
        fill["flash_attn"] = ollama_default_flash_attn(v, model)
    if v >= OLLAMA_ERA_D:
        fill.update({k: x for k, x in LLAMA_SERVER_DEFAULTS.items() if k not in given})
    if "parallel" not in given:
        fill["parallel"] = _ollama_default_parallel(v, {**merged, **fill}, gpu, model, weights,
                                                    budget_of)
    return fill


def _ollama_default_parallel(v: Version, merged: dict[str, Any], gpu: GpuSpec | None,
                             model: Any, weights: str | None, budget_of: BudgetOf) -> int:
    """OLLAMA_NUM_PARALLEL unset (§4.1): 1, except from v0.1.49 to v0.9.6 (auto): 4 (2 from
    v0.6.7) if the model with that many num_ctx slots fits the GPU whole by Ollama's own
    estimate (§4.2: every layer and the output layer, ``llm/memory.go`` PredictServerFit),
    else 1 (no GPU known: none found, 1)."""
    first, last = OLLAMA_AUTO_PARALLEL
    if not first <= v < last or gpu is None:
        return 1
    if model is None or weights is None:
        raise InputError("engine.parallel", "unset", f"a number: Ollama {merged['ollama_version']}"
                         " chose OLLAMA_NUM_PARALLEL itself from the model and weights "
                         "(docs/reference/engines.md §4.1), which kvsim is not given here; set it")
    n = 4 if v < OLLAMA_AUTO_PARALLEL_2 else 2
    est = budget_of({**merged, "parallel": n}).estimate
    return n if est is not None and est.layers_offload > model.num_layers else 1


def ollama_release_at(date: str) -> tuple[str | None, str]:
    """(the release a log dated ``date`` — ISO, perhaps only YYYY-MM — is laid out as, why)
    for a log that shows no release: the last of :data:`OLLAMA_RELEASE_MONTHS` out in a
    month before the log's (a log of the month a release came out may predate it: the
    one before).  (None, why) before the first of them or for no date."""
    month = (date or "").strip()[:7]
    if not re.fullmatch(r"\d{4}-\d{2}", month):
        return None, "release not shown: kvsim follows the newest release it knows"
    before = [(m, v) for m, v in OLLAMA_RELEASE_MONTHS if m < month]
    if not before:
        return None, (f"release not shown, log dated {date} (before v{_shown(OLLAMA_AUTO_PARALLEL[0])}"
                      ", the first release kvsim dates): kvsim follows the newest release it knows")
    m, v = before[-1]
    return _shown(v), (f"release not shown: a log dated {date} is laid out as v{_shown(v)} "
                       f"(out {m}), the last release before it that changes kvsim's layout "
                       "(docs/reference/engines.md §4)")
