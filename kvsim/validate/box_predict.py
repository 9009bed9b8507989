"""kvsim's prediction of a llama-bench test that ran on several GPUs: the box laid out and
timed as ``kvsim simulate`` lays out and times a llama.cpp box.

:func:`several_gpus` says whether a measurement names more than one device (llama-bench's
``gpu_info`` lists them, "2x RTX 3090" counts them); :func:`box_setup` resolves each card
and the row's split (``-sm layer`` by default, ``-ts``, ``-mg``), checking the model,
format and test as one card would (:func:`kvsim.validate.predict.setup_for`);
:func:`box_tps` lays the box out with llama.cpp's load-time arithmetic as ``kvsim
simulate`` does (:func:`kvsim.core.build.scenario_budget`: each card's layers, KV and
compute buffers; a box that cannot hold the model is an InputError) and prices
the test's steps (:func:`kvsim.validate.predict.step_batches`) with the box's latency model
(:mod:`kvsim.latency.multi_gpu`: each card's share at its own fitted rates, the
activation copy between stages over the scenario's default link, a prompt's micro-batches
pipelined through a layer split).

NOTE: every layer on the GPUs (``-ngl 99``) unless the row gives ``-ngl`` (``-1``: fitted
to memory as ``kvsim simulate`` does); the link is the one ``kvsim simulate`` takes
for the box (kvsim.config.gpu_set: the cards' PCIe slots); no measured multi-GPU row is in
any fit, so these predictions rest on the single-card constants and the link's model alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvsim.config.catalog import load_gpu
from kvsim.config.gpu_names import gpu_profiles, printed_parts, resolve_gpu
from kvsim.config.gpu_set import gpu_set_label
from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.errors import InputError
from kvsim.latency.backend import BACKENDS, SpeedConstants, cuda_graphs, gpu_rates
from kvsim.latency.roofline import GpuRates
from kvsim.validate.predict import setup_for, step_batches, tokens_measured
from kvsim.validate.records import Measurement, Skipped

SPLIT_MODES = ("layer", "row", "none")
ALL_LAYERS = 999
"""llama-bench's ``-ngl 99`` (its default until ``-ngl -1`` in 2026): every layer on the
GPUs, whatever memory is left; ``-ngl -1`` fits the layers to memory (kvsim's auto)."""


@dataclass(frozen=True)
class BoxSetup:
    """What a several-GPU measurement ran: its cards in device order, and the rest of
    one card's :class:`kvsim.validate.predict.Setup` with llama.cpp's split knobs."""

    gpus: tuple[GpuSpec, ...]
    model: ModelSpec
    weight_format: str
    backend: str
    flash_attn: bool
    kv_type: str
    n_ubatch: int
    n_batch: int
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] | None = None
    main_gpu: int = 0
    graphs_since: str = "volta"
    cublas_prompts: bool = False

    @property
    def gpu_label(self) -> str:
        """``2x rtx-3090``, ``rtx-3090+rtx-3060-12gb`` (kvsim.config.gpu_set)."""
        return gpu_set_label([g.name for g in self.gpus])


def several_gpus(m: Measurement) -> bool:
    """Whether ``m`` names more than one device (a count, or a list of names)."""
    return m.n_gpus > 1 or resolve_gpu(m.gpu).count > 1


def _cards(m: Measurement) -> tuple[GpuSpec, ...] | Skipped:
    """Each device ``m`` names, in order: the parts of a printed list (a part may carry a
    count, "2x RTX 3090"; a remark, "128 GB unified", names none)."""
    cards: list[GpuSpec] = []
    for part in printed_parts(m.gpu):
        g = resolve_gpu(part)
        if g.count == 0:
            continue
        if g.slug is None:
            return Skipped(m.id, g.reason)
        try:
            names = gpu_profiles(part, "gpu")
        except InputError as e:
            return Skipped(m.id, e.allowed)
        cards += [n if isinstance(n, GpuSpec) else load_gpu(n) for n in names]
    return tuple(cards)


def box_setup(m: Measurement, *, model: ModelSpec | None = None) -> BoxSetup | Skipped:
    """Resolve ``m``'s cards and split (module docstring), or say why it cannot be
    predicted."""
    if m.backend not in BACKENDS:
        return Skipped(m.id, f"backend {m.backend!r}: kvsim predicts GPU backends "
                       f"({', '.join(BACKENDS)}) on several GPUs")
    cards = _cards(m)
    if isinstance(cards, Skipped):
        return cards
    split = _split(m, len(cards))
    if isinstance(split, str):
        return Skipped(m.id, split)
    one = setup_for(m, gpu=cards[0], model=model)
    if isinstance(one, Skipped):
        return one
    return BoxSetup(cards, one.model, one.weight_format, one.backend, one.flash_attn,
                    one.kv_type, one.n_ubatch, m.n_batch or 2048, *split,
                    graphs_since=m.cuda_graphs_since, cublas_prompts=m.cublas_prompts)


def _split(m: Measurement, n: int) -> tuple[str, tuple[float, ...] | None, int] | str:
    """(split mode, tensor split, main GPU) of ``m`` on ``n`` cards, or why not."""
    mode = (m.split_mode or "layer").lower()
    if mode not in SPLIT_MODES:
        return (f"split mode {m.split_mode!r}: kvsim lays out llama.cpp's "
                f"{', '.join(SPLIT_MODES)}")
    ts = m.tensor_split
    if ts is not None and len(ts) != n:
        return f"tensor split {'/'.join(f'{x:g}' for x in ts)}: one share per GPU ({n})"
    if not 0 <= m.main_gpu < n:
        return f"main GPU {m.main_gpu}: 0 to {n - 1}"
    return mode, ts, m.main_gpu


def box_tps(m: Measurement, s: BoxSetup, constants: SpeedConstants | None = None) -> float:
    """kvsim's tokens/s for the measured test on the box (module docstring); InputError
    where llama.cpp would not load it there (kvsim's own words)."""
    from kvsim.core.build import scenario_budget
    from kvsim.latency.factory import box_model
    from kvsim.scenario import resolve_scenario

    sc = resolve_scenario(_scenario(m, s))
    budget = scenario_budget(sc)
    lat = box_model(sc, budget, _rates_of(s, constants))
    # NOTE: llama_decode takes up to n_batch prompt tokens a call, which a pipelined
    # layer split runs ubatch by ubatch through its stages (MultiGpuLatency.ubatch,
    # step_time_s); otherwise each ubatch is a step, as on one card
    calls = replace(m, n_ubatch=max(s.n_batch, s.n_ubatch)) if lat.ubatch else m
    return tokens_measured(m) / sum(lat.step_time_s(b) for b in step_batches(calls))


def _rates_of(s: BoxSetup, constants: SpeedConstants | None
              ) -> Callable[[GpuSpec], GpuRates]:
    def rates(g: GpuSpec) -> GpuRates:
        return gpu_rates(g, s.model, s.weight_format, backend=s.backend,
                         flash_attn=s.flash_attn, constants=constants,
                         graphs=cuda_graphs(g, s.backend, s.graphs_since),
                         cublas_prompts=s.cublas_prompts)
    return rates


def _scenario(m: Measurement, s: BoxSetup) -> dict[str, object]:
    """The scenario ``kvsim simulate`` would run this box as: llama-bench's context
    (prompt + generated + depth tokens, one sequence a test)."""
    engine: dict[str, object] = {
        "preset": "llama.cpp", "parallel": 1,
        "ctx_size": max(m.n_prompt + m.n_gen + m.depth, 1) * m.batch,
        "n_ubatch": s.n_ubatch, "n_batch": max(s.n_batch, s.n_ubatch),
        "flash_attn": s.flash_attn, "cache_type_k": s.kv_type, "cache_type_v": s.kv_type,
        "split_mode": s.split_mode, "main_gpu": s.main_gpu}
    if m.gpu_layers is None or m.gpu_layers >= 0:  # NOTE: -1 is llama-bench's fit: auto
        engine["gpu_layers"] = ALL_LAYERS if m.gpu_layers is None else m.gpu_layers
    if s.tensor_split is not None:
        engine["tensor_split"] = list(s.tensor_split)
    # NOTE: a scenario needs a workload; this one is laid out and timed, never run
    return {"gpu": [g.name for g in s.gpus], "model": s.model.name,
            "weights": s.weight_format, "engine": engine,
            "latency": {"kind": "roofline", "backend": s.backend},
            "workload": {"preset": "family-4"}}
