"""The interface every engine preset declares: what generic code may ask an engine.

Generic code (the simulator's build, the API, the policies, the latency model) asks
``engine_for(cfg.preset)`` instead of comparing preset names.

NOTE: an engine object is immutable behaviour, not configuration: the knobs a scenario
sets live in the engine's config model (kvsim.engines.config); methods that depend on a
knob take that config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

if TYPE_CHECKING:
    from kvsim.config.specs import GpuSpec, ModelSpec
    from kvsim.engines.memory import MemoryBudget
    from kvsim.model.geometry import KvGeometry


UbatchSplit = Callable[[Sequence[tuple[int, int]]], list[list[tuple[int, int]]]]
"""How an engine runs one step's batch as graphs, one after another (:meth:`Engine.
ubatch_split`): the batch as ``(slot, tokens)`` in the order the server adds them →
each graph as ``(index into the batch, tokens of that entry)``, in order."""

BudgetOf = Callable[[dict[str, Any]], "MemoryBudget"]
"""The load-time budget of the engine a knob mapping resolves to
(:meth:`Engine.release_defaults`' ``budget_of``)."""


class DeviceRule(NamedTuple):
    """Cards an engine does not run on: a vendor's architectures, and why (the engine's
    own requirement, with its source)."""

    vendor: str
    """Lower case, as ``GpuSpec.vendor`` lower-cased (``nvidia``)."""
    architectures: frozenset[str]
    """``GpuSpec.architecture`` values the rule refuses."""
    why: str


class ForeignKnob(NamedTuple):
    """A knob of a config family one of its engines lacks (a paged knob on the other
    paged engine, llama.cpp's ``ctx_size`` on Ollama): any value but ``unset`` is refused
    on it."""

    knob: str
    unset: Any
    """The value that leaves the knob unused."""
    instead: str
    """What the engine has instead (the refusal's words)."""


class Engine(Protocol):
    """One serving engine's behaviour as the simulator models it."""

    name: str
    """The preset name (``engine: {preset: ...}``)."""
    slot_family: bool
    """True: per-slot contexts allocated at load (llama.cpp, Ollama); False: a paged pool."""
    lays_out_gpus: bool
    """Its ``memory_budget`` lays out a box of several GPUs (``more_gpus``); False: the
    dispatcher (kvsim.engines.budget.memory_budget) refuses a box for it."""
    retract_order: str
    """The paged scheduler's victim order on preemption (kvsim.core.scheduler)."""
    truncates_prompt: bool
    """A prompt longer than a slot is truncated (Ollama) instead of refused."""
    caps_slot_at_training_context: bool
    """The server caps each slot at the model's training context (llama-server)."""
    op_offload: bool
    """Host-weight ops of a large ubatch may run on the GPU (kvsim.latency.offload)."""
    fresh_slots_from_last: bool
    """Of the slots never used, a task that finds no similar slot takes the last one
    (llama-server's least-recently-used scan keeps the last of equal times); False: the
    first (Ollama)."""
    host_kv_from_pool_ratio: bool
    """A host KV tier left unsized is a ratio of the device pool (SGLang HiCache), not
    LMCache's fixed default."""
    host_kv_chunked: bool
    """The host KV tier stores whole chunks and no decode KV (vLLM + LMCache)."""
    context_scope: Literal["pool", "slot", "request"]
    """What the engine's own context flag counts: all slots' cells (llama.cpp ``-c``, the
    config's ``ctx_size``; its ``context_tokens`` is one slot's share), one slot's (Ollama
    ``num_ctx``) or one request's (vLLM / SGLang ``max_model_len``); ``context_tokens`` is
    one session's on every engine (kvsim.engines.config, module NOTE)."""
    context_knob: str
    """The engine's own name for its context flag, as plan prints it."""
    seqs_flag: str
    """A paged engine's flag for the sequences admitted at once ('' on slot engines)."""
    unset_parallel_words: str
    """A paged engine's parallelism when none is given, a template of ``{n}`` = its
    max_num_seqs ('' on slot engines)."""
    settings: frozenset[str]
    """The optional settings this engine has, of ``flash_attn``, ``gpu_layers``,
    ``kv_unified``, ``gpu_util``, ``hybrid_kv``, ``ollama_version``, ``vllm_version``
    (kvsim fit refuses the others' flags)."""
    one_cache_type_flag: str
    """The one flag that sets the KV cache type of both K and V ('' where K and V have
    their own, llama.cpp ``-ctk``/``-ctv``)."""
    quant_v_needs_flash_attn: bool
    """The server refuses a quantized V cache without flash attention (llama-server),
    rather than silently using f16 (Ollama)."""
    context_above_model: Literal["refuse", "clamp", "allow"]
    """What the engine does with a context above the model's maximum."""
    fit_shrinks_context: bool
    """An unset context is the training context that ``--fit`` shrinks toward what fits
    (llama-server ``-c 0``)."""
    unset_context_words: str
    """What an unset context becomes when no model decides it ('': the model's own
    default does, kvsim.engines.resolve.engine_for_gpu)."""
    one_cache_type_section: str
    """The docs/reference/engines.md section of ``one_cache_type_flag`` ('' without one)."""
    foreign_knobs: tuple[ForeignKnob, ...]
    """The knobs of the engine's config family this engine lacks (vLLM's swap space on
    SGLang, SGLang's --max-total-tokens on vLLM, llama.cpp's -c on Ollama); () where it has
    them all."""
    ignores_quant_cache_without_flash_attn: bool
    """Without flash attention a quantized KV cache type is ignored and the cache is f16
    (Ollama, docs/reference/engines.md §4.1), rather than refused."""
    shifts_mla_context: bool
    """Context shift works on MLA (DeepSeek2-family) models; False: it is off for them
    whatever the scenario says (Ollama, §4.5)."""
    max_tokens_margin: int | None
    """A paged engine refuses (HTTP 400) a request whose prompt + max_tokens exceeds
    max_model_len minus this: vLLM 0, SGLang 1 (it refuses a total equal to the context
    too); None: the output stops at the context instead.  kvsim's clients send max_tokens
    = the turn's output tokens, as ``kvsim replay`` does."""
    max_parallel: int
    """The most sequences served at once (``parallel`` / ``max_num_seqs``); more is refused
    with :attr:`max_parallel_why`."""
    max_parallel_why: str
    """Why :attr:`max_parallel` is the bound: the engine's own limit, or kvsim's planning
    range where the engine sets none."""
    hybrid_off_with_kv_connector: bool
    """A host KV tier (a KV connector) turns the hybrid KV cache manager off, and asking
    for it there is refused (vLLM, docs/reference/engines.md §1.6-§1.7)."""

    def check_release(self, version: str | None) -> None:
        """Refuse a slot config's ``ollama_version`` the engine cannot follow (InputError):
        a malformed release on Ollama, any release on an engine without one."""
        ...

    def check_device(self, gpu: GpuSpec) -> None:
        """Refuse a card the engine does not run on (InputError naming ``engine``; the
        engine's ``refuses_devices`` rules, e.g. vLLM on a Pascal card)."""
        ...

    def check_gpus(self, cfg: Any, n_gpus: int) -> None:
        """Refuse knobs that disagree with the box's ``n_gpus`` cards (InputError): vLLM /
        SGLang tensor x pipeline parallel sizes, llama.cpp's tensor split and main GPU,
        split knobs Ollama does not take (kvsim.engines._gpu_checks)."""
        ...

    def split_defaults(self, given: dict[str, Any], n_gpus: int) -> dict[str, Any]:
        """The split knobs a config that sets none gets on a box of ``n_gpus`` cards
        (vLLM / SGLang: one tensor-parallel rank per GPU over the pipeline stages
        ``given``; {} for one GPU and for the slot engines, whose defaults already
        spread the layers)."""
        ...

    def gpu_defaults(self, gpu: GpuSpec, model: ModelSpec | None,
                     given: set[str], ranks: tuple[int, int] = (1, 1)) -> dict[str, Any]:
        """The knobs the engine derives from the GPU and (when known) the model, for
        resolving a preset on ``gpu``; the caller's ``given`` knobs win over them.
        ``ranks``: a paged engine's (tensor, pipeline) parallel sizes on the box (SGLang
        reserves more per rank).

        NOTE: includes the context the engine takes when none is ``given`` and the model
        is known (its maximum per request; llama-server's training context for --fit)."""
        ...

    def release_defaults(self, merged: dict[str, Any], given: set[str],
                         gpu: GpuSpec | None, model: ModelSpec | None, weights: str | None,
                         budget_of: BudgetOf, more_gpus: tuple[GpuSpec, ...] = ()
                         ) -> dict[str, Any]:
        """The knobs the engine's release derives for those not in ``given`` ({} for an
        engine without releases; Ollama's, kvsim.engines.ollama_releases).  ``merged`` is
        the preset with the overrides; ``budget_of`` gives the load-time budget of a knob
        mapping on ``gpu`` / ``model`` / ``weights`` (only where all three are known) and the
        box's ``more_gpus``."""
        ...

    def memory_budget(self, gpu: GpuSpec, model: ModelSpec, weights: str, cfg: Any,
                      driver: int, display: int, parallel: int,
                      more_gpus: tuple[GpuSpec, ...] = ()) -> MemoryBudget:
        """The load-time memory layout of config ``cfg`` (driver and display reserves in
        bytes, per GPU; ``parallel``: full-length sequences a paged pool should hold,
        ignored by slot engines, which take it from ``cfg``; ``more_gpus``: the box's
        other GPUs after ``gpu``, CUDA device 0).  A layout over several GPUs fills
        ``MemoryBudget.devices``; an engine that cannot lay one out raises InputError."""
        ...

    def null_block(self, cfg: Any) -> bool:
        """The paged pool reserves one block that holds no KV (vLLM v1)."""
        ...

    def unified_pool(self, cfg: Any) -> bool:
        """All slots share one pool (llama.cpp ``-kvu``)."""
        ...

    def ubatch_split(self, cfg: Any) -> UbatchSplit | None:
        """How a slot engine with config ``cfg`` splits one step's batch into graphs run
        one after another (llama.cpp's ubatches), or None: every step is one graph."""
        ...

    def attention_geometry(self, cfg: Any, geo: KvGeometry) -> KvGeometry:
        """``geo`` as the engine's attention kernels read it with config ``cfg`` (the
        latency model's KV reads and attended pairs): ``geo`` itself unless a kernel
        walks more cells than a layer's window (llama.cpp's SWA ring)."""
        ...

    def graph_max_tokens(self, cfg: Any, gpu: GpuSpec) -> int:
        """The largest step (in tokens) the engine replays as a captured CUDA graph
        instead of launching its kernels one by one (the latency model's per-step
        overhead, kvsim.latency.roofline)."""
        ...

    def read_startup_log(self, text: str, name: str = "log") -> dict[str, object]:
        """The capacity facts this engine printed in one startup's log ``text``, as
        :class:`kvsim.engines.startup_log.LogFacts` fields ({} where it printed none of
        its lines; ``name`` names the log in errors)."""
        ...

    def log_scenario_keys(self, facts: dict[str, Any]) -> dict[str, Any]:
        """The engine knobs (without ``engine.``) that reproduce a startup's layout from
        the facts :meth:`read_startup_log` read of it ({} where none pins anything)."""
        ...

    def startup_run(self, text: str, start: str, facts: dict[str, Any]) -> dict[str, Any]:
        """What a start-up log says the engine ran (kvsim.engines.startup_run): ``version``,
        ``gpu``, ``model``, ``weights``, ``settings`` (by the engine's own knob names),
        ``figure_text`` (the lines its figures are read from), and where printed
        ``vram_total`` and ``date``; ``text`` the whole log, ``start`` its last start-up,
        ``facts`` :meth:`read_startup_log`'s of it."""
        ...

    def launch_command(self, s: Any) -> str:
        """The command that starts the real engine with scenario ``s``'s settings (what
        ``kvsim plan`` prints)."""
        ...

    def launch_notes(self, s: Any) -> list[str]:
        """What :meth:`launch_command` cannot say by itself: which model file or
        checkpoint to serve ([] when the command says it all)."""
        ...
