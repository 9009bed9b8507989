"""``kvsim fit``: does this model, context and parallelism fit this card on this engine?

Prints the static memory budget as the engine would lay it out (see
:mod:`kvsim.engines.budget`), a verdict, and the largest context (at the given
parallelism) and parallelism (each session keeping its context, llama.cpp ``-c`` scaled
with it as plan's flags set it) that keep every layer on the GPU and peak device use at
or under 85 %.  vLLM and SGLang preallocate their share of the device whatever the
context: for them those sizes hold once the memory fraction (printed) is lowered to
keep the whole device under the line.

NOTE: ``--context`` is what one session may hold, on every engine (as in ``kvsim plan``):
kvsim derives the engine's own flag and prints it — llama.cpp ``-c`` = context x its
slots (``--parallel``, else the preset's), Ollama ``num_ctx``, vLLM/SGLang
``max_model_len``.  ``--ctx-size`` sets llama.cpp's ``-c`` itself, for users who think in
flags.
``--parallel`` means what it means in ``kvsim plan`` (:mod:`kvsim.plan.parallel`):
sessions each guaranteed its full context — on vLLM/SGLang ``--max-num-seqs`` set to
it and a pool that holds that many ``max_model_len`` requests.  On llama.cpp the
allocator follows a scenario's rule: the preset's unified pool unless
``--no-kv-unified`` (a scenario's ``engine.allocator: slots``), with or without
``--parallel``; the output says which it assumed.  Unset on vLLM/SGLang, the engine's
``max_num_seqs`` is named and the JSON's ``parallel`` is null.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from kvsim.cli._fit_box import BOX_FLAGS, GPU_HELP, box_knobs, box_options, load_box
from kvsim.cli._fit_output import as_json as _as_json
from kvsim.cli._fit_output import context_words as _context_words
from kvsim.cli._fit_output import print_table as _print_table
from kvsim.cli._fit_output import sizes as _sizes
from kvsim.cli._fit_output import verdict as _verdict
from kvsim.config.catalog import (
    check_host_matches,
    has_profile,
    load_host,
    load_model,
    unified_host,
)
from kvsim.config.gpu_set import gpu_set_display
from kvsim.config.units import format_bytes, parse_bytes, parse_count
from kvsim.engines import engine_for, registered_engines
from kvsim.errors import InputError, unknown_name
from kvsim.model.names import model_slug
from kvsim.model.weights import check_weights_for, weight_format, weight_format_names

QUANT_OK_WITHOUT_FA = ("f16", "bf16", "f32")
# every weight format kvsim.model.weights knows, widest first (the --weights help)
WEIGHT_FORMATS = sorted(weight_format_names(), key=lambda n: -weight_format(n).bits_per_weight)


INT32_MAX = 2**31 - 1


def _check_session_context(ctx: int | None, ctx_size: int | None, eng: Any,
                           model: Any) -> None:
    """Refuse a per-session context above the model's maximum, as ``kvsim plan`` does
    (kvsim.plan.flags.check_contexts): llama-server caps each slot at it, so the cells
    above are ones no session can use; vLLM/SGLang refuse such a max_model_len (already,
    in the engine's resolution) and Ollama clamps num_ctx to it."""
    if engine_for(eng.preset).context_scope != "pool":
        return
    most, slots = model.max_context_tokens, eng.parallel
    if ctx is not None and ctx > most:
        raise InputError("--context", ctx, f"at most {most:,} tokens per session: "
                         f"{model.name}'s maximum, at which llama-server caps each slot")
    if ctx_size is not None and ctx_size > most * slots:
        raise InputError("--ctx-size", ctx_size, f"at most {most * slots:,} for {slots} "
                         f"slot{'s' * (slots != 1)} (-c is all slots' cells): "
                         f"{model.name}'s maximum is {most:,} tokens per session and "
                         "llama-server caps each slot at it")


def _engine_context(engine: str, ctx: int | None, ctx_size: int | None) -> dict[str, int]:
    """The scenario knob of the context flag given: ``--context`` is ``context_tokens``
    (per session, on every engine); ``--ctx-size`` is llama.cpp's ``ctx_size`` (``-c``,
    all slots together; the engine config derives the other, kvsim.engines.config)."""
    if ctx_size is not None:
        if ctx is not None:
            raise InputError("--ctx-size", ctx_size, "either --context (per session) or "
                             "--ctx-size (llama.cpp's -c, all slots together), not both")
        if engine_for(engine).context_scope != "pool":
            raise InputError("--ctx-size", ctx_size, f"{engine} has no -c for all slots; "
                             "--context is its per-session context")
        return {"ctx_size": ctx_size}
    return {} if ctx is None else {"context_tokens": ctx}


def _positive(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    n = parse_count(value, flag)
    if n <= 0:
        raise InputError(flag, value, "must be a positive integer token/slot count")
    return n


# Flags that only some engines have a setting for (kvsim.engines.base.Engine.settings):
# key → (flag, what it sets).  Given for another engine they are refused, never silently
# ignored.
ENGINE_ONLY_FLAGS: dict[str, tuple[str, str]] = {
    "flash_attn": ("--flash-attn", "a flash-attention switch"),
    "gpu_layers": ("--gpu-layers", "a GPU layer count (-ngl / num_gpu)"),
    "kv_unified": ("--kv-unified", "a unified KV pool switch (-kvu)"),
    "gpu_util": ("--gpu-util", "a memory fraction (gpu_memory_utilization / mem_fraction_static)"),
    "hybrid_kv": ("--hybrid-kv", "a hybrid KV cache manager"),
    "ollama_version": ("--ollama-version", "releases with their own defaults"),
    "vllm_version": ("--vllm-version", "releases with their own start-up arithmetic"),
    "language_model_only": ("--language-model-only",
                            "a text-only switch that drops a checkpoint's image encoder"),
    **BOX_FLAGS,
}


FIELD_FLAGS = {"engine.context_tokens": "--context", "engine.ctx_size": "--ctx-size",
               "engine.parallel": "--parallel",
               "engine.max_num_seqs": "--parallel", "engine.ollama_version": "--ollama-version",
               "engine.version": "--vllm-version",
               "engine.gpu_memory_utilization": "--gpu-util",
               "engine.gpu_layers": "--gpu-layers", "engine.cache_type_k": "--kv-k",
               "engine.cache_type_v": "--kv-v",
               **{f"engine.{k}": flag for k, (flag, _) in BOX_FLAGS.items()}}
"""Engine fields a scenario error names → the fit flag that set them."""


def _counts(context: str | None, ctx_size: str | None, parallel: str | None,
            gpu_layers: str | None, gpu_util: float | None
            ) -> tuple[int | None, int | None, int | None, int | None]:
    """``--context``, ``--ctx-size``, ``--parallel`` and ``--gpu-layers`` as numbers, each
    in its range (and ``--gpu-util`` checked): an InputError naming the flag otherwise."""
    ctx = _positive(context, "--context")
    size = _positive(ctx_size, "--ctx-size")
    par = _positive(parallel, "--parallel")
    if ctx is not None and par is not None and par > ctx:
        raise InputError("--parallel", par, f"must not exceed --context ({ctx})")
    ngl = None if gpu_layers is None else parse_count(gpu_layers, "--gpu-layers")
    if ngl is not None and not 0 <= ngl <= INT32_MAX:
        raise InputError("--gpu-layers", gpu_layers, f"between 0 and {INT32_MAX} (-ngl is "
                         "a 32-bit count; a number above the model's layers = all of them)")
    if gpu_util is not None and not 0 < gpu_util <= 1:
        raise InputError("--gpu-util", gpu_util, "a fraction in (0, 1]")
    return ctx, size, par, ngl


@contextmanager
def _as_flags() -> Iterator[None]:
    """Re-raise an engine's InputError under the fit flag the user typed."""
    try:
        yield
    except InputError as exc:
        if exc.field not in FIELD_FLAGS:
            raise
        raise InputError(FIELD_FLAGS[exc.field], exc.value, exc.allowed) from None


def _refuse_foreign_flags(engine: str, given: dict[str, Any]) -> None:
    """An InputError for the first flag in ``given`` (key → value, None = not given)
    that ``engine`` has no setting for: names the flag as typed, the engine, and the
    engines that have it."""
    for key, value in given.items():
        flag, what = ENGINE_ONLY_FLAGS[key]
        if value is None or key in engine_for(engine).settings:
            continue
        engines = [n for n in registered_engines() if key in engine_for(n).settings]
        typed = flag.replace("--", "--no-", 1) if value is False else flag
        verb = "has" if len(engines) == 1 else "have"
        raise InputError(typed, engine, f"{engine} has no such setting; only "
                         f"{' and '.join(engines)} {verb} {what}")


def _engine_spec(engine: str, context: dict[str, int], parallel: int | None, kv_k: str | None,
                 kv_v: str | None, kv_unified: bool | None, flash_attn: bool | None,
                 gpu_layers: int | None, gpu_util: float | None,
                 hybrid_kv: bool | None = None,
                 ollama_version: str | None = None,
                 vllm_version: str | None = None,
                 language_model_only: bool | None = None) -> dict[str, Any]:
    from kvsim.engines.resolve import engine_names, resolve_engine
    if engine not in engine_names():
        raise unknown_name("--engine", engine, engine_names())
    _refuse_foreign_flags(engine, {"flash_attn": flash_attn, "gpu_layers": gpu_layers,
                                   "kv_unified": kv_unified, "gpu_util": gpu_util,
                                   "hybrid_kv": hybrid_kv, "ollama_version": ollama_version,
                                   "vllm_version": vllm_version,
                                   "language_model_only": language_model_only})
    traits = engine_for(engine)
    spec: dict[str, Any] = {"preset": engine}
    spec.update(context)
    optional = {"flash_attn": flash_attn, "gpu_layers": gpu_layers,
                "gpu_memory_utilization": gpu_util, "ollama_version": ollama_version,
                "version": vllm_version, "language_model_only": language_model_only,
                "disable_hybrid_kv_cache_manager": None if hybrid_kv is None else not hybrid_kv}
    spec.update({k: v for k, v in optional.items() if v is not None})
    if parallel is not None:  # NOTE: vllm/sglang: --max-num-seqs as plan's flags set it
        spec["parallel" if traits.slot_family else "max_num_seqs"] = parallel
    if kv_unified is not None:  # NOTE: unset, the preset's allocator, as in a scenario
        spec["allocator"] = "unified" if kv_unified else "slots"
    preset = resolve_engine(engine)
    fa = flash_attn if flash_attn is not None else getattr(preset, "flash_attn", True)
    k = kv_k or preset.cache_type_k
    v = kv_v or preset.cache_type_v
    if traits.quant_v_needs_flash_attn and not fa and v not in QUANT_OK_WITHOUT_FA:
        raise InputError("--kv-v", v, "a quantized V cache needs flash attention on llama.cpp "
                         "(the server refuses: 'V cache quantization requires flash_attn'); "
                         "add --flash-attn or use an f16 V cache")
    if traits.one_cache_type_flag and k != v:
        raise InputError("--kv-v", v, f"the same as --kv-k ({k}): {engine} has one "
                         f"{traits.one_cache_type_flag} for K and V (use --kv)")
    # NOTE: Ollama's flash attention (and so whether it honours a quantized cache)
    # depends on its release and the model: engine_for_gpu decides, the budget notes it
    spec["cache_type_k"], spec["cache_type_v"] = k, v
    return spec


def _check_kv_types(engine: str, *flag_types: tuple[str, str | None]) -> None:
    """Name the flag the user typed when the engine has no such cache type."""
    from kvsim.engines.resolve import engine_names, resolve_engine
    if engine not in engine_names():
        raise unknown_name("--engine", engine, engine_names())
    supported = resolve_engine(engine).supported_cache_types
    for flag, t in flag_types:
        if t is not None and t not in supported:
            raise InputError(flag, t, f"not supported by {engine}; allowed: "
                             + ", ".join(supported))


def _split_words(b: Any) -> str:
    """`` (tensor parallel 2)``-style words for a several-GPU layout; "" for one GPU."""
    if not b.devices:
        return ""
    words = {"tensor": f"tensor parallel {b.tensor_parallel}",
             "pipeline": f"pipeline parallel {b.pipeline_parallel}",
             "tensor+pipeline": f"tensor {b.tensor_parallel} x pipeline {b.pipeline_parallel}"}
    return f" ({words.get(b.split, f'split mode {b.split}')})"


def _fit_host(gpu: Any, host_name: str | None) -> tuple[Any, list[str]]:
    """The host whose RAM is checked, and a note when it was not named: ``--host`` as
    named (refused when its memory kind contradicts the GPU's); unset, the GPU's own
    memory on a unified-memory machine, else none (not checked)."""
    if host_name is not None:
        host = load_host(host_name)
        check_host_matches(gpu, host, "--host")
        return host, []
    if not gpu.unified_memory:
        return None, []
    host = unified_host(gpu)
    note = (f"host: {host.name}, the GPU's own {format_bytes(host.memory_bytes)} of unified "
            "memory (no separate host RAM; --host unset)")
    if gpu.vendor.lower() == "apple" and has_profile("gpus", gpu.name):
        # NOTE: every Apple chip is sold with several memories; the profile has the largest
        note += (f"; the profile's memory is the largest configuration sold, a smaller one "
                 f"is --gpu {gpu.name}-<N>gb")
    return host, [note]


def _check_reserves(gpu: Any, reserves: dict[str, int], typed: str) -> None:
    """The scenario's own rule (the display plus the driver reserve below the GPU's
    memory), named by fit's flags."""
    from kvsim.scenario import check_reserves

    check_reserves(gpu, reserves["driver_reserve_bytes"], reserves["display_reserve_bytes"],
                   ("--driver-reserve", "--display-reserve"), display_value=typed)


@click.command()
@click.option("--gpu", required=True, help=GPU_HELP)
@click.option("--model", "model_name", required=True,
              help="model profile slug (llama-3.1-8b), a Hugging Face repo id or Ollama tag "
              "naming a catalogue model (meta-llama/Llama-3.1-8B-Instruct, llama3.1:8b), or "
              "path to a model YAML")
@click.option("--weights", default="q4_k_m", show_default=True,
              help="weight format: " + ", ".join(WEIGHT_FORMATS))
@click.option("--engine", default="llama.cpp", show_default=True,
              help="llama.cpp, ollama, vllm or sglang")
@click.option("--context", default=None,
              help="context tokens one session may hold, on every engine (as in kvsim "
              "plan and a scenario's engine.context_tokens); kvsim derives the engine's flag: llama.cpp -c = context x slots "
              "(--parallel, else the preset's 4), ollama num_ctx, vllm/sglang "
              "max_model_len; '32k' = '32Ki' = 32768; unset, the engine's own default: "
              "the model's maximum for vllm/sglang, llama.cpp's training context shrunk "
              "by --fit, ollama its release's num_ctx (0.33.0: 4096 below 23 GiB of VRAM, "
              "32768 below 47 GiB, else 262144; at most the model's). Range: at most the "
              "model's maximum")
@click.option("--ctx-size", "ctx_size", default=None,
              help="llama.cpp: -c itself, all slots' cells together (a scenario's "
              "engine.ctx_size; instead of --context: each session holds -c / slots)")
@click.option("--parallel", default=None,
              help="sessions served at once, as in kvsim plan: llama.cpp --parallel "
              "slots (in the preset's unified pool unless --no-kv-unified, as in a "
              "scenario), ollama OLLAMA_NUM_PARALLEL slots, vllm/sglang --max-num-seqs / "
              "--max-running-requests whose requests the KV pool must hold at full "
              "length (vLLM's 'Maximum concurrency' >= parallel; fit says when it "
              "does not); unset on vllm/sglang, their default --max-num-seqs. The "
              "largest parallel fit prints keeps each session's context (llama.cpp "
              "-c / parallel, -c scaled with it as in plan). Range: 1-256 on llama.cpp / "
              "ollama (llama.cpp's LLAMA_MAX_SEQ), 1-65536 on vllm / sglang")
@click.option("--kv", default=None, help="KV cache type for K and V (f16, q8_0, q4_0, fp8...)")
@click.option("--kv-k", default=None, help="K cache type (-ctk)")
@click.option("--kv-v", default=None, help="V cache type (-ctv)")
@click.option("--kv-unified/--no-kv-unified", default=None,
              help="llama.cpp: one shared pool of -c cells (-kvu) or per-slot streams (-c "
              "split evenly). Default: the preset's unified pool, with or without "
              "--parallel, as a scenario's engine.parallel keeps it (llama-server itself "
              "gives per-slot streams to an explicit -np without -kvu: pass "
              "--no-kv-unified for that)")
@click.option("--flash-attn/--no-flash-attn", default=None,
              help="llama.cpp / ollama flash attention (default: the engine preset's)")
@click.option("--gpu-layers", default=None,
              help="llama.cpp -ngl / ollama num_gpu, 0-2147483647 (more than the model's "
              "layers = all; default: auto)")
@click.option("--gpu-util", type=float, default=None,
              help="vllm gpu_memory_utilization / sglang mem_fraction_static")
@click.option("--hybrid-kv/--no-hybrid-kv", default=None,
              help="vllm: the hybrid KV cache manager for sliding-window models (on by "
              "default; --no-hybrid-kv = --disable-hybrid-kv-cache-manager, every layer "
              "at full length)")
@click.option("--ollama-version", default=None,
              help="ollama: the release whose defaults apply (num_ctx by VRAM, flash "
              "attention per model, who places the layers); default the newest known; a newer one "
              "is refused")
@click.option("--vllm-version", default=None,
              help="vllm: the release whose start-up arithmetic applies (V0 before 0.8.0: "
              "a whole max_model_len profiled unless above 32768; from 0.21.0 CUDA graphs "
              "inside the share and gpu_memory_utilization 0.92); default the newest known; a "
              "newer one is refused")
@click.option("--language-model-only", is_flag=True, default=None,
              help="vllm: --language-model-only, every image limit 0: a vision-language "
              "checkpoint's image encoder is neither loaded nor run in the profiling pass")
@click.option("--display-reserve", default="0", show_default=True,
              help="VRAM used by the desktop / other processes, e.g. '1 GiB'")
@click.option("--driver-reserve", default="400 MiB", show_default=True,
              help="CUDA context and driver reserve")
@click.option("--host", "host_name", default=None,
              help="host profile (kvsim profiles list hosts) whose RAM must hold the KV "
              "left on the CPU; unset, the GPU's own memory on a unified-memory GPU, "
              "else not checked")
@box_options
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def fit(gpu: str, model_name: str, weights: str, engine: str, context: str | None,
        ctx_size: str | None, parallel: str | None, kv: str | None, kv_k: str | None, kv_v: str | None,
        kv_unified: bool | None, flash_attn: bool | None, gpu_layers: str | None,
        gpu_util: float | None, hybrid_kv: bool | None, ollama_version: str | None,
        vllm_version: str | None, language_model_only: bool | None, display_reserve: str,
        driver_reserve: str, host_name: str | None, as_json: bool, **split: Any) -> None:
    """Does this model, context and parallelism fit this card on this engine?"""
    from kvsim.engines.budget import check_host_memory, memory_budget
    from kvsim.engines.resolve import engine_for_gpu
    from kvsim.plan.parallel import parallel_words
    ctx, size, par, ngl = _counts(context, ctx_size, parallel, gpu_layers, gpu_util)
    reserves = {"driver_reserve_bytes": parse_bytes(driver_reserve, "--driver-reserve"),
                "display_reserve_bytes": parse_bytes(display_reserve, "--display-reserve")}
    gpus = load_box(gpu)
    g = gpus[0]
    for card in gpus:
        _check_reserves(card, reserves, display_reserve)
    host, host_notes = _fit_host(g, host_name)
    m = load_model(model_slug(model_name, "--model"))
    check_weights_for(m, weights, "--weights")
    _check_kv_types(engine, ("--kv-k" if kv_k else "--kv", kv_k or kv),
                    ("--kv-v" if kv_v else "--kv", kv_v or kv))
    spec = _engine_spec(engine, _engine_context(engine, ctx, size), par, kv_k or kv,
                        kv_v or kv, kv_unified, flash_attn, ngl, gpu_util, hybrid_kv,
                        ollama_version, vllm_version, language_model_only)
    knobs = box_knobs(split, len(gpus))
    _refuse_foreign_flags(engine, {k: True for k in knobs})
    spec.update(knobs)
    with _as_flags():
        eng = engine_for_gpu(spec, g, m, weights=weights, more_gpus=tuple(gpus[1:]))
        engine_for(eng.preset).check_gpus(eng, len(gpus))
    _check_session_context(ctx, size, eng, m)
    if len(gpus) > 1:
        reserves["more_gpus"] = gpus[1:]  # NOTE: every budget and search lays out the box
    with _as_flags():
        b = memory_budget(g, m, weights, eng, parallel=par, **reserves)
    notes = list(host_notes)
    traits = engine_for(eng.preset)
    if ctx is not None and traits.context_above_model == "clamp" and ctx > eng.context_tokens:
        notes.append(f"Ollama clamps num_ctx {ctx:,} to {m.name}'s training length "
                     f"{eng.context_tokens:,} (docs/reference/engines.md §4.1)")
    if host is not None:
        typed = ("--ctx-size", size) if size is not None else ("--context", ctx)
        check_host_memory(b, host, typed[1] or eng.context_tokens, typed[0])
    z = _sizes(g, m, weights, eng, b, par, reserves)
    verdict = _verdict(b)
    if as_json:
        click.echo(_as_json(b, z, verdict, notes))
        return
    context = _context_words(b, eng, traits, ctx is not None or size is not None)
    title = (f"{m.display_name} ({b.weights_format}) on {gpu_set_display(gpus)} — "
             f"{eng.preset}{_split_words(b)}, "
             f"{context}, {parallel_words(b, par, z.max_num_seqs)}, "
             f"KV {b.cache_type_k}/{b.cache_type_v}")
    _print_table(b, title, z, verdict, notes)
