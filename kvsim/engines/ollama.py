"""Ollama: llama.cpp's slots under its own runners and release defaults (docs/reference/engines.md
§4): its launch environment, its release rules (kvsim.engines.ollama_releases) and its
load-time memory layout with the release's layer placement (§4.2-§4.4)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import format_bytes, parse_bytes
from kvsim.engines import _run_log as run_log
from kvsim.engines._common import EngineTraits
from kvsim.engines._gpu_checks import refuse_split_knobs
from kvsim.engines._ollama_graph import projector_sizes
from kvsim.engines._ollama_place import ollama_estimate
from kvsim.engines._ollama_ps import with_ollama_ps
from kvsim.engines._slot_box import box_budget, box_of, device_parts
from kvsim.engines._slot_devices import Placement, free_shares, place, split_points
from kvsim.engines._slot_layout import check_quant_k, mib, pad_to, slot_budget
from kvsim.engines.base import BudgetOf, ForeignKnob
from kvsim.engines.llama_cpp import (
    LLAMA_MAX_SEQ,
    llama_cpp_box_budget,
    llama_cpp_budget,
    swa_read_geometry,
)
from kvsim.engines.memory import MemoryBudget, OllamaEstimate
from kvsim.engines.ollama_releases import (
    OLLAMA_ERA_D,
    OLLAMA_LATEST,
    OLLAMA_NUM_CTX_TIERS,
    known_ollama_release,
    ollama_arch,
    ollama_defaults,
    ollama_llama_server,
    ollama_memory_mode,
)
from kvsim.model.geometry import KvGeometry, kv_geometry
from kvsim.model.weights import model_weights

if TYPE_CHECKING:
    from kvsim.engines.config import SlotEngineConfig

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

    def startup_run(self, text: str, start: str, facts: dict[str, Any]) -> dict[str, Any]:
        """Its runner's lines as llama.cpp's, its release (``(version X)``), its date,
        num_ctx per slot and parallel (the runner's ``--ctx-size`` / ``--parallel`` where
        the context does not print them), its free memory and the ``offload`` line's
        ``key="value"`` pairs as figure items."""
        runner = dict(re.findall(r"--(ctx-size|parallel) (\d+)", start))
        slots = run_log.slots_of(facts) or (int(runner["parallel"]) if "parallel" in runner
                                            else None)
        per_slot = facts.get("n_ctx_seq") or (
            int(runner["ctx-size"]) // (slots or 1) if "ctx-size" in runner else None)
        line = next((ln for ln in start.splitlines() if "memory.required" in ln), "")
        pairs = re.findall(r'((?:memory|layers)\.[\w.]+)="?([^"\s]+(?: [KMGT]?i?B)?)"?', line)
        free = run_log.match(r'memory\.available="?(\[[^\]]*\])', start)
        knobs = {"num_ctx": per_slot, "parallel": slots, **run_log.slot_knobs(facts)}
        return {**run_log.ggml_names(text),
                "version": run_log.match(r"\(version (\d+\.\d+\.\d+)\)", text),
                "vram_total": f"memory.available={free}" if free else "",
                "date": run_log.match(r"time=(\d{4}-\d{2}-\d{2})", start),
                "settings": run_log.as_words(knobs),
                "figure_text": "; ".join(f"{k}={v}" for k, v in pairs) + "\n"
                + start.replace(line, "")}

    def launch_notes(self, s: Any) -> list[str]:
        return []

    def check_release(self, version: str | None) -> None:
        known_ollama_release(version, "ollama_version")

    def attention_geometry(self, cfg: Any, geo: KvGeometry) -> KvGeometry:
        """Era D runs llama-server on per-slot streams (§4.4): a sliding-window layer
        reads its SWA ring (kvsim.engines.llama_cpp.swa_read_geometry). The Go runners
        of eras A-C keep their own window cache, left at the window (not checked)."""
        if known_ollama_release(cfg.ollama_version) >= OLLAMA_ERA_D:
            return swa_read_geometry(geo, cfg.n_ubatch)
        return geo

    def release_defaults(self, merged: dict[str, Any], given: set[str],
                         gpu: GpuSpec | None, model: ModelSpec | None, weights: str | None,
                         budget_of: BudgetOf, more_gpus: tuple[GpuSpec, ...] = ()
                         ) -> dict[str, Any]:
        """The release ``ollama_version`` (default :data:`OLLAMA_LATEST`) and its defaults
        for the knobs not ``given`` (:func:`~kvsim.engines.ollama_releases.ollama_defaults`)."""
        version = merged.get("ollama_version")
        if version is None:  # NOTE: a user's preset file may lack it
            version = OLLAMA_LATEST
        merged = {**merged, "ollama_version": version}
        return {"ollama_version": version,
                **ollama_defaults(merged, given, gpu, model, weights, budget_of, more_gpus)}

    def memory_budget(self, gpu: GpuSpec, model: ModelSpec, weights: str, cfg: Any,
                      driver: int, display: int, parallel: int,
                      more_gpus: tuple[GpuSpec, ...] = ()) -> MemoryBudget:
        return ollama_budget(gpu, model, weights, cfg, driver, display, more_gpus)


_TIERS = ", ".join(f"{n} from {b // 2**30} GiB" for b, n in OLLAMA_NUM_CTX_TIERS)

# NOTE: Ollama truncates a prompt longer than num_ctx instead of refusing it (§4.5) and
# clamps num_ctx to the training length (§4.1); its unset num_ctx depends on the card's
# memory (kvsim.engines.ollama_releases, its newest release); it ignores a quantized cache
# type without flash attention (§4.1) and cannot shift an MLA model's context (§4.5)
ENGINE = Ollama(name="ollama", slot_family=True, lays_out_gpus=True,
                max_parallel=LLAMA_MAX_SEQ,
                max_parallel_why="its runner is llama.cpp, whose LLAMA_MAX_SEQ refuses more "
                "sequences ('n_seq_max must be <= 256')", truncates_prompt=True, op_offload=True,
                context_scope="slot", context_knob="num_ctx",
                settings=frozenset({"flash_attn", "gpu_layers", "ollama_version"}),
                one_cache_type_flag="OLLAMA_KV_CACHE_TYPE", one_cache_type_section="§4.1",
                context_above_model="clamp", unset_context_words=f"4096 ({_TIERS})",
                ignores_quant_cache_without_flash_attn=True, shifts_mla_context=False,
                foreign_knobs=(ForeignKnob("ctx_size", None, "Ollama has no -c; "
                                           "context_tokens is num_ctx, per slot (the "
                                           "runner gets num_ctx x parallel); a llama.cpp "
                                           "scenario switched to Ollama: set the engine "
                                           "alone (engine=ollama) or engine.ctx_size=null "
                                           "and engine.context_tokens"),))


def ollama_budget(gpu: GpuSpec, model: ModelSpec, weights: str, engine: SlotEngineConfig,
                  driver: int, display: int, more_gpus: tuple[GpuSpec, ...] = ()
                  ) -> MemoryBudget:
    """Ollama (§4.1-§4.4): the true layout is llama.cpp's with ``num_ctx × parallel`` cells
    in ``parallel`` slots; its release places the layers (``ollama_memory_mode``), over
    several GPUs by the runner's ``--tensor-split`` of its layer counts (§4.2-§4.3,
    kvsim.engines._ollama_place)."""
    notes, mode = [], ollama_memory_mode(engine, model)
    gpus = (gpu, *more_gpus)
    if more_gpus:
        refuse_split_knobs(engine, ENGINE.name)
    if engine.ignored_cache_type:  # NOTE: the engine config already made the cache f16
        notes.append(f"OLLAMA_KV_CACHE_TYPE={engine.ignored_cache_type} ignored: flash "
                     "attention is off, so the cache is f16 (docs/reference/engines.md §4.1)")
    if mode == "llama-server":  # era D (§4.4): llama-server's --fit places the layers
        srv = ollama_llama_server(engine)
        b = llama_cpp_box_budget(gpus, model, weights, srv, driver, display) if more_gpus \
            else llama_cpp_budget(gpu, model, weights, srv, driver, display)
        return replace(b, notes=tuple(notes) + b.notes)
    geo = kv_geometry(model, engine.cache_type_k, engine.cache_type_v, state_dtype="f32")
    check_quant_k(model, geo)
    ws = model_weights(model, weights)  # NOTE: its vision tower loads with the output layer
    ws = replace(ws, output_extra_bytes=projector_sizes(model, ollama_arch(model))[0])
    num_ctx = pad_to(engine.context_tokens, engine.context_pad_tokens)
    box = box_of(gpus, model, ws, geo, engine, driver, display, num_ctx * engine.parallel,
                 head_first=False)
    exact = (box.lay["kv_total"], box.lay["compute"]) if mode == "measured" else None
    free = [g.usable_memory_bytes - (display if i == 0 else 0) for i, g in enumerate(gpus)]
    metal = gpu.vendor == "Apple"
    est, a = ollama_estimate(model, engine, ws, engine.cache_type_v, free, exact, metal)
    for back in range(1, 10):  # §4.3: a failed allocation backs off 10 %, 20 %, ... of free
        if not exact or all(t <= g.usable_memory_bytes for t, g in
                            zip(_true_totals(box, est, a.output >= 0), gpus, strict=True)):
            break
        est, a = ollama_estimate(model, engine, ws, engine.cache_type_v,
                                 [f * (10 - back) // 10 for f in free], exact, metal)
    return with_ollama_ps(_placed_budget(box, est, a.output >= 0, notes), mode,
                          engine.context_tokens)


def _gpu_layers(box: Any, est: OllamaEstimate) -> int:
    """The runner's ``-ngl``: num_gpu when set (the estimate only caps what it counts),
    else the layers the release placed."""
    n = box.engine.gpu_layers
    return est.gpu_layers if n is None else min(n, box.model.num_layers)


def _head(box: Any, est: OllamaEstimate, output: bool) -> bool | None:
    """Where the runner puts the output layer when it holds every repeating layer:
    beside them only where the estimate placed it too (``-ngl`` is then the layer count
    plus one; with ``-ngl`` equal to it, Ollama's engine keeps the output layer on the
    CPU); None: the layer count decides (kvsim.model.weights)."""
    return None if output or _gpu_layers(box, est) < box.model.num_layers else False


def _placement(box: Any, est: OllamaEstimate, output: bool) -> Placement:
    """The runner's layers over several GPUs: ``-ngl`` and ``--tensor-split`` of the
    release's counts (by free memory where it placed none); the output layer with every
    repeating layer where the estimate placed it (:func:`_head`)."""
    L, n = box.model.num_layers, _gpu_layers(box, est)
    if not n:
        return Placement((-1,) * L, -1)
    shares = est.split if sum(est.split) else free_shares(box.gpus, box.driver, box.display)
    return place(split_points(shares), L, n, n == L and _head(box, est, output) is None)


def _true_totals(box: Any, est: OllamaEstimate, output: bool) -> list[int]:
    if len(box.gpus) == 1:
        return [box.lay["gpu_total"](_gpu_layers(box, est), _head(box, est, output))]
    return [pt.total for pt in device_parts(box, _placement(box, est, output))]


_LIBRARY = {"Apple": "metal", "AMD": "rocm", "Intel": "oneapi"}
"""The library Ollama's offload line names (its GPU discovery), by the card's vendor."""


def _placed_budget(box: Any, est: OllamaEstimate, output: bool, notes: list[str]
                   ) -> MemoryBudget:
    """The true layout of the release's placement, with its log line and notes."""
    L, engine, lay = box.model.num_layers, box.engine, box.lay
    n = _gpu_layers(box, est)
    offload = est.layers_offload
    kv_gpu = lay["kv_total"] * n // L
    library = _LIBRARY.get(box.gpus[0].vendor, "cuda")
    logs = [(f"offload to {library} layers.model={L + 1} layers.offload={offload} "
             f"layers.split={','.join(map(str, est.split)) if len(box.gpus) > 1 else ''} "
             f"memory.required.full={format_bytes(est.full_bytes)} "
             f"memory.required.partial={format_bytes(est.total_bytes)} "
             f"memory.required.kv={format_bytes(est.kv_bytes)} "
             f"memory.graph.full={format_bytes(est.graph_full_bytes)} "
             f"memory.graph.partial={format_bytes(est.graph_partial_bytes)}"
             + (f" projector.weights={format_bytes(est.projector_weights_bytes)} "
                f"projector.graph={format_bytes(est.projector_graph_bytes)}"
                if est.projector_weights_bytes else ""))]
    if est.projector_weights_bytes:
        notes.append(f"Ollama's engine loads the vision tower "
                     f"({format_bytes(est.projector_weights_bytes)}; its estimate adds a "
                     f"{format_bytes(est.projector_graph_bytes)} graph for one image) "
                     "where the output layer is")
    if n < L:
        notes.append(f"Ollama spills {L - n}/{L} layers to CPU RAM "
                     "(partial offload: works, much slower)")
    if est.kv_bytes < lay["kv_total"] and engine.cache_type_v in ("q8_0", "q4_0"):
        notes.append("Ollama's estimate under-counts this KV cache type (q8_0 as 1, q4_0 as "
                     "0.5 bytes/element; real 1.0625 / 0.5625)")
    totals = _true_totals(box, est, output)
    over = [i for i, (t, g) in enumerate(zip(totals, box.gpus, strict=True))
            if t > g.usable_memory_bytes]
    failure = None if not over else (
        f"cudaMalloc failed: out of memory — Ollama estimated {format_bytes(est.total_bytes)} "
        f"but the runner needs {format_bytes(sum(totals))}"
        + (f" (CUDA{over[0]}: {format_bytes(totals[over[0]])})" if len(box.gpus) > 1 else ""))
    if len(box.gpus) > 1:
        return box_budget(box, _placement(box, est, output), logs, notes, estimate=est,
                          failure=failure)
    logs.append(f"llama_kv_cache: CUDA0 KV buffer size = {mib(kv_gpu)}")
    return slot_budget(engine, box.gpus[0], box.model, box.ws, box.geo, lay, n, box.n_ctx,
                       box.n_ctx_seq, box.driver, box.display, logs, notes, estimate=est,
                       failure=failure, head=_head(box, est, output))


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
