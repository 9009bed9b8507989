"""kvsim's prediction of one measured throughput: the measured test replayed step by step.

:func:`setup_for` resolves a :class:`Measurement`'s device, model and weight format
against the catalogue (or says why it cannot: unknown or ambiguous names, several
GPUs, a CPU-only run); :func:`step_batches` lays the measured test out as the engine
steps llama-bench and llama-batched-bench run:

- ``pp``: ``batch`` sequences of ``n_prompt`` tokens after ``depth`` cached ones, cut
  into ubatches of ``n_ubatch`` tokens (one weight read each);
- ``tg``: ``n_gen`` decode steps of ``batch`` sequences, each one token longer;

and :func:`predicted_tps` prices them with the backend-aware roofline
(:mod:`kvsim.latency.backend`), so ``kvsim validate`` checks the same step-time code
the simulator runs.

NOTE: every weight layer is on the GPU (the published runs use ``-ngl 99``); KV is the
measurement's cache type (f16 unless it says otherwise), one stream per sequence (both
tools' default), so a sliding-window layer reads its SWA ring
(kvsim.engines.llama_cpp.swa_read_geometry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from kvsim.config.catalog import DEFAULT_HOST, load_gpu, load_host, load_model
from kvsim.config.gpu_names import resolve_gpu
from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.engines.llama_cpp import swa_read_geometry
from kvsim.errors import InputError
from kvsim.latency.backend import BACKENDS, SpeedConstants, cuda_graphs, gpu_rates
from kvsim.latency.base import BatchShape
from kvsim.latency.roofline import GpuRates, RooflineLatency
from kvsim.model.dtypes import cache_type
from kvsim.model.geometry import kv_geometry
from kvsim.model.names import resolve_model
from kvsim.model.weights import (
    WeightSplit,
    format_for_file,
    model_weights,
    weight_format_names,
)
from kvsim.validate.records import Measurement, Skipped

DEFAULT_UBATCH = 512
MAX_TEST_TOKENS = 1 << 24
"""A test's prompt, generated and cached tokens: at most 16,777,216 (above every
catalogue model's context)."""
MAX_TEST_BATCH = 1 << 16
"""Sequences of one test (llama-batched-bench's ``-npl``): at most 65,536."""
MAX_TEST_STEPS = 1 << 20
"""Engine steps one test is priced in (its prompt over its micro-batches, or its
generated tokens): at most 1,048,576, so a row cannot keep ``kvsim validate`` busy for
hours."""


@dataclass(frozen=True)
class Setup:
    """What a measurement ran: resolved profiles and settings."""

    gpu: GpuSpec
    model: ModelSpec
    weight_format: str
    backend: str
    flash_attn: bool
    kv_type: str = "f16"
    cuda_graphs: bool = True   # one-token steps replay as CUDA graphs (CUDA backend)
    file_bytes: int | None = None  # the model file's size as the tool printed it
    n_ubatch: int = DEFAULT_UBATCH  # -ub: sizes the SWA ring a windowed layer reads
    cublas_prompts: bool = False   # CUDA prompts on 2024's cuBLAS path (Measurement)


def _weight_format(m: Measurement, from_name: str | None) -> str | None:
    """The row's weight format, else the one its model name states; the name's where it
    refines the row's ("MXFP4 MoE" in the name, "MXFP4" in the column)."""
    text = (m.weight_format or from_name or "").strip().lower().replace("-", "_")
    text = {"q4_k_medium": "q4_k_m", "q4_k___medium": "q4_k_m", "fp16": "f16"}.get(text, text)
    if from_name and text and from_name.startswith(text + "_"):
        text = from_name
    return text if text in weight_format_names() else None


def setup_for(m: Measurement, *, gpu: GpuSpec | None = None,
              model: ModelSpec | None = None) -> Setup | Skipped:
    """Resolve ``m``'s device and model by the names it carries (``gpu``/``model``, when
    given, are used instead), or say why it cannot be predicted."""
    if m.n_gpus > 1:
        return Skipped(m.id, f"{m.n_gpus} GPUs: kvsim predicts one device")
    if gpu is None:
        if m.backend not in BACKENDS:
            return Skipped(m.id, f"backend {m.backend!r}: kvsim predicts GPU backends "
                           f"({', '.join(BACKENDS)}); calibrate a CPU with "
                           "`kvsim calibrate bench`")
        g = resolve_gpu(m.gpu)
        if g.slug is None:
            return Skipped(m.id, g.reason)
        if g.count > 1:
            return Skipped(m.id, f"{g.count} GPUs ({m.gpu!r}): kvsim predicts one device")
        gpu = load_gpu(g.slug)
    mm = resolve_model(m.model, n_params=m.model_params, size_bytes=m.model_size_bytes)
    if model is None:
        model = one_shape(mm.candidates) if mm.slug is None else load_model(mm.slug)
        if model is None:
            return Skipped(m.id, mm.reason)
    return setup_with(m, gpu, model, mm.weight_format)


_DESCRIPTIVE = frozenset({"name", "display_name", "hf_repo", "source", "notes",
                          "max_context_tokens", "vision_encoder", "params_total",
                          "params_active"})
"""ModelSpec fields a llama-bench test's time does not depend on (the parameter counts
are compared within :data:`SAME_PARAMS`; llama-bench loads no image encoder)."""
SAME_PARAMS = 1e-3


def one_shape(slugs: tuple[str, ...]) -> ModelSpec | None:
    """The one of ``slugs`` with the longest context when every one has the same layers,
    widths, heads, experts and parameters (within :data:`SAME_PARAMS`), so any of them
    times a test alike (llama-bench's "llama 8B": Llama 3 8B and 3.1 8B differ only in
    context length, and a test at depth 32768 needs the longer one); else None."""
    if len(slugs) < 2:
        return None
    models = [load_model(s) for s in slugs]
    shapes = [_shape(m) for m in models]
    first = models[0]
    same = all(s == shapes[0] for s in shapes) and all(
        abs(m.params_total - first.params_total) <= SAME_PARAMS * first.params_total
        and abs(m.params_active - first.params_active) <= SAME_PARAMS * first.params_active
        for m in models)
    return max(models, key=lambda m: m.max_context_tokens) if same else None


def _shape(m: ModelSpec) -> dict[str, object]:
    """``m``'s fields that time a test. NOTE: an FFN width sizes a GGUF only through its
    remainder in 256-value blocks (kvsim.model.gguf_mix: rows that are not whole blocks
    fall back), and an unrecorded one is the hidden size: compared as that remainder."""
    d = m.model_dump(exclude=set(_DESCRIPTIVE))
    ff = m.ffn_intermediate_size or m.hidden_size
    d["ffn_intermediate_size"] = ff % 256
    d["moe_intermediate_size"] = (m.moe_intermediate_size or ff) % 256
    return d


def setup_with(m: Measurement, gpu: GpuSpec, model: ModelSpec,
               named_format: str | None = None) -> Setup | Skipped:
    """``m`` on given profiles (its weight format from the row, else ``named_format``)."""
    fmt = _weight_format(m, named_format)
    if fmt is None and not (m.weight_format or named_format):
        return Skipped(m.id, "weight format not shown (llama-batched-bench prints no "
                       "model): give --model a GGUF file, or a name that carries it "
                       "(llama-3.1-8b-Q4_K_M)")
    if fmt is None:
        return Skipped(m.id, f"weight format {m.weight_format!r}: one of "
                       + ", ".join(weight_format_names()))
    if m.model_size_bytes:  # NOTE: an experts-only format's other tensors, by file size
        fmt = format_for_file(model, fmt, m.model_size_bytes)
    try:
        own = model_weights(model, fmt).total_bytes
    except InputError as e:  # an experts-only format on a dense model: this row only
        return Skipped(m.id, f"weight format {fmt!r}: {e.allowed}")
    if m.model_size_bytes and not 0.5 <= m.model_size_bytes / own <= 2.0:
        return Skipped(m.id, f"model file {m.model_size_bytes / 2**30:,.2f} GiB: more than "
                       f"2x from {model.name} in {fmt} ({own / 2**30:,.2f} GiB)")
    kv = (m.kv_type or "f16").lower()
    try:
        cache_type(kv)
    except InputError:
        return Skipped(m.id, f"KV cache type {m.kv_type!r} unknown to kvsim")
    problem = _test_problem(m)
    if problem:
        return Skipped(m.id, problem)
    return Setup(gpu, model, fmt, m.backend, bool(m.flash_attn), kv,
                 cuda_graphs(gpu, m.backend, m.cuda_graphs_since), m.model_size_bytes,
                 m.n_ubatch or DEFAULT_UBATCH, m.cublas_prompts)


def _test_problem(m: Measurement) -> str | None:
    """Why ``m``'s test cannot be priced (a measured speed that is not a finite number
    above 0, a count outside its range, more engine steps than MAX_TEST_STEPS), else
    None."""
    if not (math.isfinite(m.value) and m.value > 0):
        return f"measured value {m.value!r}: a finite number of tokens/s above 0"
    for name, count in (("n_prompt", m.n_prompt), ("n_gen", m.n_gen), ("depth", m.depth)):
        if not 0 <= count <= MAX_TEST_TOKENS:
            return f"{name} {count!r}: 0 to {MAX_TEST_TOKENS:,} tokens"
    if not 1 <= m.batch <= MAX_TEST_BATCH:
        return f"batch {m.batch!r}: 1 to {MAX_TEST_BATCH:,} sequences"
    if m.n_ubatch is not None and m.n_ubatch < 1:  # NOTE: step_batches would never end
        return f"n_ubatch {m.n_ubatch!r}: at least 1 token"
    if (m.metric != "tg_tps" and m.n_prompt <= 0) or (m.metric != "pp_tps" and m.n_gen <= 0):
        return "a test of 0 tokens"
    if m.metric == "pg_tps" and m.batch != 1:
        return f"batch {m.batch}: llama-bench's prompt+generation test runs one sequence"
    ub = m.n_ubatch or DEFAULT_UBATCH
    prompt, decode = test_parts(m)
    steps = (decode.n_gen if decode else 0) \
        + (-(-m.batch * m.n_prompt // ub) + m.batch if prompt else 0)
    if steps > MAX_TEST_STEPS:
        return f"a test of {steps:,} engine steps: at most {MAX_TEST_STEPS:,}"
    return None


def test_parts(m: Measurement) -> tuple[Measurement | None, Measurement | None]:
    """A test's prompt and decode parts: a ``pg`` test has both, its decode after its
    prompt's tokens; a ``pp`` / ``tg`` test is one of them."""
    if m.metric != "pg_tps":
        return (m, None) if m.metric == "pp_tps" else (None, m)
    return (replace(m, metric="pp_tps"),
            replace(m, metric="tg_tps", depth=m.depth + m.n_prompt))


def step_batches(m: Measurement) -> list[BatchShape]:
    """The engine steps of the measured test (module docstring; a ``pg`` test's prompt
    steps, then its decode steps: :func:`test_parts`)."""
    if m.metric == "pg_tps":
        return [b for part in test_parts(m) if part for b in step_batches(part)]
    if m.metric == "tg_tps":
        return [BatchShape(decode_context=(m.depth + j,) * m.batch) for j in range(m.n_gen)]
    u = m.n_ubatch or DEFAULT_UBATCH
    done = [0] * m.batch  # prompt tokens each sequence has been given so far
    steps, seq = [], 0
    while seq < m.batch:
        room, toks, ctx = u, [], []
        while room and seq < m.batch:
            take = min(room, m.n_prompt - done[seq])
            toks.append(take)
            ctx.append(m.depth + done[seq])
            done[seq] += take
            room -= take
            if done[seq] == m.n_prompt:
                seq += 1
        steps.append(BatchShape(prefill_tokens=tuple(toks), prefill_context=tuple(ctx)))
    return steps


def tokens_measured(m: Measurement) -> int:
    """Tokens the measured throughput counts (all sequences; a ``pg`` test both kinds)."""
    if m.metric == "pg_tps":
        return m.n_prompt + m.n_gen
    return m.batch * (m.n_gen if m.metric == "tg_tps" else m.n_prompt)


def setup_weights(s: Setup) -> WeightSplit:
    """The model's weights in the measured format, scaled to the file's printed size
    where the measurement gives it (a GGUF's tensor types differ from kvsim's uniform
    format by file: Gemma-3-4B QAT Q4_0 is 2.35 GiB where all-Q4_0 gives 2.03)."""
    w = model_weights(s.model, s.weight_format)
    return w if not s.file_bytes else w.scaled_to(s.file_bytes)


def latency_for(s: Setup, constants: SpeedConstants | None = None,
                rates: GpuRates | None = None) -> RooflineLatency:
    """The step-time model of a setup (``rates`` replaces the fitted ones)."""
    quant = cache_type(s.kv_type).quantized
    return RooflineLatency(
        gpu=s.gpu, host=load_host(DEFAULT_HOST), model=s.model,
        geometry=swa_read_geometry(kv_geometry(s.model, s.kv_type, s.kv_type), s.n_ubatch),
        weights=setup_weights(s), head_on_gpu=True,
        kv_quantized=quant,
        rates=rates or gpu_rates(s.gpu, s.model, s.weight_format, backend=s.backend,
                                 flash_attn=s.flash_attn, constants=constants,
                                 graphs=s.cuda_graphs, cublas_prompts=s.cublas_prompts))


def predicted_tps(m: Measurement, s: Setup, constants: SpeedConstants | None = None) -> float:
    """kvsim's tokens/s for the measured test."""
    lat = latency_for(s, constants)
    prompt, decode = test_parts(m)
    t = sum(lat.step_time_s(b) for b in step_batches(prompt)) if prompt else 0.0
    if decode:  # NOTE: step_batches' decode steps, priced at once
        t += float(np.sum(lat.decode_steps_s(np.full(decode.batch, decode.depth,
                                                     dtype=np.int64), decode.n_gen)))
    return tokens_measured(m) / t
