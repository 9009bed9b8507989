"""Step times on a box of several GPUs: each GPU's share of the single-GPU roofline at its
own sustained rates, plus what crosses the link between the cards.

How the shares combine depends on the split (``MemoryBudget.split``; the byte shares come
from each GPU's :class:`kvsim.engines.memory.DeviceShare`):

- **layer / pipeline stages** (llama.cpp ``--split-mode layer``, Ollama, vLLM / SGLang
  ``--pipeline-parallel-size``): one batch runs through the stages one after another, so
  a step is the sum of each stage's time for its layers (the slower card paces its own
  layers), plus one activation copy per stage boundary (``tokens x hidden`` values: f32
  in ggml, 16-bit in vLLM / SGLang).  llama.cpp's pipeline parallelism (all layers on the
  GPUs) overlaps the micro-batches of a prompt: after the first ubatch has passed every
  stage, each further ubatch adds only the slowest stage's time.
- **tensor ranks** (vLLM / SGLang ``--tensor-parallel-size``): the ranks of a stage run
  together, each on ``1/tp`` of every matrix and of the heads, so a stage takes its
  slowest rank's time plus two all-reduces of the hidden states per layer (after the
  attention output and after the MLP; ring all-reduce: ``2(n-1)/n x bytes / rate +
  2(n-1) x latency``) and, on the last stage, a gather of the sampled rows' logits.
- **row** (llama.cpp ``--split-mode row``): every matrix product runs on all GPUs at
  once, each on its rows (the slowest GPU paces them), attention and the KV read on each
  layer's home GPU; every product scatters its input (q8_1, 1.0625 B per value) and
  gathers its output (f32): ``7`` products per layer (Q, K, V, O, gate, up, down; an
  ESTIMATE of the kernels a layer runs).
- **none** (llama.cpp ``--split-mode none``): the main GPU alone.

NOTE: the link is the scenario's ``gpu_link`` (kvsim.config.gpu_set: measured PCIe rates
or NVLink estimates); layers left on the CPU run at the host's rates as on one GPU (op
offload is not modelled on several GPUs); vLLM's overlap of several batches in flight
under pipeline parallelism is not modelled (a step is one batch through every stage, so
high-concurrency throughput is under-estimated).  ``decode_steps_s`` evaluates the same
formulas as ``step_time_s`` in the same order (kvsim.latency.base NOTE).
Design: docs/design/speed-model.md ("Several GPUs").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.latency.base import BatchShape
from kvsim.latency.offload import ubatch_split
from kvsim.latency.rates import (
    expert_loop_s,
    expert_tile_s,
    experts_used_fraction,
    linear_terms,
)
from kvsim.latency.roofline import GpuRates, RooflineLatency
from kvsim.model.weights import WeightSplit

ROW_PRODUCTS_PER_LAYER = 7          # ESTIMATE: Q, K, V, O, gate, up, down
ROW_INPUT_BYTES_PER_VALUE = 1.0625  # q8_1: 36 B per 32 values (ggml-common.h block_q8_1)
F32_BYTES = 4


def _linear(rates: GpuRates, lin: Any, tokens: float, decode: bool) -> tuple[Any, bool]:
    """(seconds of a step's linear-layer FLOPs ``lin`` on one GPU, whether its compute and
    memory times add): kvsim.latency.rates.linear_terms and times_add from one call."""
    rate, factor, mv = linear_terms(rates, tokens)
    return lin / rate * factor, rates.decode_adds and (decode or mv)


def _reread_s(rates: GpuRates, tokens: float, weight_bytes: float, skip: bool) -> float:
    """A prompt step's tiles reading this GPU's weights again (GpuRates.
    reread_s_per_byte_token, as RooflineLatency prices one card); 0 where ``skip`` (a
    decode-only step, or one whose times add)."""
    return 0.0 if skip else rates.reread_s_per_byte_token * tokens * weight_bytes


@dataclass(frozen=True)
class Share:
    """One GPU's part of every step: shares of the model's work it does."""

    rates: GpuRates
    layer: float     # of the repeating layers' linear FLOPs and dense weights
    attn: float      # of the attention FLOPs
    kv: float        # of the KV read
    expert: float    # of the routed experts' weights
    head: float      # of the output head (FLOPs and weights)


@dataclass(frozen=True)
class Link:
    """The GPU-to-GPU link: per-direction rate and per-transfer latency."""

    bytes_per_s: float
    latency_s: float

    def copy_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    def all_reduce_s(self, nbytes: float, ranks: int) -> float:
        if ranks < 2:
            return 0.0
        return 2 * (ranks - 1) * (self.latency_s + nbytes / ranks / self.bytes_per_s)


class MultiGpuLatency:
    """Step times of one model over several GPUs (module docstring)."""

    clamped_steps: int | None = None
    settle_steps = 0  # NOTE: every decode step is steady (LatencyModel)
    predicts_median = False  # NOTE: its ranks' rooflines: means (LatencyModel)
    decode_spread: tuple[float, ...] = ()
    prefill_spread: tuple[float, ...] = ()

    def __init__(self, base: RooflineLatency, weights: WeightSplit,
                 stages: Sequence[Sequence[Share]], mode: str, link: Link | None, *,
                 hidden: int, act_bytes: int, vocab: int, layers: Sequence[int],
                 ubatch: int | None, cpu: Share | None = None, label: str = "") -> None:
        """``stages``: the GPUs that run one after another, each a tuple of ranks that run
        together (row: one stage of every GPU); ``layers``: each stage's repeating
        layers; ``ubatch``: llama.cpp's pipelined micro-batch size (None: not pipelined);
        ``cpu``: the layers left on the host, at its rates; ``label``: the box, for the
        provenance."""
        self.base, self.weights, self.stages, self.mode = base, weights, stages, mode
        self.link = link
        self.hidden, self.act_bytes, self.vocab = hidden, act_bytes, vocab
        self.stage_layers, self.ubatch, self.cpu = layers, ubatch, cpu
        self.provenance = f"{base.provenance} over {label or f'{sum(map(len, stages))} GPUs'}"
        self.gpu_bytes_per_s = min(s.rates.kv_bytes_per_s for st in stages for s in st)
        self.kv_read_token_bytes = base.kv_read_token_bytes
        self.overhead_s = max(s.rates.overhead_s for st in stages for s in st)
        self.overhead_batch_s = max(s.rates.overhead_s if s.rates.overhead_batch_s is None
                                    else s.rates.overhead_batch_s for st in stages for s in st)
        self.graph_max_tokens = base.graph_max_tokens
        w = weights
        self.dense_bytes = w.num_layers * (w.per_layer_bytes - w.expert_bytes_per_layer)
        self.expert_bytes = w.num_layers * w.expert_bytes_per_layer

    # -- one GPU's (or the host's) part ---------------------------------------------
    def _overhead(self, tokens: float) -> float:
        """The slowest GPU's fixed step time: a captured graph up to the engine's
        ``graph_max_tokens``, launched kernels above (RooflineLatency.overhead)."""
        return self.overhead_s if tokens <= self.graph_max_tokens else self.overhead_batch_s

    @staticmethod
    def _join(compute: Any, memory: Any, adds: bool) -> Any:
        """A part's time: compute + memory where the rates say they add
        (kvsim.latency.rates.times_add), else the larger."""
        return compute + memory if adds else np.maximum(compute, memory)

    def _part(self, s: Share, tokens: float, outputs: float, pairs: Any, kv: Any,
              used: float, host: bool = False, decode: bool = False) -> Any:
        b = self.base
        lin = s.layer * tokens * b.linear_flops_per_token + s.head * outputs * \
            b.head_flops_per_output
        att = s.attn * pairs * b.pair_flops
        wts = self._weight_bytes(s, used)
        kvb = s.kv * kv
        r = s.rates
        kv_t = kvb / r.kv_bytes_per_s
        mem = wts / r.weight_bytes_per_s + kv_t
        if host:
            return np.maximum((lin + att) / r.linear_flops_per_s, mem) + b.dequant * kv_t
        lin_s, adds = _linear(r, lin, tokens, decode)
        flops = lin_s + att / r.attention_flops_per_s \
            + self._expert_tiles_s(s, tokens, decode)
        own = self._weight_bytes(s, b.expert_pick)  # a token's own (RooflineLatency)
        return self._join(flops + _reread_s(r, tokens, own, decode or adds), mem, adds) \
            + b.dequant * kv_t + expert_loop_s(r, tokens, b.expert_pick,
                                               s.expert * b.all_loop_experts)

    def _weight_bytes(self, s: Share, expert_share: Any) -> Any:
        """The weight bytes of GPU share ``s`` with ``expert_share`` of the routed experts
        (a step's: those its tokens reach; a token's own: k/E)."""
        return s.layer * self.dense_bytes + s.expert * expert_share * self.expert_bytes + \
            s.head * self.weights.head_bytes

    def _expert_tiles_s(self, s: Share, tokens: float, decode: bool) -> float:
        """A prompt step's routed experts on this GPU's share of the layers, tiling their
        own tokens (kvsim.latency.rates.expert_tile_excess; RooflineLatency: none in a
        decode-only step)."""
        b = self.base
        return expert_tile_s(s.rates, tokens, b.expert_pick,
                             s.layer * tokens * b.all_expert_flops_per_token, decode)

    def _row_part(self, s: Share, tokens: float, outputs: float, pairs: Any, kv: Any,
                  used: float, decode: bool = False) -> tuple[Any, Any]:
        """(matrix products on this GPU's rows, attention and experts on its home layers)."""
        b, r = self.base, s.rates
        lin = s.layer * tokens * b.linear_flops_per_token + s.head * outputs * \
            b.head_flops_per_output
        lin_s, adds = _linear(r, lin, tokens, decode)
        rows = s.layer * self.dense_bytes + s.head * self.weights.head_bytes
        mat = self._join(lin_s + self._expert_tiles_s(s, tokens, decode)
                         + _reread_s(r, tokens, rows, decode or adds),
                         rows / r.weight_bytes_per_s, adds)
        kv_t = s.kv * kv / r.kv_bytes_per_s
        home = self._join(s.attn * pairs * b.pair_flops / r.attention_flops_per_s,
                          s.expert * used * self.expert_bytes / r.weight_bytes_per_s + kv_t,
                          adds)
        return mat, home + b.dequant * kv_t + expert_loop_s(r, tokens, b.expert_pick,
                                                             s.expert * b.all_loop_experts)

    # -- what crosses the link -------------------------------------------------------
    def _comm_s(self, tokens: float, outputs: float) -> float:
        if self.link is None:
            return 0.0
        link, act = self.link, tokens * self.hidden
        if self.mode == "row":
            n = len(self.stages[0])
            per = act * (ROW_INPUT_BYTES_PER_VALUE + F32_BYTES) * (n - 1) / n
            return sum(self.stage_layers) * ROW_PRODUCTS_PER_LAYER * (
                2 * link.latency_s + per / link.bytes_per_s)
        t = (len(self.stages) - 1) * link.copy_s(act * self.act_bytes)
        for st, layers in zip(self.stages, self.stage_layers, strict=True):
            t += 2 * layers * link.all_reduce_s(act * self.act_bytes, len(st))
        tp = len(self.stages[-1])
        if tp > 1:  # the sampled rows' logits, gathered from the vocabulary shards
            t += link.copy_s(outputs * self.vocab * self.act_bytes * (tp - 1) / tp)
        return t

    # -- a whole step ------------------------------------------------------------------
    def _graph_s(self, tokens: float, outputs: float, pairs: Any, kv: Any,
                 decode: bool = False) -> Any:
        """One graph (one ubatch) through the box, without the fixed overhead
        (``decode``: a decode-only step)."""
        used = experts_used_fraction(int(tokens), self.base.expert_pick)
        if self.mode == "row":
            parts = [self._row_part(s, tokens, outputs, pairs, kv, used, decode)
                     for s in self.stages[0]]
            t = parts[0][0]
            for mat, _ in parts[1:]:
                t = np.maximum(t, mat)
            for _, home in parts:
                t = t + home
        else:
            t = 0.0
            for st in self.stages:
                slowest = self._part(st[0], tokens, outputs, pairs, kv, used, decode=decode)
                for s in st[1:]:
                    slowest = np.maximum(slowest, self._part(s, tokens, outputs, pairs, kv,
                                                             used, decode=decode))
                t = t + slowest
        if self.cpu is not None:
            t = t + self._part(self.cpu, tokens, outputs, pairs, kv, used, host=True)
        return t + self._comm_s(tokens, outputs)

    def _pipelined_s(self, tokens: float, outputs: float, pairs: float, kv: float) -> float:
        """llama.cpp's pipeline parallelism: the first ubatch through every stage, each
        further one paced by the slowest stage or the copy between two (module
        docstring)."""
        total, first = 0.0, True
        for size, count in ubatch_split(int(tokens), self.ubatch or int(tokens)):
            share = size / tokens
            args = (float(size), outputs * share, pairs * share, kv * share)
            if first:
                total += float(self._graph_s(*args))
                count, first = count - 1, False
            if count:
                used = experts_used_fraction(size, self.base.expert_pick)
                pace = max(float(self._part(st[0], *args, used)) for st in self.stages)
                if self.link is not None:
                    pace = max(pace, self.link.copy_s(size * self.hidden * self.act_bytes))
                total += count * pace
        return total

    def step_time_s(self, batch: BatchShape) -> float:
        if not batch.num_tokens:
            return 0.0
        tokens, outputs, pairs, kv = self.base._shape(batch)
        if self.ubatch and tokens > self.ubatch:
            return self._overhead(tokens) + self._pipelined_s(tokens, outputs, pairs, kv)
        return float(self._overhead(tokens) + self._graph_s(tokens, outputs, pairs, kv,
                                                            decode=tokens == outputs))

    def decode_steps_s(self, contexts: np.ndarray, steps: int,
                       kv_read_saved_bytes: float = 0.0) -> np.ndarray:
        n = len(contexts)
        if self.ubatch and n > self.ubatch:  # NOTE: several ubatches: the scalar path
            return np.array([self.step_time_s(BatchShape(decode_context=tuple(
                int(c) + j for c in contexts), kv_read_saved_bytes=kv_read_saved_bytes))
                for j in range(steps)], dtype=np.float64)
        pairs, kv = self.base.decode_terms(contexts, steps, kv_read_saved_bytes)
        return self._overhead(n) + self._graph_s(float(n), float(n), pairs, kv, decode=True)

    def decode_steps_list(self, contexts: Sequence[int], steps: int,
                          kv_read_saved_bytes: float = 0.0) -> list[float] | None:
        return None
