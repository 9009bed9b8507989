"""llama.cpp's llama-server: per-slot streams or one ``-kvu`` pool (docs/reference/engines.md
§3): its launch command and its load-time memory layout (``--fit`` included, §3.6)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.engines import _run_log as run_log
from kvsim.engines._checkpoint import GGUF_LAYOUT, gguf_file
from kvsim.engines._common import EngineTraits
from kvsim.engines._gpu_checks import check_split
from kvsim.engines._llama_buffers import read_llama_buffers
from kvsim.engines._log_patterns import FLOAT, mib_bytes
from kvsim.engines._slot_box import box_budget, box_of, fit_box, main_gpu_budget
from kvsim.engines._slot_layout import (
    check_quant_k,
    mib,
    pad_to,
    slot_budget,
    slot_layout,
    swa_ring_cells,
)
from kvsim.engines.base import UbatchSplit
from kvsim.engines.memory import MIB, MemoryBudget
from kvsim.model.geometry import KvGeometry, kv_geometry
from kvsim.model.weights import model_weights, weight_format

if TYPE_CHECKING:
    from kvsim.engines.config import SlotEngineConfig

CACHE_RAM_DEFAULT_BYTES = 8192 * 2**20  # docs/reference/engines.md §3.4: --cache-ram default
# 8192 MiB
LLAMA_FIT_TARGET_BYTES = 1024 * MIB      # §3.6: --fit-target default 1024 MiB per device
LLAMA_FIT_CTX_TOKENS = 4096              # §3.6: --fit-ctx default, the floor of the shrink

LLAMA_MAX_SEQ = 256  # ggml-org/llama.cpp src/llama-cparams.h (64 in builds before mid-2025)
"""llama.cpp's most sequences: llama_context refuses more ('n_seq_max must be <= 256')."""


@dataclass(frozen=True)
class LlamaCpp(EngineTraits):
    """llama-server: ``-kvu`` shares one pool between the slots (§3.1)."""

    def unified_pool(self, cfg: Any) -> bool:
        return cfg.allocator == "unified"

    def attention_geometry(self, cfg: Any, geo: KvGeometry) -> KvGeometry:
        """Per-slot streams read each sliding-window layer's whole SWA ring
        (:func:`swa_read_geometry`); the ``-kvu`` pool is left at the window (NOTE: its
        kernels walk every slot's cells, which kvsim does not price yet:
        docs/design/speed-model.md)."""
        return geo if self.unified_pool(cfg) else swa_read_geometry(geo, cfg.n_ubatch)

    def ubatch_split(self, cfg: Any) -> UbatchSplit:
        """llama_decode's split of a step's batch into ubatches (:func:`llama_ubatches`)."""
        return partial(llama_ubatches, n_ubatch=cfg.n_ubatch,
                       unified=cfg.allocator == "unified")

    def launch_command(self, s: Any) -> str:
        """``llama-server``: ``-c`` is the whole pool over all slots (§3.1); ``-kvu`` for
        the unified allocator; on several GPUs the split flags that differ from the
        defaults (``-sm``, ``-ts``, ``-mg``, §3.8)."""
        e = s.engine
        parts = [f"llama-server -m {gguf_file(s)}", f"-c {e.ctx_size}",
                 f"--parallel {e.parallel}", f"-ctk {e.cache_type_k}", f"-ctv {e.cache_type_v}",
                 f"-fa {'on' if e.flash_attn else 'off'}"]
        if e.allocator == "unified":
            parts.append("-kvu")
        if e.cache_ram_bytes != CACHE_RAM_DEFAULT_BYTES:
            ram = -1 if e.cache_ram_bytes is None else -(-e.cache_ram_bytes // 2**20)
            parts.append(f"--cache-ram {ram}")
        if not e.cache_idle_slots:
            parts.append("--no-cache-idle-slots")
        if len(s.gpus) > 1:
            parts += [f"-sm {e.split_mode}"] if e.split_mode != "layer" else []
            parts += [f"-ts {','.join(f'{x:g}' for x in e.tensor_split)}"] \
                if e.tensor_split is not None else []
            parts += [f"-mg {e.main_gpu}"] if e.main_gpu else []
        return " ".join(parts)

    def read_startup_log(self, text: str, name: str = "log") -> dict[str, object]:
        return read_llama_cpp_log(text, name)

    def startup_run(self, text: str, start: str, facts: dict[str, Any]) -> dict[str, Any]:
        """The device list, the GGUF and its file type, ``build: N``, the context's knobs."""
        knobs = {"ctx_size": facts.get("n_ctx"), "parallel": run_log.slots_of(facts),
                 "kv_unified": facts.get("kv_unified"), "batch_size": facts.get("n_batch"),
                 "ubatch_size": facts.get("n_ubatch"), **run_log.slot_knobs(facts)}
        return {**run_log.ggml_names(text), "version": run_log.match(r"^build: (\d+) ", text),
                "settings": run_log.as_words(knobs), "figure_text": start}

    def log_scenario_keys(self, facts: dict[str, Any]) -> dict[str, Any]:
        """-c, --parallel, -kvu, -b, -ub, -fa, -ctk/-ctv, -ngl and the compute buffers."""
        unified = facts.get("kv_unified")
        on_gpu, total = facts.get("gpu_layers"), facts.get("layers_total")
        # NOTE: "offloaded N/M layers": M counts the output layer; -ngl N of M-1 repeating
        ngl = None if on_gpu is None or total is None else min(on_gpu, total - 1)
        keys = {"ctx_size": facts.get("n_ctx"), "parallel": facts.get("n_seq_max"),
                "allocator": None if unified is None else "unified" if unified else "slots",
                "n_batch": facts.get("n_batch"), "n_ubatch": facts.get("n_ubatch"),
                "flash_attn": facts.get("flash_attn"), "cache_type_k": facts.get("k_type"),
                "cache_type_v": facts.get("v_type"), "gpu_layers": ngl,
                "compute_buffer_bytes": facts.get("compute_buffer_bytes")}
        return {k: v for k, v in keys.items() if v is not None}

    def launch_notes(self, s: Any) -> list[str]:
        if weight_format(s.weights).name not in GGUF_LAYOUT:
            return []
        return [(f"replace {gguf_file(s)} by the path of a GGUF of {s.model.name} in that "
                 "layout (a file name such as ...-mxfp4.gguf does not say which; "
                 "llama-quantize MXFP4_MOE gives experts MXFP4, rest Q8_0)")]

    def memory_budget(self, gpu: GpuSpec, model: ModelSpec, weights: str, cfg: Any,
                      driver: int, display: int, parallel: int,
                      more_gpus: tuple[GpuSpec, ...] = ()) -> MemoryBudget:
        if more_gpus:
            return llama_cpp_box_budget((gpu, *more_gpus), model, weights, cfg, driver,
                                        display)
        return llama_cpp_budget(gpu, model, weights, cfg, driver, display)


def swa_read_geometry(geo: KvGeometry, n_ubatch: int) -> KvGeometry:
    """``geo`` as llama.cpp's flash attention reads it on one sequence's stream: a
    sliding-window layer walks its SWA ring (window + ``n_ubatch`` cells, padded to 256:
    :func:`~kvsim.engines._slot_layout.swa_ring_cells`) once the sequence has filled it.

    NOTE: the graph's KV view is ``get_n_kv()`` cells: the highest cell in use plus one,
    padded to 256 (src/llama-kv-cache.cpp). The ring frees cells that fall out of the
    window, but it places new tokens from its head onwards and wraps, so the highest cell
    in use reaches the ring's end. The masked cells are read and multiplied like live
    ones. Measured on a DGX Spark (Gemma 3 4B, ``-ub 2048``, 8,192 tokens and deeper):
    decode priced at the window was 14-57 % too fast, at the ring within 7 %
    (docs/design/speed-model.md)."""
    return geo.windows_read_as(lambda w: swa_ring_cells(w, n_ubatch))


def llama_ubatches(batch: Sequence[tuple[int, int]], n_ubatch: int, unified: bool
                   ) -> list[list[tuple[int, int]]]:
    """The ubatches llama_decode runs one step's batch as, one graph each (§3.5).

    ``batch``: ``(slot, tokens)`` as llama-server adds them — each generating slot's
    token, by slot, then each prompt chunk, by slot (a slot appears once; its slot is its
    sequence id).  Returns each ubatch as ``(index into batch, tokens)``.

    - one stream (``-kvu``): ``split_simple`` — the next ``n_ubatch`` tokens in batch order;
    - per-slot streams: ``split_equal(n_ubatch, sequential=true)`` (llama-kv-cache.cpp
      ``init_batch``, llama-batch.cpp): a ubatch takes the sequences of consecutive ids,
      from the first with tokens left, and the same number of tokens of each — the fewest
      any of them has left, at most ``n_ubatch`` in all (at least one each).  Decoding
      slots 0 and 2 run as two graphs; a decode beside a prompt takes one token of the
      prompt into its graph, the prompt's rest runs in graphs of its own.
    """
    total = sum(n for _, n in batch)
    if unified:
        if total <= n_ubatch:
            return [[(i, n) for i, (_, n) in enumerate(batch)]]
        return _split_simple([n for _, n in batch], n_ubatch)
    slots = [s for s, _ in batch]
    if total <= n_ubatch and all(n == batch[0][1] for _, n in batch) \
            and slots == list(range(slots[0], slots[0] + len(slots))):
        return [[(i, n) for i, (_, n) in enumerate(batch)]]  # NOTE: the common decode step
    left = [n for _, n in batch]
    out: list[list[tuple[int, int]]] = []
    while any(left):
        chosen: list[int] = []
        for i, slot in enumerate(slots):
            if left[i] and (not chosen or slot == slots[chosen[-1]] + 1):
                chosen.append(i)
                if len(chosen) > n_ubatch:
                    break
        each = min(min(left[i] for i in chosen), max(1, n_ubatch // len(chosen)))
        out.append([(i, each) for i in chosen])
        for i in chosen:
            left[i] -= each
    return out


def _split_simple(tokens: list[int], n_ubatch: int) -> list[list[tuple[int, int]]]:
    """``split_simple``: the batch's tokens in order, ``n_ubatch`` to a ubatch."""
    out: list[list[tuple[int, int]]] = [[]]
    room = n_ubatch
    for i, n in enumerate(tokens):
        while n:
            if not room:
                out.append([])
                room = n_ubatch
            take = min(n, room)
            out[-1].append((i, take))
            n -= take
            room -= take
    return out


# NOTE: llama-server allows -c above the training context (a warning only, §3.1)
ENGINE = LlamaCpp(name="llama.cpp", slot_family=True, lays_out_gpus=True,
                  max_parallel=LLAMA_MAX_SEQ,
                  max_parallel_why="llama.cpp's LLAMA_MAX_SEQ: llama-server refuses more "
                  "slots ('n_seq_max must be <= 256')", caps_slot_at_training_context=True,
                  op_offload=True, fresh_slots_from_last=True, context_scope="pool",
                  context_knob="-c",
                  settings=frozenset({"flash_attn", "gpu_layers", "kv_unified", "split_mode",
                                     "tensor_split", "main_gpu"}),
                  quant_v_needs_flash_attn=True, context_above_model="allow",
                  fit_shrinks_context=True)


def _auto_placement(gpu: GpuSpec, L: int, gpu_total: Any, expert_bytes: int
                    ) -> tuple[int, int]:
    """--fit (§3.6): ``(layers on the GPU, of them with their experts in RAM)``.  An MoE
    model's routed experts go to system RAM first, a layer's at a time, keeping its
    attention and KV on the GPU; whole layers spill only when every expert is out."""
    room = gpu.usable_memory_bytes - LLAMA_FIT_TARGET_BYTES
    if not expert_bytes or gpu_total(L) <= room:
        return _auto_layers(gpu, L, gpu_total, LLAMA_FIT_TARGET_BYTES), 0
    moe = -(-(gpu_total(L) - room) // expert_bytes)
    if moe <= L:
        return L, moe
    n = _auto_layers(gpu, L, lambda k: gpu_total(k) - k * expert_bytes,
                     LLAMA_FIT_TARGET_BYTES)
    return n, n


def _auto_layers(gpu: GpuSpec, L: int, gpu_total, target: int) -> int:
    """--fit: most layers (filled from the back, after the output layer: ``gpu_total``
    counts the head) that leave ``target`` bytes free."""
    n = L
    while n > 0 and gpu_total(n) > gpu.usable_memory_bytes - target:
        n -= 1
    return n


def _fit_context(max_tokens: int, pad: int, fits: Any) -> int:
    """--fit with -c unset (§3.6): the training context if it ``fits`` with every layer
    on the GPU, else the largest multiple of ``pad`` that does, not below --fit-ctx."""
    if fits(max_tokens):
        return max_tokens
    lo, hi = max(LLAMA_FIT_CTX_TOKENS // pad, 1), max_tokens // pad
    while lo < hi:  # largest k with fits(k * pad); fits shrinks with the context
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * pad) else (lo, mid - 1)
    return lo * pad


def llama_cpp_budget(gpu: GpuSpec, model: ModelSpec, weights: str, engine: SlotEngineConfig,
                     driver: int, display: int) -> MemoryBudget:
    """llama-server (§3.1-§3.3, §3.6): -c (``ctx_size``) padded to 256, unified pool or
    per-slot streams;
    with -c unset, --fit first shrinks the context, then places layers."""
    geo = kv_geometry(model, engine.cache_type_k, engine.cache_type_v, state_dtype="f32")
    check_quant_k(model, geo)
    ws = model_weights(model, weights)
    unified, pad, L = engine.allocator == "unified", engine.context_pad_tokens, model.num_layers

    def layout(ctx: int) -> tuple[int, int, dict]:
        n_ctx = pad_to(ctx, pad)
        n_ctx_seq = n_ctx if unified else pad_to(n_ctx // engine.parallel, pad)
        n_ctx = n_ctx if unified else n_ctx_seq * engine.parallel
        # NOTE: --fit places the output layer first (§3.6); an explicit -ngl places it last
        return n_ctx, n_ctx_seq, slot_layout(gpu, model, ws, geo, engine, n_ctx, n_ctx_seq,
                                         unified, driver, display,
                                         head_first=engine.gpu_layers is None)

    ctx, notes = engine.ctx_size, []
    assert ctx is not None  # NOTE: the config derives it (kvsim.engines.config)
    if engine.fit_context:
        room = gpu.usable_memory_bytes - LLAMA_FIT_TARGET_BYTES
        ctx = _fit_context(ctx, pad, lambda c: layout(c)[2]["gpu_total"](L) <= room)
        if ctx < engine.ctx_size:
            notes.append(f"-c unset: --fit shrank the context from the model's "
                         f"{engine.ctx_size} to {ctx} tokens")
    n_ctx, n_ctx_seq, lay = layout(ctx)
    moe = 0
    if engine.gpu_layers is None:
        n_gpu, moe = _auto_placement(gpu, L, lay["gpu_total"], ws.expert_bytes_per_layer)
        if moe:
            notes.append(f"--fit: the experts of {moe}/{L} layers in system RAM (as "
                         f"--n-cpu-moe {moe}); attention and KV stay on the GPU")
        if n_gpu < L:
            notes.append(f"--fit: only {n_gpu}/{L} layers leave 1 GiB free; the rest run on "
                         "the CPU (much slower decode)")
    else:
        n_gpu = min(engine.gpu_layers, L)
    kv_gpu = lay["kv_total"] * n_gpu // L
    logs = [(f"llama_context: n_seq_max = {engine.parallel}, n_ctx = {n_ctx}, n_ctx_seq = "
             f"{n_ctx_seq}, n_batch = {engine.n_batch}, n_ubatch = {engine.n_ubatch}, "
             f"flash_attn = {int(engine.flash_attn)}, kv_unified = {str(unified).lower()}"),
            f"llama_kv_cache: CUDA0 KV buffer size = {mib(kv_gpu)}"]
    if geo.recurrent_bytes_per_seq:
        notes.append(f"recurrent state f32: {mib(geo.recurrent_bytes_per_seq)} per sequence")
    b = slot_budget(engine, gpu, model, ws, geo, lay, n_gpu, n_ctx, n_ctx_seq,
                    driver, display, logs, notes, cpu_expert_layers=moe)
    lines = b.log_lines
    return replace(b, log_lines=(lines[0], *_load_tensors_lines(b), *lines[1:]))


def _load_tensors_lines(b: MemoryBudget) -> list[str]:
    """llama.cpp's load_tensors lines for one GPU: the output layer counts as a layer
    (``offloaded 33/33`` for 32 blocks), the host's share (the token embedding, layers
    and experts left there) is ``CPU_Mapped``."""
    on_gpu = b.gpu_layers + int(b.head_on_gpu)
    lines = [f"load_tensors: offloaded {on_gpu}/{b.num_layers + 1} layers to GPU"]
    if b.weights_cpu_bytes:
        lines.append(f"load_tensors: CPU_Mapped model buffer size = {mib(b.weights_cpu_bytes)}")
    return [*lines, f"load_tensors: CUDA0 model buffer size = {mib(b.weights_gpu_bytes)}"]


def llama_cpp_box_budget(gpus: tuple[GpuSpec, ...], model: ModelSpec, weights: str,
                        engine: SlotEngineConfig, driver: int, display: int) -> MemoryBudget:
    """llama-server over several GPUs (§3.8, kvsim.engines._slot_box): ``--split-mode
    layer`` / ``row`` by the tensor split or free memory, ``--fit`` over the devices;
    ``none``: the main GPU alone."""
    check_split(engine, len(gpus))
    if engine.split_mode == "none":
        return main_gpu_budget(gpus, engine.main_gpu, driver, display, lambda g, disp:
                               llama_cpp_budget(g, model, weights, engine, driver, disp))
    geo = kv_geometry(model, engine.cache_type_k, engine.cache_type_v, state_dtype="f32")
    check_quant_k(model, geo)
    ws = model_weights(model, weights)
    box, p, notes = fit_box(lambda ctx: box_of(gpus, model, ws, geo, engine, driver, display,
                                               ctx), engine)
    logs = [(f"llama_context: n_seq_max = {engine.parallel}, n_ctx = {box.n_ctx}, n_ctx_seq = "
             f"{box.n_ctx_seq}, n_batch = {engine.n_batch}, n_ubatch = {engine.n_ubatch}, "
             f"flash_attn = {int(engine.flash_attn)}, kv_unified = "
             f"{str(engine.allocator == 'unified').lower()}"),
            (f"load_tensors: offloaded {p.gpu_layers + (p.output >= 0)}/"
             f"{model.num_layers + 1} layers to GPU")]
    return box_budget(box, p, logs, notes)


def read_llama_cpp_log(text: str, name: str = "log") -> dict[str, object]:
    """llama.cpp's context and KV cache lines (docs/reference/engines.md §3.1)."""
    out: dict[str, object] = {}
    for key, pat in (("n_seq_max", r"n_seq_max\s*=\s*(\d+)"), ("n_ctx", r"\bn_ctx\s*=\s*(\d+)"),
                     ("n_ctx_seq", r"n_ctx_(?:seq|per_seq)\s*=\s*(\d+)")):
        prefix = r"llama_(?:context|new_context_with_model|init_from_model):.*?"
        if m := re.search(prefix + pat, text):
            out[key] = int(m.group(1))
    if m := re.search(r"kv_unified\s*=\s*(true|false)", text):
        out["kv_unified"] = m.group(1) == "true"
    buffers = _kv_buffers(text, name)
    if buffers:
        out["kv_buffers"] = buffers
        out["kv_buffer_bytes"] = sum(buffers.values())
    size = re.search(r"llama_kv_cache\w*: size\s*=\s*" + FLOAT + r" MiB \(\s*(\d+) cells,\s*"
                     r"(\d+) layers,\s*\d+/(\d+) seqs\), K \((\w+)\):\s*" + FLOAT
                     + r" MiB, V \((\w+)\):\s*" + FLOAT + " MiB", text)
    self_size = re.search(r"KV self size\s*=\s*" + FLOAT + r" MiB, K \((\w+)\):\s*" + FLOAT
                          + r" MiB, V \((\w+)\):\s*" + FLOAT + " MiB", text)
    if size:
        out.update(kv_size_bytes=mib_bytes(size.group(1)), kv_cells=int(size.group(2)),
                   kv_layers=int(size.group(3)), kv_streams=int(size.group(4)),
                   k_type=size.group(5), k_bytes=mib_bytes(size.group(6)), v_type=size.group(7),
                   v_bytes=mib_bytes(size.group(8)))
    elif self_size:
        out.update(kv_size_bytes=mib_bytes(self_size.group(1)), k_type=self_size.group(2),
                   k_bytes=mib_bytes(self_size.group(3)), v_type=self_size.group(4),
                   v_bytes=mib_bytes(self_size.group(5)))
    if m := re.search(r"SWA KV cache, size\s*=\s*(\d+) cells", text):
        out["swa_cells"] = int(m.group(1))
    return {**out, **read_llama_buffers(text)} if out else out




def _kv_buffers(text: str, name: str) -> dict[str, int]:
    """``<dev> KV buffer size`` per device, summed over the KV caches of one startup.

    NOTE: llama.cpp prints one line per device per KV cache (K and V together), so a
    device appears once — twice for an SWA model (its non-SWA and SWA caches,
    ``docs/reference/engines.md`` §3.1); later lines of the same startup belong to another
    context (a draft model's), so the first ones are the served model's.
    """
    caches = 2 if re.search(r"SWA KV cache", text) else 1
    lines: dict[str, list[int]] = {}
    for m in re.finditer(r"llama_kv_cache\w*:\s+(\S+) KV buffer size\s*=\s*" + FLOAT
                         + r" MiB", text):
        lines.setdefault(m.group(1), []).append(mib_bytes(m.group(2)))
    return {dev: sum(sizes[:caches]) for dev, sizes in lines.items()}
