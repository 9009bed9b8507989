"""``kvsim fit``'s output: the sizes it searches, its verdict, the table and the JSON.

Split from :mod:`kvsim.cli.fit` (the command and its flags), which calls these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvsim.cli._fit_box import device_rows
from kvsim.config.units import format_bytes


@dataclass(frozen=True)
class Sizes:
    """What fit prints besides the layout: the largest context / parallel at the line,
    the memory fractions they hold at (vLLM/SGLang) and the allocator line."""

    max_ctx: int
    max_par: int
    util85: float | None
    util_par: float | None
    max_num_seqs: int | None
    allocator: str
    session_tokens: int  # the context each session keeps in the largest-parallel search
    parallel: int | None  # as given; None: unset (vLLM/SGLang: the engine's max_num_seqs)
    model_max_tokens: int = 0  # the model's maximum context (a session's cap)


def sizes(g: Any, m: Any, weights: str, eng: Any, b: Any, par: int | None,
           reserves: dict[str, int]) -> Sizes:
    from kvsim.engines.budget import max_context_at, share_within
    from kvsim.engines.config import PagedEngineConfig
    from kvsim.plan import parallel as pp

    max_ctx = max_context_at(g, m, weights, eng, parallel=par, **reserves)
    if not isinstance(eng, PagedEngineConfig):
        # NOTE: each session keeps its context, as plan's -c = context x parallel does
        per = pp.session_tokens(b)
        max_par = pp.slot_max_parallel(g, m, weights, eng, per, **reserves)
        return Sizes(max_ctx, max_par, None, None, None, pp.describe_allocator(b), per, par,
                     m.max_context_tokens)
    # NOTE: each parallel with --max-num-seqs set to it, as plan's flags do
    max_par, util_par = pp.paged_max_parallel(g, m, weights, eng, **reserves)
    # NOTE: nothing fits at the line: no fraction to print
    util85 = share_within(g, m, weights, eng, **reserves) if max_ctx or max_par else None
    return Sizes(max_ctx, max_par, util85, util_par, eng.max_num_seqs,
                  pp.describe_allocator(b, eng.max_num_seqs), b.slot_tokens, par,
                  m.max_context_tokens)


def verdict(b: Any) -> str:
    from kvsim.plan.parallel import short_pool_note

    if not b.fits:
        return f"DOES NOT FIT — {b.failure}"
    if not b.all_layers_on_gpu:
        return (f"RUNS WITH CPU OFFLOAD — {b.gpu_layers}/{b.num_layers} layers on the GPU, "
                f"{format_bytes(b.weights_cpu_bytes)} of weights in host RAM (slow decode)")
    pct = f"{b.device_fraction:.1%}"
    short = short_pool_note(b, b.parallel)
    if short is not None:
        return f"LOADS, BUT NOT PARALLEL {b.parallel} AT FULL LENGTH — {short}; peak {pct}"
    if b.device_fraction <= 0.85:
        return f"FITS — peak {pct} of device memory, under the 85% line"
    return f"FITS, ABOVE THE 85% LINE — peak {pct} of device memory"


_RATE_KEYS = ("kv_windowed_bytes_per_token", "kv_window_tokens",
              "kv_windowed_cap_bytes_per_seq", "kv_windowed_at_full_length",
              "kv_recurrent_bytes_per_seq")


def _kv_rates(b: Any) -> dict[str, Any]:
    """The budget's per-token and per-sequence KV rates besides ``kv_bytes_per_token``
    (the cache that grows with context; kvsim.model.geometry.KvGeometry.rates)."""
    return {k: b.extra.get(k) for k in _RATE_KEYS}


def _kv_rate_words(b: Any) -> str:
    """``kv_bytes_per_token`` in words, with the windowed and recurrent parts apart."""
    r = _kv_rates(b)
    words = f"{b.kv_bytes_per_token} (grows with context"
    if r["kv_windowed_at_full_length"]:
        words += "; every layer, the sliding-window ones held at full length)"
    elif r["kv_windowed_bytes_per_token"]:
        window = "/".join(str(w) for w in r["kv_window_tokens"])
        words += (f"; full-attention layers) + {r['kv_windowed_bytes_per_token']} for the "
                  f"newest {window} tokens only (sliding-window layers, at most "
                  f"{r['kv_windowed_cap_bytes_per_seq']} per sequence)")
    else:
        words += ")"
    if r["kv_recurrent_bytes_per_seq"]:
        words += f" + {r['kv_recurrent_bytes_per_seq']} recurrent state per sequence"
    return words


def _ollama_ps(b: Any) -> dict[str, Any] | None:
    """What ``ollama ps`` shows for the layout (kvsim.engines._ollama_ps), where known."""
    if "ollama_ps_size_bytes" not in b.extra:
        return None
    return {k: b.extra[f"ollama_ps_{k}"] for k in ("size_bytes", "vram_bytes", "gpu_percent")}


def as_json(b: Any, z: Sizes, verdict: str, notes: list[str]) -> str:
    from kvsim.plan.parallel import full_length_held, parallel_words

    # NOTE: vLLM/SGLang without --parallel admit max_num_seqs: no parallel of 1
    unset = b.allocator == "paged" and z.parallel is None
    words = parallel_words(b, z.parallel, z.max_num_seqs)
    doc = {
        "engine": b.engine, "allocator": b.allocator, "allocator_note": z.allocator,
        "device_bytes": b.device_bytes, "driver_reserve_bytes": b.driver_reserve_bytes,
        "display_reserve_bytes": b.display_reserve_bytes,
        "weights_format": b.weights_format, "weights_total_bytes": b.weights_total_bytes,
        "weights_gpu_bytes": b.weights_gpu_bytes, "weights_cpu_bytes": b.weights_cpu_bytes,
        "gpu_layers": b.gpu_layers, "num_layers": b.num_layers,
        "activation_bytes": b.activation_bytes, "engine_overhead_bytes": b.engine_overhead_bytes,
        "cache_type_k": b.cache_type_k, "cache_type_v": b.cache_type_v,
        "kv_bytes_per_token": b.kv_bytes_per_token, **_kv_rates(b),
        "kv_reserved_bytes": b.kv_reserved_bytes,
        "kv_cpu_bytes": b.kv_cpu_bytes, "kv_needed_bytes": b.kv_needed_bytes,
        "kv_pool_tokens": b.kv_pool_tokens, "slot_tokens": b.slot_tokens,
        "parallel": None if unset else b.parallel, "parallel_note": words,
        "max_num_seqs": z.max_num_seqs, "session_tokens": z.session_tokens,
        "full_length_held": full_length_held(b), "block_tokens": b.block_tokens,
        "num_gpu_blocks": b.num_gpu_blocks, "max_concurrency": b.max_concurrency,
        "total_bytes": b.total_bytes, "device_fraction": round(b.device_fraction, 6),
        "headroom_to_85_bytes": b.headroom_to_85_bytes, "fits": b.fits, "failure": b.failure,
        "verdict": verdict, "max_context_at_85": z.max_ctx, "max_parallel_at_85": z.max_par,
        "gpu_memory_utilization_at_85": z.util85,
        "gpu_memory_utilization_at_max_parallel": z.util_par,
        "kv_groups": [list(g) for g in b.kv_groups],
        "blocks_per_request": b.blocks_per_request,
        "log_lines": list(b.log_lines), "notes": notes + list(b.notes),
        "estimate": None if b.estimate is None else dict(b.estimate.__dict__),
        "ollama_ps": _ollama_ps(b),
        "split": b.split, "tensor_parallel": b.tensor_parallel,
        "pipeline_parallel": b.pipeline_parallel, "devices": device_rows(b),
    }
    return json.dumps(doc, indent=2)


def print_table(b: Any, title: str, z: Sizes, verdict: str, notes: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console(width=max(100, Console().width))
    table = Table(title=title, title_justify="left")
    table.add_column("row")
    table.add_column("bytes", justify="right")
    table.add_column("size", justify="right")
    for label, n in b.rows():
        table.add_row(label, str(n), format_bytes(n))
    table.add_row("total on device", str(b.total_bytes), format_bytes(b.total_bytes),
                  style="bold")
    table.add_row("device memory", str(b.device_bytes), format_bytes(b.device_bytes))
    table.add_row("fraction of device", "", f"{b.device_fraction:.1%}")
    table.add_row("headroom to the 85% line", str(b.headroom_to_85_bytes),
                  format_bytes(b.headroom_to_85_bytes))
    if b.weights_cpu_bytes or b.kv_cpu_bytes:
        table.add_row("weights on CPU (host RAM)", str(b.weights_cpu_bytes),
                      format_bytes(b.weights_cpu_bytes))
        table.add_row("KV on CPU (host RAM)", str(b.kv_cpu_bytes), format_bytes(b.kv_cpu_bytes))
    console.print(table)
    if b.devices:
        console.print(_device_table(b))
    console.print(f"KV bytes per token: {_kv_rate_words(b)}  ·  pool {b.kv_pool_tokens} "
                  f"tokens  ·  per sequence {b.slot_tokens} tokens", highlight=False)
    console.print(z.allocator, highlight=False)
    if b.estimate is not None:
        e = b.estimate
        left = ("; the output layer" + (" and vision tower" if e.projector_weights_bytes
                                         else "") + " in CPU RAM")  \
            if e.gpu_layers == b.num_layers and e.full_bytes > e.total_bytes else ""
        console.print(f"Ollama's own estimate: {format_bytes(e.total_bytes)} (KV "
                      f"{format_bytes(e.kv_bytes)}, graph {format_bytes(e.graph_bytes)}, "
                      f"{e.gpu_layers}/{b.num_layers} layers{left}) vs true "
                      f"{format_bytes(b.total_bytes)}", highlight=False)
    for line in b.log_lines:
        console.print(f"  [dim]{line}[/dim]", highlight=False)
    for n in notes + list(b.notes):
        console.print(f"  note: {n}", highlight=False)
    console.print(f"[bold]{verdict}[/bold]", highlight=False)
    _print_sizes(console, b, z)


def _device_table(b: Any) -> Any:
    """Each GPU's part of a several-GPU layout (the planning line holds per GPU)."""
    from rich.table import Table
    table = Table(title="per GPU (the fullest one binds the 85% line)", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("GPU", no_wrap=True)
    for col in ("layers", "weights", "KV", "compute", "overhead", "total", "of device"):
        table.add_column(col, justify="right")
    mark = not all(d.holds_output for d in b.devices)   # NOTE: tensor ranks all hold it
    for d in b.devices:
        share = "" if d.weight_fraction == 1 else f" x {d.weight_fraction:.2g}"
        table.add_row(str(d.index), d.gpu + (" +head" if mark and d.holds_output else ""),
                      f"{d.layers}{share}", format_bytes(d.weights_bytes),
                      format_bytes(d.kv_bytes), format_bytes(d.compute_bytes),
                      format_bytes(d.overhead_bytes), format_bytes(d.total_bytes),
                      f"{d.fraction:.1%}")
    return table


def _print_sizes(console: Any, b: Any, z: Sizes) -> None:
    if z.util85 is not None:
        console.print(f"at 85% the memory fraction is {z.util85} (vLLM "
                      f"--gpu-memory-utilization / SGLang --mem-fraction-static): the sizes "
                      f"below hold with it", highlight=False)
    from kvsim.plan import parallel as pp

    at_ctx = f"parallel {b.parallel}"
    if b.allocator == "paged" and z.parallel is None:
        at_ctx = f"1 request at full length, {pp.seqs_flag(b.engine)} {z.max_num_seqs}"
    suffix = f" (the search stops at {z.max_par})" if z.max_par >= 1024 else ""
    if b.allocator == "paged" and z.max_par:
        other = f", fraction {z.util_par}" if z.util_par != z.util85 else ""
        suffix = f" ({pp.seqs_flag(b.engine)} {z.max_par}{other})"
    largest = pp.largest_context_words(b, z.max_ctx, z.model_max_tokens) if z.max_ctx else "0"
    console.print(f"largest context at 85% ({at_ctx}): {largest}  ·  largest parallel "
                  f"at 85% ({pp.session_words(b, z.session_tokens)}): {z.max_par}{suffix}",
                  highlight=False)


def context_words(b: Any, eng: Any, traits: Any, typed: bool) -> str:
    """The title's context: the engine's per-session context, the pool ``--fit`` leaves
    when the context was left to it, or, on llama.cpp with a context ``typed``, ``-c``
    over the slots."""
    if traits.context_scope == "pool" and typed:
        exact = eng.context_tokens * eng.parallel == eng.ctx_size
        return (f"context {eng.context_tokens} per session (-c {eng.ctx_size} "
                + (f"= {eng.context_tokens} x" if exact else "over")
                + f" {eng.parallel} slots)")
    if traits.fit_shrinks_context and eng.fit_context:
        return f"context {b.kv_pool_tokens} ({traits.context_knob} unset: --fit)"
    return f"context {eng.context_tokens}"
