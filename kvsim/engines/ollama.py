"""Ollama: llama.cpp's slots under its own runners and release defaults (docs/reference/engines.md
§4): its launch environment, its release rules (kvsim.engines.ollama_releases) and its
load-time memory layout with the release's layer placement (§4.2-§4.4)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import format_bytes, parse_bytes
from kvsim.engines._common import EngineTraits
from kvsim.engines._gpu_checks import refuse_split_knobs
from kvsim.engines._slot_layout import check_quant_k, mib, pad_to, slot_budget, slot_layout
from kvsim.engines.base import BudgetOf
from kvsim.engines.llama_cpp import LLAMA_MAX_SEQ, llama_cpp_budget
from kvsim.engines.memory import MemoryBudget, OllamaEstimate
from kvsim.engines.ollama_releases import (
    OLLAMA_LATEST,
    OLLAMA_NUM_CTX_TIERS,
    ollama_defaults,
    ollama_llama_server,
    ollama_memory_mode,
    parse_ollama_version,
)
from kvsim.model.geometry import kv_geometry
from kvsim.model.weights import WeightSplit, model_weights

if TYPE_CHECKING:
    from kvsim.engines.config import SlotEngineConfig

OLLAMA_EST_BYTES = {"f16": 2.0, "q8_0": 1.0, "q4_0": 0.5}   # §4.2 (real: 2 / 1.0625 / 0.5625)


@dataclass(frozen=True)
class Ollama(EngineTraits):
    """``ollama serve``, configured through its environment (§4)."""

    def check_gpus(self, cfg: Any, n_gpus: int) -> None:
        refuse_split_knobs(cfg, self.name)

    def launch_command(self, s: Any) -> str:
        """``OLLAMA_CONTEXT_LENGTH`` is per slot (the runner gets ``num_ctx × parallel``,
        §4); ``OLLAMA_KV_CACHE_TYPE`` only applies with flash attention."""
        e = s.engine
        env = [f"OLLAMA_NUM_PARALLEL={e.parallel}", f"OLLAMA_CONTEXT_LENGTH={e.context_tokens}",
               f"OLLAMA_KV_CACHE_TYPE={e.cache_type_k}",
               f"OLLAMA_FLASH_ATTENTION={1 if e.flash_attn else 0}"]
        return " ".join(env) + " ollama serve"

    def read_startup_log(self, text: str, name: str = "log") -> dict[str, object]:
        return read_ollama_log(text, name)

    def launch_notes(self, s: Any) -> list[str]:
        return []

    def check_release(self, version: str | None) -> None:
        parse_ollama_version(version, "ollama_version")

    def release_defaults(self, merged: dict[str, Any], given: set[str],
                         gpu: GpuSpec | None, model: ModelSpec | None, weights: str | None,
                         budget_of: BudgetOf) -> dict[str, Any]:
        """The release ``ollama_version`` (default :data:`OLLAMA_LATEST`) and its defaults
        for the knobs not ``given`` (:func:`~kvsim.engines.ollama_releases.ollama_defaults`)."""
        version = merged.get("ollama_version")
        if version is None:  # NOTE: a user's preset file may lack it
            version = OLLAMA_LATEST
        merged = {**merged, "ollama_version": version}
        return {"ollama_version": version,
                **ollama_defaults(merged, given, gpu, model, weights, budget_of)}

    def memory_budget(self, gpu: GpuSpec, model: ModelSpec, weights: str, cfg: Any,
                      driver: int, display: int, parallel: int,
                      more_gpus: tuple[GpuSpec, ...] = ()) -> MemoryBudget:
        return ollama_budget(gpu, model, weights, cfg, driver, display)


_TIERS = ", ".join(f"{n} from {b // 2**30} GiB" for b, n in OLLAMA_NUM_CTX_TIERS)

# NOTE: Ollama truncates a prompt longer than num_ctx instead of refusing it (§4.5) and
# clamps num_ctx to the training length (§4.1); its unset num_ctx depends on the card's
# memory (kvsim.engines.ollama_releases, its newest release); it ignores a quantized cache
# type without flash attention (§4.1) and cannot shift an MLA model's context (§4.5)
ENGINE = Ollama(name="ollama", slot_family=True, max_parallel=LLAMA_MAX_SEQ,
                max_parallel_why="its runner is llama.cpp, whose LLAMA_MAX_SEQ refuses more "
                "sequences ('n_seq_max must be <= 256')", truncates_prompt=True, op_offload=True,
                context_scope="slot", context_knob="num_ctx",
                settings=frozenset({"flash_attn", "gpu_layers", "ollama_version"}),
                one_cache_type_flag="OLLAMA_KV_CACHE_TYPE", one_cache_type_section="§4.1",
                context_above_model="clamp", unset_context_words=f"4096 ({_TIERS})",
                ignores_quant_cache_without_flash_attn=True, shifts_mla_context=False)


def _ollama_estimate(model: ModelSpec, engine: SlotEngineConfig, ws: WeightSplit,
                     kv_type: str, free_bytes: int,
                     measured: tuple[int, int] | None = None) -> OllamaEstimate:
    """§4.2 era-A estimator: under-counted KV, graph fallback, layers from the back;
    eras B/C (§4.3) place the same way with the ``measured`` (KV, graph) bytes."""
    per_elem = OLLAMA_EST_BYTES.get(kv_type, 2.0)
    ctx, kv_total = engine.context_tokens * engine.parallel, 0.0
    for g in model.layer_groups:
        if g.kind == "recurrent":
            kv_total += g.state_elements * 4 * g.layers * engine.parallel
        elif g.kind == "mla":
            kv_total += ctx * g.latent_dim * per_elem * g.layers
        else:
            kv_total += ctx * (g.head_dim_k + g.head_dim_v) * g.n_kv_heads * per_elem * g.layers
    ratio = model.num_attention_heads / model.num_kv_heads if model.num_kv_heads else 1.0
    graph = int(ratio * kv_total / 6)
    kv_total, graph = measured or (kv_total, graph)
    reserve = engine.gpu_overhead_bytes + engine.minimum_reserve_bytes + graph
    L = model.num_layers
    per_layer = ws.per_layer_bytes + kv_total / L
    head = ws.head_bytes
    if engine.gpu_layers is not None:
        n = min(engine.gpu_layers, L)
    elif reserve + L * per_layer + head <= free_bytes:
        n = L
    else:
        n = max(0, min(L - 1, int((free_bytes - reserve) // per_layer)))
    total = reserve + int(n * per_layer) + (head if n == L else 0)
    return OllamaEstimate(kv_bytes=int(kv_total * n / L), graph_bytes=graph,
                          reserve_bytes=reserve, total_bytes=total, gpu_layers=n)


def ollama_budget(gpu: GpuSpec, model: ModelSpec, weights: str, engine: SlotEngineConfig,
                  driver: int, display: int) -> MemoryBudget:
    """Ollama (§4.1-§4.4): the true layout is llama.cpp's with ``num_ctx × parallel`` cells
    in ``parallel`` slots; its release places the layers (``ollama_memory_mode``)."""
    notes, mode = [], ollama_memory_mode(engine, model)
    k, v = engine.cache_type_k, engine.cache_type_v
    if engine.ignored_cache_type:  # NOTE: the engine config already made the cache f16
        notes.append(f"OLLAMA_KV_CACHE_TYPE={engine.ignored_cache_type} ignored: flash "
                     "attention is off, so the cache is f16 (docs/reference/engines.md §4.1)")
    if mode == "llama-server":  # era D (§4.4): llama-server's --fit places the layers
        b = llama_cpp_budget(gpu, model, weights, ollama_llama_server(engine), driver, display)
        return replace(b, notes=tuple(notes) + b.notes)
    geo = kv_geometry(model, k, v, state_dtype="f32")
    check_quant_k(model, geo)
    ws = model_weights(model, weights)
    num_ctx = pad_to(engine.context_tokens, engine.context_pad_tokens)
    n_ctx, free, back = num_ctx * engine.parallel, gpu.usable_memory_bytes - display, 0
    lay = slot_layout(gpu, model, ws, geo, engine, n_ctx, num_ctx, False, driver, display)
    exact = (lay["kv_total"], lay["compute"]) if mode == "measured" else None
    est = _ollama_estimate(model, engine, ws, v, free, exact)
    while exact and back < 10 and lay["gpu_total"](est.gpu_layers) > gpu.usable_memory_bytes:
        back += 1  # §4.3: a failed allocation backs off: 10 %, 20 %, … of free VRAM unused
        est = _ollama_estimate(model, engine, ws, v, free * (10 - back) // 10, exact)
    L = model.num_layers
    offload = est.gpu_layers + (est.gpu_layers == L)      # + output layer on full offload
    logs = [(f"offload to cuda layers.model={L + 1} layers.offload={offload} "
             f"memory.required.full={format_bytes(est.total_bytes)} "
             f"memory.required.kv={format_bytes(est.kv_bytes)} "
             f"memory.graph.full={format_bytes(est.graph_bytes)}"),
            f"llama_kv_cache: CUDA0 KV buffer size = {mib(lay['kv_total'] * est.gpu_layers // L)}"]
    if est.gpu_layers < L:
        notes.append(f"Ollama spills {L - est.gpu_layers}/{L} layers to CPU RAM "
                     "(partial offload: works, much slower)")
    if est.kv_bytes < lay["kv_total"] * est.gpu_layers // L:
        notes.append("Ollama's estimate under-counts this KV cache type (q8_0 as 1, q4_0 as "
                     "0.5 bytes/element; real 1.0625 / 0.5625)")
    failure = None
    if lay["gpu_total"](est.gpu_layers) > gpu.usable_memory_bytes:
        failure = ("cudaMalloc failed: out of memory — Ollama estimated "
                   f"{format_bytes(est.total_bytes)} but the runner needs "
                   f"{format_bytes(lay['gpu_total'](est.gpu_layers))}")
    return slot_budget(engine, gpu, model, ws, geo, lay, est.gpu_layers, n_ctx, num_ctx,
                        driver, display, logs, notes, estimate=est, failure=failure)


def read_ollama_log(text: str, name: str = "log") -> dict[str, object]:
    """Ollama's own ``memory.required`` line (docs/reference/engines.md §4.2); the llama.cpp
    lines its runner prints are llama.cpp's reader's."""
    out: dict[str, object] = {}
    line = next((ln for ln in text.splitlines() if "memory.required" in ln), None)
    if line is None:
        return out
    memory: dict[str, int] = {}
    for m in re.finditer(r'(memory\.[\w.]+)="?([0-9.]+ ?[KMGT]?i?B)"?', line):
        memory[m.group(1).removeprefix("memory.")] = parse_bytes(m.group(2), m.group(1))
    out["ollama_memory"] = memory
    if m := re.search(r"layers\.offload=(\d+)", line):
        out["layers_offload"] = int(m.group(1))
    if m := re.search(r"layers\.model=(\d+)", line):
        out["layers_model"] = int(m.group(1))
    return out
