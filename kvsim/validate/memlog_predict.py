"""kvsim's load-time memory layout beside what an engine printed at start-up.

:func:`memory_rows` builds the engine config the row ran as ``kvsim fit`` builds one (a
preset with the row's knobs, resolved on its GPU and model by
:func:`kvsim.engines.resolve.engine_for_gpu`), asks
:func:`kvsim.engines.budget.memory_budget` for the layout (the box's other GPUs as
``more_gpus``) and returns one row per printed figure (the metrics of
:mod:`kvsim.validate.memlogs`) and one for the start-up outcome, or the reasons it cannot.

NOTE: relative error = (predicted − measured) / measured, as for speeds, where measured is
the nearest value that prints as the engine printed it (``Figure.half_unit``: "1.3 GiB"
stands for 1.25–1.35 GiB, so a prediction of 1.26 GiB is no error).  A ``startup`` row
has measured and predicted "ok" / "failed" and ``rel_err`` 0 when they agree, 1 when they
do not (a start-up the engine refused that kvsim lays out is a miss, and so is the
reverse), so its summary's median and p90 are 0 or 1 and the mean is the miss rate.
NOTE: several GPUs are not refused here: whatever kvsim refuses (an engine that does not
lay out several GPUs yet, knobs that disagree with the box) is the skipped row's reason,
in kvsim's own words, so rows start to run as the engines learn to.  vLLM and SGLang
print their byte figures for rank 0: with ``devices`` filled they are compared with the
first GPU's part; llama.cpp's breakdown names each device.
"""

from __future__ import annotations

import re
from typing import Any

from kvsim.config.catalog import load_gpu, load_model
from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.engines import engine_for, registered_engines
from kvsim.engines.budget import memory_budget
from kvsim.engines.memory import MemoryBudget
from kvsim.engines.ollama_releases import ollama_release_at
from kvsim.engines.resolve import engine_for_gpu
from kvsim.engines.vllm_releases import (
    VLLM_BEFORE_GRAPH_BUDGET,
    VLLM_BEFORE_GRAPH_BUDGET_DATE,
    VLLM_LAST_V0,
    VLLM_V1_DEFAULT_DATE,
)
from kvsim.errors import InputError
from kvsim.validate.memlog_text import Figure
from kvsim.validate.memlogs import MemoryMeasurement
from kvsim.validate.records import Skipped

_PAGED = {  # the row's knob -> kvsim's PagedEngineConfig key
    "max_model_len": "context_tokens", "context_length": "context_tokens",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "mem_fraction_static": "gpu_memory_utilization",
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "chunked_prefill_size": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
    "max_running_requests": "max_num_seqs", "max_total_tokens": "max_total_tokens",
    "block_size": "block_tokens", "page_size": "block_tokens",
    "enable_prefix_caching": "enable_prefix_caching",
    "kv_cache_memory": "kv_cache_memory_bytes", "language_model_only": "language_model_only",
}
_SLOT = {  # the same for llama.cpp / Ollama's SlotEngineConfig
    "ctx_size": "context_tokens", "context": "context_tokens", "num_ctx": "context_tokens",
    "parallel": "parallel", "cache_type_k": "cache_type_k", "cache_type_v": "cache_type_v",
    "n_gpu_layers": "gpu_layers", "num_gpu": "gpu_layers", "split_mode": "split_mode",
    "batch_size": "n_batch", "ubatch_size": "n_ubatch", "flash_attn": "flash_attn",
}
_READ_ONLY = {"fit", "enable_chunked_prefill", "kv_unified", "layers_requested", "n_ctx_seq",
              "quantization", "dtype"}
"""Knobs read into other keys (or that change nothing kvsim lays out); ``quantization`` /
``dtype`` are the weights, read from the row's weight_format column."""
_BYTES = re.compile(r"_bytes$")
_SET_BY_CONTEXT = frozenset({"kv_tokens", "kv_bytes", "kv_needed_bytes", "compute_bytes",
                             "used_bytes", "max_concurrency"})
"""Figures the context sets (the KV cache, the compute buffers that scale with it, the
memory in use): a row that says its context was not seen cannot be compared on them."""


def _slot_runner_spec(s: dict[str, Any], knobs: dict[str, object]) -> None:
    """An engine counting one slot's context (Ollama) starts its runner with ``ctx-size``
    = num_ctx × parallel, and ``n-gpu-layers`` is the placement it chose (compared as
    ``ollama_layers_offload``), not a knob; ``layers.requested`` is the user's."""
    s.pop("gpu_layers", None)
    if "ctx_size" in knobs and "num_ctx" not in knobs and "context" not in knobs:
        s["context_tokens"] = int(str(knobs["ctx_size"])) // int(str(knobs.get("parallel") or 1))
    requested = knobs.get("layers_requested")
    if isinstance(requested, int) and requested >= 0:
        s["gpu_layers"] = requested


def _pool_spec(s: dict[str, Any], knobs: dict[str, object]) -> None:
    """An engine whose ``-c`` is all slots' cells (llama-server): the row's ``ctx_size``
    / ``-c`` is ``ctx_size``; with no ``-c`` shown, ``n_ctx_seq`` is one slot's cells —
    ``context_tokens`` with per-slot streams, the whole pool (``ctx_size``) with one
    unified pool — and an explicit ``-np`` without ``-kvu`` gives per-slot streams
    (docs/reference/engines.md §3.1)."""
    if "context_tokens" in s:
        s["ctx_size"] = s.pop("context_tokens")
    unified = knobs.get("kv_unified")
    if "ctx_size" not in s and knobs.get("n_ctx_seq"):
        s["context_tokens" if unified is False else "ctx_size"] = knobs["n_ctx_seq"]
    if unified is not None:
        s["allocator"] = "unified" if unified else "slots"
    elif "parallel" in s:
        s["allocator"] = "slots"


def engine_spec(m: MemoryMeasurement) -> tuple[dict[str, Any], list[str]]:
    """The preset and knobs the row ran with (as ``kvsim fit`` passes them), and notes on
    what kvsim does not take from it."""
    traits = engine_for(m.engine)
    paged = not traits.slot_family
    table = _PAGED if paged else _SLOT
    s: dict[str, Any] = {"preset": m.engine}
    unmodelled = [k for k in m.settings if k not in table and k not in _READ_ONLY
                  and k not in ("kv_cache_dtype", "enforce_eager")]
    s.update({table[k]: v for k, v in m.settings.items() if k in table and v is not None})
    if (dtype := m.settings.get("kv_cache_dtype")) and dtype != "auto":
        s["cache_type_k"] = s["cache_type_v"] = dtype
    if paged and m.settings.get("enforce_eager"):
        s["cuda_graph_bytes"] = 0  # --enforce-eager captures no CUDA graphs
    notes = [f"settings kvsim does not model: {', '.join(unmodelled)}"] if unmodelled else []
    notes += m.stated
    if paged and "context_tokens" not in s and (told := _concurrency_tokens(m)):
        s["context_tokens"] = told
        notes.append(f"max_model_len {told:,}: the tokens per request of the printed "
                     "maximum concurrency")
    if traits.context_scope == "pool":
        _pool_spec(s, m.settings)
    if traits.context_scope == "slot":
        _slot_runner_spec(s, m.settings)
    if "ollama_version" in traits.settings:
        if v := re.search(r"\b(\d+\.\d+\.\d+)\b", m.engine_version or ""):
            s["ollama_version"] = v.group(1)
        else:
            version, why = ollama_release_at(m.date)
            s.update({"ollama_version": version} if version else {})
            notes.append(why)
    if "vllm_version" in traits.settings:
        _vllm_release(s, m.engine_version, notes, m.date)
    return s, notes


def _concurrency_tokens(m: MemoryMeasurement) -> int | None:
    """The L of a printed "Maximum concurrency for L tokens per request" (vLLM prints it
    for its max_model_len)."""
    f = next((f for f in m.figures if f.metric == "max_concurrency"), None)
    got = re.search(r"for\s*([\d,]+)\s*tokens", f.as_printed) if f else None
    return int(got.group(1).replace(",", "")) if got else None


def _vllm_release(s: dict[str, Any], text: str, notes: list[str], date: str = "") -> None:
    """The vLLM release a row names (``0.19.x`` → 0.19.0), or the last release of the
    engine generation its log format shows (``V0-era`` → :data:`VLLM_LAST_V0`) or its date
    (before :data:`VLLM_V1_DEFAULT_DATE`: V0; before :data:`VLLM_BEFORE_GRAPH_BUDGET_DATE`:
    a V1 release with CUDA graphs outside the budget); none of these, the newest
    (kvsim.engines.vllm_releases)."""
    dated = date if re.match(r"\d{4}-\d{2}", date or "") else ""
    if v := re.search(r"\b(\d+\.\d+(?:\.\d+)?)", text or ""):
        s["version"] = v.group(1)
    elif re.search(r"\bV0\b", text or "") or (dated and dated < VLLM_V1_DEFAULT_DATE):
        s["version"] = VLLM_LAST_V0
        why = "a V0 log" if re.search(r"\bV0\b", text or "") else \
            f"a log dated {date}, before vLLM 0.8.0 made V1 the default"
        notes.append(f"{why}: laid out as vLLM {VLLM_LAST_V0}, the last release whose "
                     "default engine was V0")
    elif dated and dated < VLLM_BEFORE_GRAPH_BUDGET_DATE:
        s["version"] = VLLM_BEFORE_GRAPH_BUDGET
        notes.append(f"a log dated {date}, before vLLM 0.21.0 took CUDA-graph memory into "
                     f"the budget: laid out as vLLM {VLLM_BEFORE_GRAPH_BUDGET}")
    else:
        notes.append("release not shown: kvsim follows the newest release it knows")


def _devices(m: MemoryMeasurement, gpu: GpuSpec | None) -> tuple[GpuSpec, ...] | None:
    """The GPUs the engine ran on: the box (``gpu`` × the devices the row names, when
    given), or its first tensor × pipeline ranks."""
    box = tuple(load_gpu(s) for s in m.gpus) if gpu is None else (gpu,) * max(1, m.gpu_count)
    if not box:
        return None
    ranks = 1
    for knob in ("tensor_parallel_size", "pipeline_parallel_size"):
        ranks *= int(m.settings.get(knob) or 1)
    paged = not engine_for(m.engine).slot_family
    return box[:ranks] if paged and 1 < ranks < len(box) else box


def _why_not(m: MemoryMeasurement, gpu: GpuSpec | None, model: ModelSpec | None) -> str:
    if not m.engine:
        return (f"engine {m.engine_as_printed!r}: kvsim lays out "
                f"{', '.join(registered_engines())}")
    why = [w for w, given in ((m.model_reason, model), (m.gpu_reason, gpu)) if w and given is None]
    unshown = model is None and m.model_reason == "model not shown in the log"
    if m.weights is None and not (unshown and m.weights_reason.endswith("not shown in the log")):
        why.append(m.weights_reason or "weights format not shown in the log")
    return "; ".join(why)


def _in_use_bytes(m: MemoryMeasurement, gpus: tuple[GpuSpec, ...], notes: list[str]) -> int:
    """The memory of the first GPU others held at start-up, as an Ollama row's
    ``memory.available`` shows it (kvsim.validate.memlogs NOTE): the card less what its
    estimate saw free; 0 where the row prints none (or one per GPU of a box, which kvsim
    cannot reserve beyond the first GPU)."""
    if not m.free_bytes or "ollama_version" not in engine_for(m.engine).settings:
        return 0
    if len(m.free_bytes) > 1 or len(gpus) > 1:
        notes.append("memory.available of several GPUs: not taken (kvsim reserves memory "
                     "in use by others on the first GPU only)")
        return 0
    free, usable = m.free_bytes[0], gpus[0].usable_memory_bytes
    notes.append(f"memory.available {free / 2**30:.1f} GiB: " + (
        f"the other {(usable - free) / 2**30:.2f} GiB of the card in use by others"
        if usable > free else "the whole card free"))
    return max(0, usable - free)


def layout_of(m: MemoryMeasurement, gpu: GpuSpec | None = None,
              model: ModelSpec | None = None
              ) -> tuple[MemoryBudget, tuple[GpuSpec, ...], ModelSpec, list[str]] | Skipped:
    """kvsim's layout of the row's start-up (``gpu`` / ``model`` replace its names), with
    the devices, the model and notes; or why it cannot be predicted."""
    if why := _why_not(m, gpu, model):
        return Skipped(m.id, why)
    gpus = _devices(m, gpu)
    assert gpus is not None and m.weights is not None
    mod = model if model is not None else load_model(str(m.model))
    spec, notes = engine_spec(m)
    in_use = _in_use_bytes(m, gpus, notes)
    try:
        cfg = engine_for_gpu(spec, gpus[0], mod, weights=m.weights, more_gpus=gpus[1:])
        engine_for(cfg.preset).check_gpus(cfg, len(gpus))
        b = memory_budget(gpus[0], mod, m.weights, cfg, more_gpus=gpus[1:],
                          display_reserve_bytes=in_use)
    except InputError as exc:
        return Skipped(m.id, f"kvsim cannot lay this start-up out: {exc.one_line()}")
    return b, gpus, mod, notes


def _device_part(f: Figure, b: MemoryBudget, paged: bool) -> tuple[Any, str]:
    """(the GPU's DeviceShare or None for the whole layout, why not comparable)."""
    index = int(re.sub(r"\D", "", f.device) or 0) if f.device else None
    if b.devices:
        if index is None and paged and _BYTES.search(f.metric):
            index = 0  # NOTE: module docstring (rank 0's figures)
        if index is not None and index >= len(b.devices):
            return None, f"device {f.device}: kvsim laid out {len(b.devices)} GPUs"
        return (b.devices[index] if index is not None else None), ""
    if index:
        return None, f"device {f.device}: kvsim laid out one GPU"
    return None, ""


def predicted(f: Figure, b: MemoryBudget, paged: bool) -> tuple[float | None, str]:
    """kvsim's value of figure ``f`` (None, why: it has none to compare)."""
    part, why = _device_part(f, b, paged)
    if why:
        return None, why
    est = b.estimate
    if f.metric.startswith("ollama_ps_"):
        if f.metric not in b.extra:
            return None, (f"{f.metric}: kvsim's Ollama release runs llama-server, whose "
                          "`ollama ps` figures kvsim does not describe")
        return float(b.extra[f.metric]), ""
    if f.metric.startswith("ollama_"):
        if est is None:
            return None, (f"{f.metric}: kvsim's Ollama release places layers with llama-server "
                          "--fit (no memory.required estimate)")
        value = {"ollama_required_partial_bytes": est.total_bytes,
                 "ollama_layers_offload": sum(est.split) if est.split else
                 est.layers_offload,
                 "ollama_required_full_bytes": est.full_bytes,
                 "ollama_required_kv_bytes": est.kv_bytes,
                 "ollama_graph_full_bytes": est.graph_full_bytes,
                 "ollama_graph_partial_bytes": est.graph_partial_bytes,
                 "ollama_projector_weights_bytes": est.projector_weights_bytes,
                 "ollama_projector_graph_bytes": est.projector_graph_bytes}[f.metric]
        return float(value), ""
    whole = {"kv_tokens": b.kv_pool_tokens, "kv_bytes": b.kv_reserved_bytes,
             "kv_needed_bytes": b.kv_needed_bytes, "weights_bytes": b.weights_gpu_bytes,
             "max_model_len_fit": b.extra.get("max_model_len_fit"),
             "compute_bytes": b.activation_bytes, "device_bytes": b.device_bytes,
             "used_bytes": b.total_bytes, "max_concurrency": b.max_concurrency}
    if part is not None and f.metric in ("kv_bytes", "weights_bytes", "compute_bytes",
                                         "device_bytes", "used_bytes"):
        whole = {"kv_bytes": part.kv_bytes, "weights_bytes": part.weights_bytes,
                 "compute_bytes": part.compute_bytes, "device_bytes": part.device_bytes,
                 "used_bytes": part.total_bytes}
    value = whole.get(f.metric)
    return (None, f"{f.metric}: kvsim's layout has no such figure") if value is None \
        else (float(value), "")


def _row(m: MemoryMeasurement, gpus: tuple[GpuSpec, ...], mod: ModelSpec, metric: str,
         device: str, measured: Any, pred: Any, rel: float, notes: list[str],
         **extra: Any) -> dict[str, object]:
    names = [g.name for g in gpus]
    label = names[0] if len(names) == 1 else f"{len(names)}x {names[0]}" \
        if len(set(names)) == 1 else "+".join(names)
    unit = "outcome" if metric == "startup" else "bytes" if _BYTES.search(metric) else \
        "%" if metric.endswith("_percent") else \
        "x" if metric == "max_concurrency" else \
        "layers" if metric == "ollama_layers_offload" else "tokens"
    return {"id": m.id, "kind": "memory", "backend": m.backend, "metric": metric,
            "device": device, "gpu": label, "model": mod.name, "weights": m.weights,
            "engine_version": m.engine_version, "measured": measured, "predicted": pred,
            "unit": unit, "rel_err": rel, "notes": notes, **extra}


def memory_rows(m: MemoryMeasurement, gpu: GpuSpec | None = None,
                model: ModelSpec | None = None) -> tuple[list[dict[str, object]],
                                                         list[Skipped]]:
    """One row per printed figure and the start-up outcome, and the figures (or the whole
    row) kvsim cannot compare, each with the reason.

    NOTE: a row whose GPU name fits several profiles (``m.gpu_candidates``) is compared
    only when each of them gives every figure and the outcome alike (:func:`_alike`)."""
    if gpu is None and not m.gpus and m.gpu_candidates:
        return _alike(m, model)
    return _memory_rows(m, gpu, model)


def _alike(m: MemoryMeasurement, model: ModelSpec | None
           ) -> tuple[list[dict[str, object]], list[Skipped]]:
    """The figures every candidate GPU predicts alike, from the first candidate (what tells
    the cards apart, a form factor or a link, is not in this start-up's memory arithmetic);
    a figure they predict differently is skipped, with each card's value.  Candidates that
    cannot all be laid out, or not alike, skip the row."""
    runs = {s: _memory_rows(m, load_gpu(s), model) for s in m.gpu_candidates}
    first = m.gpu_candidates[0]
    said = f" ({m.gpu_memory_said})" if m.gpu_memory_said else ""
    shapes = {tuple(_key(r) for r in rows) + tuple(k.reason for k in skipped)
              for rows, skipped in runs.values()}
    if len(shapes) > 1:
        return [], [Skipped(m.id, f"{m.gpu_reason}{said}; the cards it fits lay it out "
                                  "differently: " + "; ".join(
                                      f"{s}: {runs[s][1][0].reason if runs[s][1] else 'laid out'}"
                                      for s in m.gpu_candidates))]
    rows, skipped = runs[first]
    how = (f"GPU {m.gpu_as_printed!r}{said}: sized as {first}" if len(runs) == 1 else
           f"GPU {m.gpu_as_printed!r}{said} fits {', '.join(m.gpu_candidates)}, which lay "
           f"this figure out alike: sized as {first}")
    kept, parted = [], list(skipped)
    for i, r in enumerate(rows):
        values: dict[object, list[str]] = {}
        for s in m.gpu_candidates:
            values.setdefault(runs[s][0][i]["predicted"], []).append(s)
        if len(values) == 1:
            kept.append({**r, "notes": [*r["notes"], how]})  # type: ignore[list-item]
            continue
        each = "; ".join((f"{v:,.6g}" if isinstance(v, float) else f"{v}") +
                         f" ({', '.join(c)})" for v, c in values.items())
        parted.append(Skipped(f"{m.id}:{r['metric']}" + (f"@{r['device']}" if r["device"] else ""),
                              f"{m.gpu_reason}{said}; the cards it fits lay {r['metric']} out "
                              f"differently: {each}"))
    return kept, parted


def _key(r: dict[str, object]) -> tuple[object, object]:
    return r["metric"], r["device"]


def _beyond_print(pred: float, f: Figure) -> float:
    """How far ``pred`` lies from every value that prints as ``f`` did (0 within half
    the last printed digit: "1.3 GiB" is anything from 1.25 to 1.35 GiB)."""
    err = pred - f.value
    return 0.0 if abs(err) <= f.half_unit else err - f.half_unit * (1 if err > 0 else -1)


def _memory_rows(m: MemoryMeasurement, gpu: GpuSpec | None,
                 model: ModelSpec | None) -> tuple[list[dict[str, object]], list[Skipped]]:
    """:func:`memory_rows` for the row's own devices, or ``gpu`` in their place."""
    got = layout_of(m, gpu, model)
    if isinstance(got, Skipped):
        return [], [got]
    b, gpus, mod, notes = got
    paged = not engine_for(m.engine).slot_family
    rows: list[dict[str, object]] = []
    skipped = [Skipped(f"{m.id}:printed_figures", why) for why in m.unread]
    unshown = m.context_unshown
    for f in m.figures:
        key = f"{m.id}:{f.metric}" + (f"@{f.device}" if f.device else "")
        if unshown and f.metric in _SET_BY_CONTEXT:
            skipped.append(Skipped(key, f"{f.metric}: the row does not show its context, "
                                        "which sets the KV cache and compute buffers"))
            continue
        pred, why = predicted(f, b, paged)
        if pred is None or not f.value:
            skipped.append(Skipped(key, why or f"{f.metric}: printed 0, no relative error"))
            continue
        rows.append(_row(m, gpus, mod, f.metric, f.device, f.value, pred,
                         _beyond_print(pred, f) / f.value, notes, as_printed=f.as_printed))
    if m.startup is not None:
        said = "ok" if b.fits else "failed"
        rows.append(_row(m, gpus, mod, "startup", "", m.startup, said,
                         0.0 if said == m.startup else 1.0, notes, failure=b.failure))
    if not rows and not skipped:
        skipped.append(Skipped(m.id, "no figure kvsim compares was printed "
                               "and the start-up outcome is not stated"))
    return rows, skipped
