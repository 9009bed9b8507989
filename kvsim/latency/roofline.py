"""Roofline step latency from the hardware profile.

A step's weight bytes are every dense tensor plus the routed experts its tokens reach
(``1 − (1 − k/E)^t``); its FLOPs are ``2 · params`` per token less embedding and head, the head
once per sequence, and ``4 · heads · head_dim`` per attention pair. GPU layers take the max of
compute and memory time (a prefill's compute includes the weights its tiles read again,
``GpuRates.reread_s_per_byte_token``: a token's own, the dense ones and k/E of the experts'),
CPU-offloaded layers the same on the host, plus a per-step overhead and, where the experts
loop on the host, that loop (kvsim.latency.rates.expert_loop_s, added last).
Quantized KV pays ``kv_dequant_factor`` of its read time; demoted tokens are read at their
quantized bytes (``BatchShape.kv_read_saved_bytes``); llama.cpp ubatches of ≥ 32 tokens copy
host weights to the GPU first (kvsim.latency.offload). A step the engine runs as several
graphs (``BatchShape.ubatches``, llama.cpp's ubatches) is the sum of each graph's roofline.

NOTE: ``decode_steps_s`` (numpy, :meth:`_times`) and ``step_time_s`` (scalar, :meth:`_time1`)
evaluate the same formulas in the same order, so fast-forward and per-step fidelity agree to
floating-point rounding (tests/latency checks it).
Design: docs/design/speed-model.md (after docs/design/DESIGN.md §3.5).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from kvsim.config.specs import GpuSpec, HostSpec, ModelSpec
from kvsim.latency.base import BatchShape
from kvsim.latency.offload import OpOffload, ubatch_split
from kvsim.latency.rates import (
    GpuRates,
    expert_loop_s,
    expert_tile_s,
    experts_used_fraction,
    linear_terms,
    peak_rates,
)
from kvsim.model.geometry import KvGeometry
from kvsim.model.weights import WeightSplit

DEFAULT_DEQUANT_FACTOR = 0.25


def _keys1(a: float, w: float) -> float:
    return a * (a + 1) / 2.0 if a <= w else w * (w + 1) / 2.0 + (a - w) * w


class RooflineLatency:
    """Step times of one model on one card (+ host for offloaded layers)."""

    clamped_steps: int | None = None  # NOTE: never clamps (LatencyModel)
    settle_steps = 0  # NOTE: every decode step is steady (LatencyModel)
    predicts_median = False  # NOTE: fitted on mean throughputs (LatencyModel)
    decode_spread: tuple[float, ...] = ()  # NOTE: a model, not a measurement
    prefill_spread: tuple[float, ...] = ()

    def __init__(self, *, gpu: GpuSpec, host: HostSpec, model: ModelSpec, geometry: KvGeometry,
                 weights: WeightSplit, gpu_layers: int | None = None,
                 step_overhead_s: float = 0.004, kv_dequant_factor: float = DEFAULT_DEQUANT_FACTOR,
                 kv_quantized: bool = False, head_on_gpu: bool | None = None,
                 cpu_expert_layers: int = 0, op_offload: OpOffload | None = None,
                 rates: GpuRates | None = None, graph_max_tokens: int = 1) -> None:
        self.provenance = f"roofline({gpu.name}, {model.name}, {weights.format})"
        layers = model.num_layers if gpu_layers is None else min(gpu_layers, model.num_layers)
        # the head: where the budget put it (llama.cpp --fit places it first), else by
        # WeightSplit's rule; the host works each step where layers, experts or it stay
        on_gpu = weights.head_on_gpu(layers) if head_on_gpu is None else head_on_gpu
        self.gpu_fraction = layers / model.num_layers
        self._step_weights(model, weights, layers, on_gpu, cpu_expert_layers)
        self._cpu_side = layers < model.num_layers or cpu_expert_layers > 0 or not on_gpu
        # prefill/decode FLOPs: every token through the layers; the token embedding is a
        # row lookup (no FLOPs); the output head only for the sequences' sampled positions
        vh = float(model.vocab_size * model.hidden_size)
        edges = vh if weights.tied else 2.0 * vh   # embedding + head (tied: one tensor)
        self.linear_flops_per_token = 2.0 * max(0.0, model.params_active - edges)
        self.head_flops_per_output = 2.0 * vh
        self.pair_flops = 4.0 * model.num_attention_heads * model.head_dim
        self.full_layers = geometry.full_layers
        self.windows = [(g.window_tokens, g.layers) for g in geometry.groups
                        if g.window_tokens is not None]
        self.geometry = geometry
        if rates is None:  # the plain roofline: one FLOP rate and one bandwidth
            rates = peak_rates(gpu, step_overhead_s)
        else:
            self.provenance = rates.label or self.provenance
        self.rates = rates
        self.attn_flops_per_s = rates.attention_flops_per_s
        self.gpu_bytes_per_s = rates.weight_bytes_per_s
        self.kv_bytes_per_s = rates.kv_bytes_per_s
        self.cpu_flops_per_s = host.cpu_flops
        self.cpu_bytes_per_s = host.memory_bandwidth_bytes_per_s
        self.overhead_s = rates.overhead_s
        self.overhead_batch_s = rates.overhead_s if rates.overhead_batch_s is None \
            else rates.overhead_batch_s
        self.graph_max_tokens = graph_max_tokens
        self.attn_rows_flops_per_s = rates.attention_flops_per_s \
            if rates.attention_rows_flops_per_s is None else rates.attention_rows_flops_per_s
        self.rows_below = rates.rows_below
        self.reread_s = rates.reread_s_per_byte_token  # a prefill's weights read again
        self.dequant = kv_dequant_factor if kv_quantized else 0.0
        # bytes per token when a sequence's KV is linear in its length (no window,
        # residual or recurrent state): decode sums then need no per-sequence loop
        simple = not self.windows and not geometry.residual_tokens \
            and not geometry.recurrent_bytes_per_seq
        self._linear_kv = sum(grp.bytes_per_token for grp in geometry.groups) if simple else None
        # bytes one old token adds to every step's read: the full-attention layers'
        self.kv_read_token_bytes = geometry.full_bytes_per_token
        self._host_weights(model, weights, layers, on_gpu, cpu_expert_layers, op_offload)

    def _step_weights(self, model: ModelSpec, weights: WeightSplit, layers: int,
                      head_on_gpu: bool, cpu_expert_layers: int) -> None:
        """Weights a step reads, split into dense bytes (attention, norms, router, shared
        experts, output head: read whole by any step) and routed-expert bytes (a step of
        ``t`` tokens reads the share :func:`experts_used_fraction` ``(t, k/E)``), on each
        side.  The token embedding is a row lookup, never streamed whole."""
        expert = weights.expert_bytes_per_layer
        dense = weights.per_layer_bytes - expert
        head = weights.head_bytes
        host_layers = model.num_layers - layers
        self.expert_pick = (model.num_experts_active or 0) / (model.num_experts or 1)
        self.gpu_dense_bytes = layers * dense + (head if head_on_gpu else 0)
        self.cpu_dense_bytes = host_layers * dense + (0 if head_on_gpu else head)
        self.gpu_expert_bytes = (layers - cpu_expert_layers) * expert
        self.cpu_expert_bytes = (host_layers + cpu_expert_layers) * expert
        # a one-token step's reads (one decoding sequence): k/E of the experts — a token's
        # own weights, also what a prefill's tiles read again per token (each expert
        # re-reads its weights per tile of *its* tokens, t·k/E), not all the step reaches
        self.gpu_weight_bytes, self.cpu_weight_bytes = self.weight_bytes(1)
        # a token's routed-expert FLOPs (2 a parameter): experts in system RAM (llama.cpp
        # --fit) on the CPU, their layers' attention and KV on the GPU; on the GPU; in
        # every layer (an offloaded ubatch runs them all on the GPU)
        flops = 2.0 * self.expert_pick * expert * 8 / weights.expert_bits
        self.cpu_linear_flops_per_token = flops * cpu_expert_layers
        self.gpu_expert_flops_per_token = flops * (layers - cpu_expert_layers)
        self.all_expert_flops_per_token = flops * model.num_layers
        # layers x experts a host loop over the experts walks (rates.expert_loop_s)
        self.loop_experts = (layers - cpu_expert_layers) * (model.num_experts or 0)
        self.all_loop_experts = model.num_layers * (model.num_experts or 0)

    def weight_bytes(self, tokens: int) -> tuple[float, float]:
        """(GPU, host) weight bytes one graph of ``tokens`` tokens reads: the dense parts
        whole, the routed experts in the share its tokens pick (scalar: the numpy and
        scalar paths use this one float)."""
        used = experts_used_fraction(int(tokens), self.expert_pick)
        return (self.gpu_dense_bytes + used * self.gpu_expert_bytes,
                self.cpu_dense_bytes + used * self.cpu_expert_bytes)

    def _host_weights(self, model: ModelSpec, weights: WeightSplit, gpu_layers: int,
                      head_on_gpu: bool, cpu_expert_layers: int,
                      op_offload: OpOffload | None) -> None:
        """What an offloaded ubatch copies to the GPU: the host layers' dense weights in
        full, the routed experts in host memory (host layers' and ``cpu_expert_layers``'),
        of which a ubatch copies the share its tokens pick; the head stays on the CPU."""
        host_layers = model.num_layers - gpu_layers
        expert = weights.expert_bytes_per_layer
        self.host_dense_bytes = host_layers * (weights.per_layer_bytes - expert)
        self.host_expert_bytes = (host_layers + cpu_expert_layers) * expert
        self.host_head_bytes = 0 if head_on_gpu else weights.head_bytes
        # what an offloaded ubatch's tiles read again per token: a token's own weights,
        # the copied host layers' too (_step_weights)
        self.offload_reread_bytes = self.gpu_weight_bytes + self.host_dense_bytes \
            + self.expert_pick * self.host_expert_bytes
        has_host = self.host_dense_bytes + self.host_expert_bytes > 0
        self.op_offload = op_offload if has_host else None

    def _times(self, n: int, pairs: np.ndarray, kv_read: np.ndarray) -> np.ndarray:
        """Decode step times of ``n`` sequences for arrays of (attention pairs, KV bytes)."""
        nf = float(n)
        lin = nf * self.linear_flops_per_token + nf * self.head_flops_per_output
        att = pairs * self.pair_flops
        if self._offloads(nf):  # offloaded steps: the scalar formula, per element
            return np.array([self._time1(nf, nf, float(p), float(k))
                             for p, k in zip(pairs, kv_read)], dtype=np.float64)
        f, moe = self.gpu_fraction, nf * self.cpu_linear_flops_per_token
        w_gpu, w_cpu = self.weight_bytes(n)
        kv_time_gpu = f * kv_read / self.kv_bytes_per_s
        rate, factor, _ = linear_terms(self.rates, nf)
        compute = (f * lin - moe) / rate * factor + f * att / self.attn_rows_flops_per_s
        memory = w_gpu / self.gpu_bytes_per_s + kv_time_gpu
        t_gpu = compute + memory if self.rates.decode_adds else np.maximum(compute, memory)
        t_cpu: np.ndarray | float = 0.0
        if self._cpu_side:
            kv_time_cpu = (1 - f) * kv_read / self.cpu_bytes_per_s
            t_cpu = np.maximum(((1 - f) * (lin + att) + moe) / self.cpu_flops_per_s,
                               w_cpu / self.cpu_bytes_per_s + kv_time_cpu)
            t_cpu = t_cpu + self.dequant * kv_time_cpu
        return self.overhead(n) + t_gpu + self.dequant * kv_time_gpu + t_cpu \
            + expert_loop_s(self.rates, nf, self.expert_pick, self.loop_experts)

    def _attn_rate(self, tokens: float, decode: bool) -> float:
        """Attention FLOP/s: the per-row kernel's for a decode-only step or one of fewer
        than ``rows_below`` tokens, the tiled kernel's otherwise."""
        return self.attn_rows_flops_per_s if decode or tokens < self.rows_below \
            else self.attn_flops_per_s

    def overhead(self, tokens: float) -> float:
        """The fixed time of a step of ``tokens`` tokens: replayed as a captured graph up
        to ``graph_max_tokens`` (llama.cpp's CUDA backend: one token), launched kernel by
        kernel above."""
        return self.overhead_s if tokens <= self.graph_max_tokens else self.overhead_batch_s

    # -- LatencyModel ------------------------------------------------------------
    def step_time_s(self, batch: BatchShape) -> float:
        if not batch.num_tokens:
            return 0.0
        if batch.ubatches:
            return self._graphs_s(batch)
        return self._time1(*self._shape(batch))

    def _graphs_s(self, batch: BatchShape) -> float:
        """A step run as several graphs (``BatchShape.ubatches``): the sum of their
        rooflines, each with its overhead, weight read, tokens' FLOPs and sequences' KV;
        a graph samples its decodes and the prompt pieces that end a prompt of the step;
        ``kv_read_saved_bytes`` is shared in proportion to the graphs' KV read."""
        ends = Counter(c + p for p, c in zip(batch.prefill_tokens, batch.prefill_context,
                                             strict=True))
        shapes = []
        for u in batch.ubatches:
            tokens, _, pairs, kv = self._shape(u)
            outputs = len(u.decode_context)
            for p, c in zip(u.prefill_tokens, u.prefill_context, strict=True):
                outputs += ends[c + p] > 0
                ends[c + p] -= ends[c + p] > 0
            shapes.append((tokens, float(outputs), pairs, kv))
        kv_all, saved = sum(s[3] for s in shapes), batch.kv_read_saved_bytes
        return sum(self._time1(t, o, p, kv - (saved * kv / kv_all if saved else 0.0))
                   for t, o, p, kv in shapes)

    def gpu_parts(self, batch: BatchShape) -> tuple[float, float, float, float]:
        """What one all-on-GPU step costs before any rate is applied: (linear-layer and
        head FLOPs, attention FLOPs, weight bytes read, KV bytes read) — the terms the
        step's time divides by :class:`GpuRates` (scripts/fit_speed.py fits on them)."""
        tokens, outputs, pairs, kv_read = self._shape(batch)
        lin = tokens * self.linear_flops_per_token + outputs * self.head_flops_per_output
        return lin, pairs * self.pair_flops, self.weight_bytes(int(tokens))[0], kv_read

    def _shape(self, batch: BatchShape) -> tuple[float, float, float, float]:
        """(tokens, sampled outputs, layer-weighted attention pairs, KV bytes read)."""
        # NOTE: scalar Python (per-step hot path) with the same formulas as the numpy path.
        g, full = self.geometry, self.full_layers
        pairs = 0.0
        kv = 0.0
        news = list(zip(batch.prefill_tokens, batch.prefill_context))
        dec = batch.decode_context
        if self._linear_kv is not None:
            # NOTE: every term is an integer below 2**53, so these sums equal the
            # per-sequence float accumulation below exactly.
            tokens = sum(dec) + len(dec)
            pairs = float(full * tokens)
            kv = float(self._linear_kv * tokens)
        else:
            news += [(1, c) for c in dec]
        for n, c0 in news:
            a = c0 + n
            pairs += full * (n * c0 + n * (n + 1) / 2.0)
            for w, layers in self.windows:
                pairs += layers * (_keys1(a, w) - _keys1(c0, w))
            kv += g.bytes_for_tokens(a)
        # one sampled position (output-head row) per sequence in the step
        outputs = float(len(batch.prefill_tokens) + len(dec))
        kv_read = float(kv) - batch.kv_read_saved_bytes  # demoted tokens' bytes (doc)
        return float(batch.num_tokens), outputs, pairs, kv_read

    def _offloads(self, tokens: float) -> bool:
        """Does a step of ``tokens`` tokens offload its first (largest) ubatch?"""
        off = self.op_offload
        return off is not None and off.offloads(min(int(tokens), off.ubatch_tokens))

    def _time1(self, tokens: float, outputs: float, pairs: float, kv_read: float) -> float:
        lin = tokens * self.linear_flops_per_token + outputs * self.head_flops_per_output
        att = pairs * self.pair_flops
        off = self.op_offload
        decode = tokens == outputs   # every sequence one token: a decode-only step
        if off is None or not self._offloads(tokens):
            return self._split_s(tokens, lin, att, kv_read, self.overhead(tokens), decode)
        # ubatches of n_ubatch tokens, each a graph of its own: FLOPs by share of tokens,
        # weights and the step's KV read by every one (kvsim.latency.offload)
        t, on_cpu = self.overhead(tokens), False
        for size, count in ubatch_split(int(tokens), off.ubatch_tokens):
            share = size / tokens
            if off.offloads(size):
                t += count * self._offloaded_s(size, lin * share, att * share, kv_read,
                                               off.link_bytes_per_s, decode)
            else:  # a short last ubatch: host layers (and head) on the CPU
                t += count * self._split_s(float(size), lin * share, att * share, kv_read,
                                           0.0, decode)
                on_cpu = True
        # an output head in host memory runs on the CPU for the few tokens needing
        # logits (a batch below the minimum): one read of it per step
        return t if on_cpu else t + self.host_head_bytes / self.cpu_bytes_per_s

    def _offloaded_s(self, tokens: int, lin: float, att: float, kv_read: float,
                     link_bytes_per_s: float, decode: bool) -> float:
        """One ubatch with every layer on the GPU: copy the host weights (experts: the
        share routed to) and the host layers' KV over the link, then compute — the
        scheduler issues the copy on the GPU's stream before the split, so they add."""
        used = experts_used_fraction(tokens, self.expert_pick)
        copy_w = self.host_dense_bytes + self.host_expert_bytes * used
        copy_kv = (1 - self.gpu_fraction) * kv_read
        kv_time = kv_read / self.kv_bytes_per_s
        resident = self.weight_bytes(tokens)[0] + copy_w
        rate, factor, _ = linear_terms(self.rates, tokens)
        t = max(lin / rate * factor + att / self._attn_rate(tokens, False)
                + expert_tile_s(self.rates, tokens, self.expert_pick,
                                tokens * self.all_expert_flops_per_token, decode)
                + self.reread_s * tokens * self.offload_reread_bytes,
                resident / self.gpu_bytes_per_s + kv_time)
        t += self.dequant * kv_time
        return t + (copy_w + copy_kv) / link_bytes_per_s \
            + expert_loop_s(self.rates, tokens, self.expert_pick, self.all_loop_experts)

    def _split_s(self, tokens: float, lin: float, att: float, kv_read: float,
                 base_s: float, decode: bool = False) -> float:
        """``base_s`` plus the GPU layers' roofline time plus the host layers' CPU time
        (``lin``: linear-layer and head FLOPs, ``att``: attention FLOPs; ``decode``: a
        decode-only step; its GPU times add where ``decode_adds``, and so do a step's
        the matrix-vector kernels run: GpuRates.small_flops_per_s)."""
        f, moe = self.gpu_fraction, tokens * self.cpu_linear_flops_per_token
        w_gpu, w_cpu = self.weight_bytes(int(tokens))
        kv_time_gpu = f * kv_read / self.kv_bytes_per_s
        rate, factor, small = linear_terms(self.rates, tokens)
        compute = (f * lin - moe) / rate * factor + f * att / self._attn_rate(tokens, decode) \
            + expert_tile_s(self.rates, tokens, self.expert_pick,
                            tokens * self.gpu_expert_flops_per_token, decode)
        memory = w_gpu / self.gpu_bytes_per_s + kv_time_gpu
        adds = self.rates.decode_adds and (decode or small)  # kvsim.latency.rates.times_add
        if not (decode or adds):  # a prefill's tiles read a token's weights again (GpuRates)
            compute += self.reread_s * tokens * self.gpu_weight_bytes
        t = base_s + (compute + memory if adds else max(compute, memory))
        t += self.dequant * kv_time_gpu
        if self._cpu_side:
            kv_time_cpu = (1 - f) * kv_read / self.cpu_bytes_per_s
            t += max(((1 - f) * (lin + att) + moe) / self.cpu_flops_per_s,
                     w_cpu / self.cpu_bytes_per_s + kv_time_cpu)
            t += self.dequant * kv_time_cpu
        return t + expert_loop_s(self.rates, tokens, self.expert_pick, self.loop_experts)

    def decode_steps_list(self, contexts: Sequence[int], steps: int,
                          kv_read_saved_bytes: float = 0.0) -> list[float] | None:
        """:meth:`decode_steps_s` in scalar Python, for short stretches (numpy's per-call
        overhead exceeds their work); None when the KV is not linear in the context.

        NOTE: the numpy path's formulas (:meth:`_times`) element by element, in the same
        order, on the same integer-exact inputs: the same floats.
        """
        if self._linear_kv is None:
            return None
        n, total = len(contexts), sum(contexts)
        nf, full, lkv = float(n), self.full_layers, self._linear_kv
        saved = kv_read_saved_bytes
        if self._offloads(nf):  # 32+ sequences with host weights: op offload
            return [self._time1(nf, nf, float(full * tok), float(lkv * tok) - saved)
                    for tok in range(total + n, total + n * steps + 1, n)]
        lin = nf * self.linear_flops_per_token + nf * self.head_flops_per_output
        pf, f = self.pair_flops, self.gpu_fraction
        gflops, factor, _ = linear_terms(self.rates, nf)
        gbw, dq = self.gpu_bytes_per_s, self.dequant
        aflops, kvbw = self.attn_rows_flops_per_s, self.kv_bytes_per_s
        w_gpu, w_cpu = self.weight_bytes(n)
        w_gpu /= gbw
        over, adds, out = self.overhead(n), self.rates.decode_adds, []
        moe, cpu_side = nf * self.cpu_linear_flops_per_token, self._cpu_side
        loop = expert_loop_s(self.rates, nf, self.expert_pick, self.loop_experts)
        for tok in range(total + n, total + n * steps + 1, n) if n else [total] * steps:
            kv = float(lkv * tok) - saved
            att = float(full * tok) * pf
            kv_time_gpu = f * kv / kvbw
            compute = (f * lin - moe) / gflops * factor + f * att / aflops
            t_gpu = compute + (w_gpu + kv_time_gpu) if adds else \
                max(compute, w_gpu + kv_time_gpu)
            t_cpu = 0.0
            if cpu_side:
                kv_time_cpu = (1 - f) * kv / self.cpu_bytes_per_s
                t_cpu = max(((1 - f) * (lin + att) + moe) / self.cpu_flops_per_s,
                            w_cpu / self.cpu_bytes_per_s + kv_time_cpu)
                t_cpu = t_cpu + dq * kv_time_cpu
            out.append(over + t_gpu + dq * kv_time_gpu + t_cpu + loop)
        return out

    def decode_steps_s(self, contexts: np.ndarray, steps: int,
                       kv_read_saved_bytes: float = 0.0) -> np.ndarray:
        pairs, kv = self.decode_terms(contexts, steps, kv_read_saved_bytes)
        return self._times(len(contexts), pairs, kv)

    def decode_terms(self, contexts: np.ndarray, steps: int, saved: float
                     ) -> tuple[np.ndarray, np.ndarray]:
        """(layer-weighted attention pairs, KV bytes read less ``saved``) of ``steps``
        decode steps of a fixed batch (the multi-GPU box prices the same terms).

        NOTE: integer sums where the KV is linear, as step_time_s forms them, and
        ``saved`` subtracted last: the per-step and stretch paths get the same floats."""
        if self._linear_kv is not None:
            ctx = np.asarray(contexts, dtype=np.int64)
            tokens = int(ctx.sum()) + len(ctx) * np.arange(1, steps + 1, dtype=np.int64)
            return ((self.full_layers * tokens).astype(np.float64),
                    (self._linear_kv * tokens).astype(np.float64) - saved)
        c = np.asarray(contexts, dtype=np.float64)[:, None] + np.arange(steps)[None, :]
        pairs = np.sum(self.geometry.attended_pairs(c + 1, np.ones_like(c)), axis=0)
        return pairs, np.sum(self.geometry.bytes_for_token_array(c + 1), axis=0) - saved
