"""vLLM releases (docs/reference/engines.md §1.9): the start-up arithmetic one release has.

What decides vLLM's KV pool changed between releases; the ``vllm`` preset follows one,
``engine.version`` (default :data:`VLLM_LATEST`), and :func:`vllm_defaults` fills every
knob a scenario leaves unset the way that release does:

- **V0** (releases before 0.8.0, the default engine until then): chunked prefill only for
  a ``max_model_len`` above 32768, with a 512-token budget; otherwise no chunking and a
  batch budget of ``max(max_model_len, 2048)`` — so the profiling pass runs a whole
  ``max_model_len`` of dummy tokens and its activations grow with the context (issue
  #10517: 2.07 GiB at 20000, 2.99 GiB at 29000 on Llama-3.1-8B).  No reserved null block.
- **V1** (0.8.0 on): chunked prefill always, a batch budget of 2048 tokens and 256
  sequences below 70 GiB of memory or on an A100, 8192 / 1024 above (§1.4); block 0 is the
  null block.
- **0.21.0 on**: CUDA-graph memory is estimated in the profiling pass and taken out of the
  budget (the start-up log says "CUDA graph profiling default since v0.21.0", vllm-013 in
  ../shared/measurements/engine-memory-logs.csv) and ``gpu_memory_utilization`` defaults to
  0.92 (the current docs, §1.1; UNCERTAIN which release raised it from 0.9: kvsim takes the
  release that moved the graphs inside the budget, which the 0.92 compensates).

NOTE: a release is ``MAJOR.MINOR[.PATCH]`` with any suffix (``0.10.1.dev101+gbda9d0535``);
one newer than :data:`VLLM_LATEST` is refused (:func:`known_vllm_release`): kvsim does not
describe its start-up arithmetic, and taking it for the newest would hide that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kvsim.errors import InputError

if TYPE_CHECKING:
    from kvsim.config.specs import GpuSpec

Version = tuple[int, int, int]
VLLM_LATEST = "0.24.0"
"""The newest release a published start-up log names (vllm-011 in
../shared/measurements/engine-memory-logs.csv); the default ``engine.version``."""
VLLM_LAST_V0 = "0.7.3"
"""The last release whose default engine was V0 (V1 became the default in 0.8.0): what a
log in V0's format, release not shown, is laid out as."""
VLLM_V1_DEFAULT_DATE = "2025-03-18"
"""When 0.8.0, the first release whose default engine is V1, came out ("We have now enabled
V1 engine by default (vllm-project/vllm#13726)" in its release notes, as quoted in
vllm-project/vllm-ascend PR #557; "vllm 0.8.0 is posted", verl-project/verl PR #650,
2025-03-19): a log dated before it, release not shown, is V0's."""
VLLM_BEFORE_GRAPH_BUDGET = "0.16.0"
"""A V1 release from before CUDA-graph memory came into the budget (0.21.0): what a V1
log dated before :data:`VLLM_BEFORE_GRAPH_BUDGET_DATE`, release not shown, is laid out as
(every release from 0.8.0 to 0.20.x follows the same rules here)."""
VLLM_BEFORE_GRAPH_BUDGET_DATE = "2026-03-08"
"""A day when 0.17.0 was not yet out (a ``0.17.0rc1.dev149`` build of that day in a
comment on vllm-project/vllm PR #30515), so a log dated before it ran a release before
0.17.0, and so before 0.21.0."""
LARGE_GPU_BYTES = 70 * 2**30
"""§1.4: from this much memory (A100s aside) V1's default batch budget is larger."""
V0_LONG_CONTEXT_TOKENS = 32768
"""V0 turned chunked prefill on by default only above this max_model_len (EngineArgs)."""
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+\-]?[0-9A-Za-z.+\-]*)?")


@dataclass(frozen=True)
class VllmRelease:
    """The start-up rules of the releases from ``since`` on (until the next entry)."""

    since: Version
    engine: Literal["V0", "V1"]
    gpu_memory_utilization: float
    chunked_budget_tokens: int        # V0: the batch budget when chunked prefill is on
    cuda_graphs_in_budget: bool       # CUDA-graph memory estimated and taken from the share
    source: str


RELEASES: tuple[VllmRelease, ...] = (
    VllmRelease((0, 0, 0), "V0", 0.9, 512, False,
                "V0 EngineArgs: chunked prefill above 32K max_model_len with "
                "max_num_batched_tokens=512; SchedulerConfig: max(max_model_len, 2048)"),
    VllmRelease((0, 8, 0), "V1", 0.9, 2048, False,
                "V1 default engine (§1.4 batch budget; §1.1 graphs outside the budget)"),
    VllmRelease((0, 21, 0), "V1", 0.92, 2048, True,
                "CUDA graph profiling default since v0.21.0 (vllm-013); util 0.92 (§1.1)"),
)


def parse_vllm_version(text: Any, field: str = "engine.version") -> Version:
    """'0.6.4' / 'v0.10.1.dev101+gbda9d0535' / '0.19' → ``(major, minor, patch)``."""
    m = _VERSION.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise InputError(field, text, "a vLLM release as MAJOR.MINOR[.PATCH] in quotes, e.g. "
                         f"'0.6.4' or '0.10.1' (newest described: {VLLM_LATEST})")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def _shown(v: Version) -> str:
    return ".".join(map(str, v))


def known_releases() -> str:
    """The releases kvsim describes, in words (what an unknown release's error lists)."""
    eras = [f"{r.engine} from {_shown(r.since)}" + (" (CUDA graphs in the budget)"
                                                     if r.cuda_graphs_in_budget else "")
            for r in RELEASES[1:]]
    return f"V0 up to {VLLM_LAST_V0}, {', '.join(eras)}, up to {VLLM_LATEST}"


def known_vllm_release(text: Any, field: str = "engine.version") -> Version:
    """:func:`parse_vllm_version`, and refused (InputError) when newer than
    :data:`VLLM_LATEST`: a release kvsim does not know."""
    v = parse_vllm_version(text, field)
    if v > parse_vllm_version(VLLM_LATEST):
        raise InputError(field, text, f"a vLLM release kvsim describes: {known_releases()} "
                         "(docs/reference/engines.md §1.9); a newer release's start-up "
                         "arithmetic is not described")
    return v


def vllm_release(version: str | None) -> VllmRelease:
    """The rules release ``version`` follows (None: :data:`VLLM_LATEST`; a newer one
    than that is an InputError)."""
    v = known_vllm_release(VLLM_LATEST if version is None else version)
    return next(r for r in reversed(RELEASES) if v >= r.since)


def batch_budget(release: VllmRelease, context_tokens: int, gpu: GpuSpec | None
                 ) -> tuple[int, int]:
    """The default ``(max_num_batched_tokens, max_num_seqs)`` of ``release`` for this
    max_model_len on ``gpu`` (None: a card below 70 GiB)."""
    if release.engine == "V0":
        if context_tokens > V0_LONG_CONTEXT_TOKENS:
            return release.chunked_budget_tokens, 256
        return max(context_tokens, 2048), 256
    large = gpu is not None and gpu.memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.name
    return (8192, 1024) if large else (2048, 256)


def vllm_defaults(merged: dict[str, Any], given: set[str], gpu: GpuSpec | None
                  ) -> dict[str, Any]:
    """The knobs release ``merged['version']`` derives for those not in ``given``: the
    memory share, the batch budget and sequence cap, and whether CUDA graphs come out of
    the share.  NOTE: the batch budget needs the context, so it follows ``context_tokens``
    as merged (the model's maximum when unset, kvsim.engines.resolve.engine_for_gpu)."""
    release = vllm_release(merged.get("version"))
    fill: dict[str, Any] = {}
    if "gpu_memory_utilization" not in given:
        fill["gpu_memory_utilization"] = release.gpu_memory_utilization
    if "cuda_graphs_in_budget" not in given:
        fill["cuda_graphs_in_budget"] = release.cuda_graphs_in_budget
    ctx = merged.get("context_tokens")
    if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0:
        tokens, seqs = batch_budget(release, ctx, gpu)
        if "max_num_batched_tokens" not in given:
            fill["max_num_batched_tokens"] = tokens
        if "max_num_seqs" not in given:
            fill["max_num_seqs"] = seqs
    return fill
