"""Field defaults shared by the engine objects, and the defaults their traits imply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kvsim.engines._gpu_checks import check_parallel_sizes, check_split
from kvsim.engines.base import BudgetOf, DeviceRule, ForeignKnob, UbatchSplit
from kvsim.errors import InputError

if TYPE_CHECKING:
    from kvsim.config.specs import GpuSpec, ModelSpec
    from kvsim.model.geometry import KvGeometry


@dataclass(frozen=True)
class EngineTraits:
    """The plain :class:`kvsim.engines.base.Engine` fields; each engine module builds its
    own instance (or subclass, where a method depends on a knob)."""

    name: str
    slot_family: bool
    lays_out_gpus: bool = False
    retract_order: str = "newest"
    truncates_prompt: bool = False
    caps_slot_at_training_context: bool = False
    op_offload: bool = False
    fresh_slots_from_last: bool = False
    host_kv_from_pool_ratio: bool = False
    host_kv_chunked: bool = False
    context_scope: Literal["pool", "slot", "request"] = "request"
    context_knob: str = "max_model_len"
    seqs_flag: str = ""
    unset_parallel_words: str = ""
    settings: frozenset[str] = frozenset()
    one_cache_type_flag: str = ""
    quant_v_needs_flash_attn: bool = False
    context_above_model: Literal["refuse", "clamp", "allow"] = "refuse"
    fit_shrinks_context: bool = False
    unset_context_words: str = ""
    one_cache_type_section: str = ""
    foreign_knobs: tuple[ForeignKnob, ...] = ()
    refuses_devices: tuple[DeviceRule, ...] = ()
    ignores_quant_cache_without_flash_attn: bool = False
    shifts_mla_context: bool = True
    hybrid_off_with_kv_connector: bool = False
    max_tokens_margin: int | None = None
    max_parallel: int = 65536
    max_parallel_why: str = ("kvsim's planning range: the engine sets no limit, and one GPU's "
                             "KV pool holds far fewer sequences")

    def null_block(self, cfg: Any) -> bool:
        return False

    def unified_pool(self, cfg: Any) -> bool:
        return False

    def ubatch_split(self, cfg: Any) -> UbatchSplit | None:
        return None

    def attention_geometry(self, cfg: Any, geo: KvGeometry) -> KvGeometry:
        return geo

    def graph_max_tokens(self, cfg: Any, gpu: GpuSpec) -> int:
        """ggml-cuda captures one-token steps only (kvsim.latency.backend.cuda_graphs):
        llama.cpp and Ollama's runners."""
        return 1

    def read_startup_log(self, text: str, name: str = "log") -> dict[str, object]:
        return {}

    def log_scenario_keys(self, facts: dict[str, Any]) -> dict[str, Any]:
        return {}

    def startup_run(self, text: str, start: str, facts: dict[str, Any]) -> dict[str, Any]:
        return {}

    def split_defaults(self, given: dict[str, Any], n_gpus: int) -> dict[str, Any]:
        if self.slot_family or n_gpus == 1 or "tensor_parallel_size" in given:
            return {}
        pp = given.get("pipeline_parallel_size", 1)
        ok = isinstance(pp, int) and not isinstance(pp, bool) and pp > 0 and n_gpus % pp == 0
        return {"tensor_parallel_size": n_gpus // pp} if ok else {}

    def check_device(self, gpu: GpuSpec) -> None:
        for rule in self.refuses_devices:
            if gpu.vendor.lower() == rule.vendor and gpu.architecture in rule.architectures:
                raise InputError("engine", self.name, f"does not run on {gpu.name} "
                                 f"({gpu.display_name}, {gpu.architecture}): {rule.why}")

    def check_gpus(self, cfg: Any, n_gpus: int) -> None:
        if self.slot_family:
            check_split(cfg, n_gpus)
        else:
            check_parallel_sizes(cfg, n_gpus)

    def check_release(self, version: str | None) -> None:
        if version is not None:
            raise InputError("ollama_version", version, "not a knob of the "
                             f"{self.name} preset (only ollama has a release to follow)")

    def gpu_defaults(self, gpu: GpuSpec, model: ModelSpec | None,
                     given: set[str], ranks: tuple[int, int] = (1, 1)) -> dict[str, Any]:
        """The context an unset ``context_tokens`` (and ``ctx_size``) takes with a known
        model: the model's maximum per request (vLLM / SGLang ``max_model_len``,
        docs/reference/engines.md §1.1), llama-server's ``-c 0`` = the training context
        that --fit shrinks (§3.1, §3.6: ``ctx_size``, the slots' share of it their
        ``context_tokens``); an engine counting one slot (Ollama) leaves it to its
        release."""
        if model is None or given & {"context_tokens", "ctx_size"}:
            return {}
        if self.context_scope == "request":
            return {"context_tokens": model.max_context_tokens}
        if self.fit_shrinks_context:
            return {"ctx_size": model.max_context_tokens, "fit_context": True}
        return {}

    def release_defaults(self, merged: dict[str, Any], given: set[str],
                         gpu: GpuSpec | None, model: ModelSpec | None, weights: str | None,
                         budget_of: BudgetOf, more_gpus: tuple[GpuSpec, ...] = ()
                         ) -> dict[str, Any]:
        return {}
