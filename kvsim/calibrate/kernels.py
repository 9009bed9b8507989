"""Kernel calibration: measure a model's step costs on this device with torch.

``kvsim calibrate kernels`` builds ``layers`` decoder layers with the model's real
shapes and random weights (:mod:`kvsim.calibrate.torch_model`), times prefill and
decode steps over a grid of batch × context × KV dtype, and scales the layer part by
``num_layers / layers`` (the LM head is timed once per step, its vocabulary slice
scaled by ``vocab / slice``).  It also measures KV bytes per token from the stored
tensors and the allocator, host↔device bandwidth (pinned and pageable; plain memory
copy on CPU), quantize/dequantize cost and the attention-output error of each KV
dtype, fits the calibrated step-time model and returns the artifact.

Timings follow the usual discipline: warm-up runs first, device synchronisation
around each timed region (CUDA), the median of ``repeats`` runs.  A grid point that
exhausts device memory is recorded in ``limits_reached`` and larger contexts of that
batch and dtype are skipped, instead of crashing the run.

NOTE: torch is imported lazily (extra ``calibrate``); importing this module without
torch raises an InputError naming the extra, not an ImportError traceback.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kvsim.calibrate.fit import fit_points
from kvsim.config.specs import ModelSpec
from kvsim.errors import InputError
from kvsim.latency.artifact import (
    Bandwidth,
    CalibrationArtifact,
    KvBytes,
    LimitReached,
    QuantCost,
    TimingPoint,
)


@dataclass(frozen=True)
class KernelGrid:
    batches: tuple[int, ...] = (1, 2, 4)
    contexts: tuple[int, ...] = (256, 1024, 4096)
    prefill_tokens: tuple[int, ...] = (64, 256, 1024)
    cache_types: tuple[str, ...] = ("f16", "q8_0", "q4_0")
    repeats: int = 5
    warmup: int = 1
    vocab_slice: int = 16384
    bandwidth_bytes: int = 256 * 2**20


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise InputError("calibrate", "torch", "not installed; pip install '.[calibrate]' in "
                         "the kvsim checkout") from None
    return torch


def layer_shape(model: ModelSpec) -> Any:
    """Real shapes of the model's full-attention layers (intermediate size derived).

    The catalogue has no FFN width, so it is derived from the parameter count:
    ``(params − embeddings) / layers − attention params`` spread over the three SwiGLU
    matrices, rounded to a multiple of 256; embeddings count once when the model's
    head is tied to them (:func:`kvsim.model.weights.tied_embeddings`), else twice
    (Llama-3.1-8B → 14336 and Llama-3.2-1B → 8192, their real values).
    """
    from kvsim.calibrate.torch_model import LayerShape
    from kvsim.model.weights import tied_embeddings

    full = [g for g in model.layer_groups if g.kind in ("full", "sliding", "chunked")]
    if not full:
        raise InputError("model", model.name, "has no attention layers with K and V to build")
    g = full[0]
    h, hd = model.hidden_size, g.head_dim_k
    attn = 2 * h * model.num_attention_heads * hd + 2 * h * g.n_kv_heads * hd
    embed = (1 if tied_embeddings(model) else 2) * model.vocab_size * h
    per_layer = (model.params_total - embed) / model.num_layers - attn
    inter = max(256, round(per_layer / (3 * h) / 256) * 256)
    return LayerShape(hidden=h, n_heads=model.num_attention_heads, n_kv_heads=g.n_kv_heads,
                      head_dim=hd, intermediate=inter, vocab=model.vocab_size)


def _timer(torch: Any, device: Any) -> Callable[[Callable[[], Any], int, int], float]:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def measure(fn: Callable[[], Any], repeats: int, warmup: int) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return measure


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text


class _Harness:
    def __init__(self, model: ModelSpec, device_name: str, layers: int, grid: KernelGrid,
                 seed: int) -> None:
        from kvsim.calibrate import torch_model as tm

        self.torch = torch = _torch()
        self.tm = tm
        if device_name == "cuda" and not torch.cuda.is_available():
            raise InputError("--device", device_name, "no CUDA device visible to torch")
        self.device = torch.device(device_name)
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.model, self.grid = model, grid
        self.layers = max(1, min(layers, model.num_layers))
        self.scale = model.num_layers / self.layers
        self.shape = layer_shape(model)
        self.gen = torch.Generator().manual_seed(seed)
        self.blocks = [tm.DecoderLayer(self.shape, self.device, self.dtype, self.gen)
                       for _ in range(self.layers)]
        self.head = tm.LmHead(self.shape, min(grid.vocab_slice, self.shape.vocab),
                              self.device, self.dtype, self.gen)
        self.measure = _timer(torch, self.device)
        self.limits: list[LimitReached] = []

    def _caches(self, kind: str, batch: int, capacity: int) -> list[Any]:
        s = self.shape
        return [self.tm.KvCache(kind, batch, s.n_kv_heads, capacity, s.head_dim, self.device)
                for _ in range(self.layers)]

    def _step(self, caches: list[Any], batch: int, tokens: int, start: int) -> float:
        torch = self.torch
        x = torch.randn(batch, tokens, self.shape.hidden, generator=self.gen).to(
            self.device, self.dtype)

        def layers() -> None:
            with torch.inference_mode():
                y = x
                for blk, cache in zip(self.blocks, caches):
                    y = blk.forward(y, cache, start)

        def head() -> None:
            with torch.inference_mode():
                self.head.forward(x[:, -1])

        g = self.grid
        t_layers = self.measure(layers, g.repeats, g.warmup)
        t_head = self.measure(head, g.repeats, g.warmup)
        return t_layers * self.scale + t_head * self.head.scale

    def timing_points(self) -> list[TimingPoint]:
        pts: list[TimingPoint] = []
        g = self.grid
        for kind in g.cache_types:
            for b in g.batches:
                for ctx in sorted(g.contexts):
                    try:
                        caches = self._caches(kind, b, ctx + 1)
                        t = self._step(caches, b, 1, ctx)
                        pts.append(TimingPoint(kind="decode", cache_type=kind, batch=b,
                                               context=ctx, measured_s=t, repeats=g.repeats))
                        for p in g.prefill_tokens:
                            if p <= ctx:
                                t = self._step(caches, b, p, ctx - p)
                                pts.append(TimingPoint(
                                    kind="prefill", cache_type=kind, batch=b, context=ctx - p,
                                    tokens=p, measured_s=t, repeats=g.repeats))
                        del caches
                    except (RuntimeError, MemoryError) as exc:
                        if not _is_oom(exc) and not isinstance(exc, MemoryError):
                            raise
                        self._oom(f"{kind} batch {b} context {ctx}", exc)
                        break
        return pts

    def _oom(self, what: str, exc: BaseException) -> None:
        self.limits.append(LimitReached(what=what, error=str(exc).splitlines()[0][:300]))
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()

    def kv_bytes(self, tokens: int = 1024) -> list[KvBytes]:
        out = []
        s, torch, L = self.shape, self.torch, self.model.num_layers
        for kind in self.grid.cache_types:
            cuda = self.device.type == "cuda"
            a0 = torch.cuda.memory_allocated(self.device) if cuda else 0
            r0 = torch.cuda.memory_reserved(self.device) if cuda else 0
            try:
                cache = self.tm.KvCache(kind, 1, s.n_kv_heads, tokens, s.head_dim, self.device)
            except (RuntimeError, MemoryError) as exc:
                if not (_is_oom(exc) or isinstance(exc, MemoryError)):
                    raise
                self._oom(f"kv bytes {kind} {tokens} tokens", exc)
                continue
            tensor = cache.nbytes() / tokens * L
            alloc = reserved = tensor
            if cuda:
                alloc = (torch.cuda.memory_allocated(self.device) - a0) / tokens * L
                reserved = (torch.cuda.memory_reserved(self.device) - r0) / tokens * L
            formula = L * s.n_kv_heads * 2 * s.head_dim * self.tm.BYTES_PER_VALUE[kind]
            out.append(KvBytes(cache_type=kind, tensor_bytes_per_token=tensor,
                               formula_bytes_per_token=formula,
                               allocated_bytes_per_token=alloc,
                               reserved_bytes_per_token=reserved))
            del cache
        return out

    def quant_costs(self, tokens: int = 1024) -> list[QuantCost]:
        s, torch, tm, L = self.shape, self.torch, self.tm, self.model.num_layers
        x = torch.randn(1, s.n_kv_heads, tokens, s.head_dim, generator=self.gen).to(
            self.device, self.dtype)
        out = []
        for kind in self.grid.cache_types:
            stored = tm.quantize(x, kind)
            tq = self.measure(lambda k=kind: tm.quantize(x, k), self.grid.repeats, 1)
            tdq = self.measure(lambda k=kind, st=stored: tm.dequantize(st, k, self.dtype),
                               self.grid.repeats, 1)
            err = tm.attention_error(kind, s.n_heads, s.n_kv_heads, s.head_dim, tokens,
                                     self.device, self.gen)
            # K and V both pass through (de)quantization on every layer.
            out.append(QuantCost(cache_type=kind, quantize_s_per_token=2 * L * tq / tokens,
                                 dequantize_s_per_token=2 * L * tdq / tokens,
                                 attention_rel_error=err))
        return out

    def bandwidths(self) -> list[Bandwidth]:
        torch, n = self.torch, self.grid.bandwidth_bytes
        out = []
        try:
            if self.device.type != "cuda":
                src = torch.ones(n, dtype=torch.uint8)
                dst = torch.empty_like(src)
                t = self.measure(lambda: dst.copy_(src), self.grid.repeats, 1)
                return [Bandwidth(direction="memcpy", pinned=False, bytes=n, bytes_per_s=n / t)]
            dev = torch.empty(n, dtype=torch.uint8, device=self.device)
            for pinned in (True, False):
                host = torch.ones(n, dtype=torch.uint8, pin_memory=pinned)
                t = self.measure(lambda h=host, pin=pinned: dev.copy_(h, non_blocking=pin),
                                 self.grid.repeats, 1)
                out.append(Bandwidth(direction="h2d", pinned=pinned, bytes=n, bytes_per_s=n / t))
                t = self.measure(lambda h=host, pin=pinned: h.copy_(dev, non_blocking=pin),
                                 self.grid.repeats, 1)
                out.append(Bandwidth(direction="d2h", pinned=pinned, bytes=n, bytes_per_s=n / t))
        except (RuntimeError, MemoryError) as exc:
            if not (_is_oom(exc) or isinstance(exc, MemoryError)):
                raise
            self._oom(f"bandwidth {n} bytes", exc)
        return out

    def device_label(self) -> str:
        if self.device.type == "cuda":
            return f"cuda:{self.device.index or 0} {self.torch.cuda.get_device_name(self.device)}"
        return f"cpu {platform.processor() or platform.machine()}"


def calibrate_kernels(model: ModelSpec, device: str = "cpu", layers: int = 2,
                      grid: KernelGrid | None = None, seed: int = 0,
                      threads: int | None = None) -> CalibrationArtifact:
    """Run the whole kernel calibration and return the fitted artifact.

    ``threads`` sets torch's CPU threads (None: torch's default).  On a shared machine
    use fewer threads than cores: spinning worker threads that lose their core to
    another process make every timed step many times slower.
    """
    if device not in ("cpu", "cuda"):
        raise InputError("--device", device, "one of cpu, cuda")
    grid = grid or KernelGrid()
    torch = _torch()
    if threads is not None:
        if threads <= 0:
            raise InputError("--threads", threads, "a positive integer")
        torch.set_num_threads(threads)
    h = _Harness(model, device, layers, grid, seed)
    points = h.timing_points()
    if not points:
        raise InputError("grid", "all points", "every grid point ran out of memory: "
                         + "; ".join(l.what for l in h.limits))
    kv, quant, bw = h.kv_bytes(), h.quant_costs(), h.bandwidths()
    return CalibrationArtifact(
        source="kernels", device=h.device_label(), model=model.name,
        software={"torch": torch.__version__, "python": platform.python_version(),
                  "threads": str(torch.get_num_threads())},
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        layers_built=h.layers, layers_total=model.num_layers,
        grid={"batch": list(grid.batches), "context": list(grid.contexts),
              "prefill_tokens": list(grid.prefill_tokens),
              "cache_type": list(grid.cache_types)},
        settings={"repeats": grid.repeats, "warmup": grid.warmup, "seed": seed,
                  "intermediate_size": h.shape.intermediate, "vocab_slice": grid.vocab_slice,
                  "compute_dtype": str(h.dtype).removeprefix("torch.")},
        points=tuple(points), fits=fit_points(points), kv_bytes=tuple(kv),
        quant=tuple(quant), bandwidth=tuple(bw), limits_reached=tuple(h.limits))
