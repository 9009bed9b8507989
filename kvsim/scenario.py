"""Scenario: everything one simulation run needs, resolved and frozen.

A scenario YAML names profiles (``gpu: rtx-4090``, ``model: llama-3.1-8b``), an
engine preset with overrides, a workload (household preset or trace file), a
latency model, KV policies and simulation options.  Loading resolves every name
to its frozen profile so the saved ``scenario.json`` is self-contained, and
:func:`scenario_hash` is a stable digest of that resolved form (what sweeps key
their result store on).  It is a layer of its own, above ``policies`` and ``metrics``
whose configs it holds and below the tools that take it (docs/layout.md); the workload
section the simulator reads is :mod:`kvsim.config.workload`.

NOTE: the hash covers the resolved configuration, not the file it came from —
two YAML files that resolve to the same scenario share a hash; ``name`` and
``description`` are labels and do not enter it, nor does ``host_default`` (whether the
host was named; the host it resolved to does), nor ``slo`` (targets the verdicts judge
the run against, not an input of it).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvsim.config.catalog import (
    bundled_path,
    check_host_matches,
    default_host,
    load_gpu,
    load_gpu_link,
    load_host,
    load_link,
    load_model,
)
from kvsim.config.files import no_such_file, parse_yaml, read_yaml
from kvsim.config.gpu_set import check_gpu_link, default_gpu_link, gpu_items
from kvsim.config.slo import slo_section
from kvsim.config.specs import GpuLinkSpec, GpuSpec, HostSpec, LinkSpec, ModelSpec
from kvsim.config.units import Bytes, FrozenModel, Seconds
from kvsim.config.workload import WorkloadConfig
from kvsim.engines import engine_for
from kvsim.engines.config import EngineConfig, PagedEngineConfig, stale_context
from kvsim.engines.resolve import engine_for_gpu
from kvsim.errors import InputError, from_validation_error
from kvsim.latency.config import LatencyConfig, RooflineConfig
from kvsim.metrics.accuracy import AccuracyConfig
from kvsim.model.names import model_slug
from kvsim.policies import PolicyConfig

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class SimOptions(FrozenModel):
    model_config = _FROZEN
    fidelity: Literal["fast", "step"] = "fast"
    # NOTE: a floor, not a bound on memory (the sampler rests while the engine is idle,
    # and a run's memory is guarded by max_rss_bytes): finer than any engine step
    sample_interval_s: Seconds = Field(1.0, ge=1e-4, description="memory sampling tick")
    max_sim_time_s: Seconds | None = Field(None, gt=0, description="stop the clock here")
    max_rss_bytes: Bytes | None = Field(
        None, gt=0, description="stop the run (results kept) when the process memory "
        "passes this; default: half the machine's RAM")


class Scenario(FrozenModel):
    """A fully resolved, frozen scenario."""

    model_config = _FROZEN

    name: str = "scenario"
    description: str = ""
    seed: int = Field(0, ge=0)
    gpu: GpuSpec = Field(description="the first GPU (CUDA device 0); the only one unless "
                         "more_gpus names others")
    more_gpus: tuple[GpuSpec, ...] = Field(
        (), description="the box's other GPUs in device order (a scenario writes them all "
        "in 'gpu': a list, 2x NAME or NAME+NAME; kvsim.config.gpu_set)")
    gpu_link: GpuLinkSpec | None = Field(
        None, description="the link between the GPUs (gpu_links profile); None with one GPU")
    model: ModelSpec
    weights: str = Field("q4_k_m", description="weight format, e.g. bf16, q8_0, q4_k_m")
    engine: EngineConfig
    link: LinkSpec | None = None
    host: HostSpec
    host_default: bool = Field(
        False, description="true when the scenario named no host: the host is then the "
        "GPU's own memory on a unified-memory machine, else DEFAULT_HOST, and it follows "
        "the GPU when the scenario is resolved again on another card")
    driver_reserve_bytes: Bytes = Field(400 * 2**20, ge=0, description="CUDA context etc.")
    display_reserve_bytes: Bytes = Field(0, ge=0, description="desktop / other processes")
    workload: WorkloadConfig
    latency: LatencyConfig = Field(default_factory=RooflineConfig)
    policies: tuple[PolicyConfig, ...] = Field(
        (), description="KV policies (kvsim.policies): a list of mappings with a 'kind'")
    accuracy: AccuracyConfig = Field(default_factory=AccuracyConfig,
                                     description="recall-proxy multipliers (kv-policies §6.4)")
    sim: SimOptions = Field(default_factory=SimOptions)
    slo: dict[str, str] = Field(
        default_factory=dict, description="latency targets the verdicts judge, e.g. "
        "{ttft_p95: 2s, itl_p95: 150ms} (as --slo); a judgment, not an input of the run: "
        "not in the hash")

    _slo = field_validator("slo", mode="before")(slo_section)

    @field_validator("latency", mode="before")
    @classmethod
    def _latency_kind(cls, v: Any) -> Any:
        if isinstance(v, dict) and "kind" not in v:
            raise InputError("kind", "missing", "a latency section needs a kind: one of "
                             "roofline, calibrated, constant")
        return v

    @property
    def gpus(self) -> tuple[GpuSpec, ...]:
        """Every GPU of the box, device 0 first."""
        return (self.gpu, *self.more_gpus)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        for g in self.gpus:
            check_reserves(g, self.driver_reserve_bytes, self.display_reserve_bytes)
        _check_gpu_set(self)
        check_host_matches(self.gpu, self.host)
        _check_host_swap(self)
        return self


def check_reserves(gpu: GpuSpec, driver_reserve_bytes: int, display_reserve_bytes: int,
                   fields: tuple[str, str] = ("driver_reserve_bytes", "display_reserve_bytes"),
                   display_value: Any = None) -> None:
    """The driver and display reserves must leave some of the GPU to the engine;
    ``fields`` name them as the caller's input does (a scenario's keys, fit's flags)."""
    if driver_reserve_bytes + display_reserve_bytes >= gpu.usable_memory_bytes:
        shown = display_reserve_bytes if display_value is None else display_value
        raise InputError(fields[1], shown,
                         f"plus {fields[0]} ({driver_reserve_bytes}) must be less "
                         f"than the GPU's {gpu.usable_memory_bytes} bytes ({gpu.name})")


def _check_gpu_set(s: Scenario) -> None:
    """The engine's split knobs agree with the GPUs named; the link is one they can have."""
    engine_for(s.engine.preset).check_gpus(s.engine, len(s.gpus))
    if s.gpu_link is not None and not s.more_gpus:
        raise InputError("gpu_link", s.gpu_link.name, "a GPU link needs two or more GPUs "
                         "(gpu: 2x NAME, NAME+NAME or a list)")
    if s.gpu_link is not None:
        check_gpu_link(s.gpus, s.gpu_link)


def _check_host_swap(s: Scenario) -> None:
    swap = getattr(s.engine, "swap_space_bytes", 0)
    if swap > s.host.memory_bytes:
        raise InputError("engine.swap_space_bytes", swap, f"at most the host's RAM "
                         f"({s.host.memory_bytes} bytes, {s.host.name}): vLLM pins it in host "
                         "memory")


def apply_overrides(raw: dict[str, Any], sets: list[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides (values parsed as YAML); a number indexes
    a list the scenario already has (``policies.0.window_tokens=4096``).  A key of a
    section sets that key in the section the scenario has: ``latency.KEY`` on a scenario
    without a latency section sets it in the default ``{kind: roofline}``.  Setting
    ``workload.trace`` drops ``workload.preset`` (and the reverse), ``engine.context_tokens``
    drops ``engine.ctx_size`` (and the reverse; kvsim.engines.config.stale_context)."""
    out = copy.deepcopy(raw)
    for item in sets:
        if "=" not in item:
            raise InputError("--set", item, "expected dotted.key=value")
        key, _, text = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise InputError("--set", item, "expected dotted.key=value")
        try:
            value = parse_yaml(text, "--set", item) if text.strip() else ""
        except InputError:
            value = text
        if parts[0] == "latency" and len(parts) > 1 and out.get("latency") is None:
            # NOTE: the section a scenario without one has (Scenario.latency's default), so
            # that latency.KEY=… merges into it, keeping its kind, as engine.KEY=… does
            out["latency"] = {"kind": RooflineConfig().kind}
        if parts[0] == "workload" and len(parts) > 1 and isinstance(out.get("workload"), str):
            out["workload"] = _workload_section(out["workload"])
        node: Any = out
        for p, below in itertools.pairwise(parts):
            node = _descend(node, p, below, key)
        if isinstance(node, list):
            node[_list_index(node, parts[-1], key)] = value
        else:
            node[parts[-1]] = value
            drop_rival_key(node, parts)
    return out


# NOTE: a workload is a household preset or a trace: setting one replaces the other
_OTHER_SOURCE = {"trace": "preset", "preset": "trace"}


def _workload_section(name: str) -> dict[str, Any]:
    """``workload: NAME`` as its section: a trace file or a household preset."""
    return {"trace": name} if name.endswith((".jsonl", ".parquet")) else {"preset": name}


def drop_rival_key(node: dict[str, Any], parts: list[str]) -> None:
    """After dotted key ``parts`` was set in ``node`` (its section), drop the key it
    replaces: ``workload.trace`` / ``workload.preset`` each other, an engine context the
    other (kvsim.engines.config.stale_context).  One rule for ``--set`` and sweep keys."""
    if len(parts) == 2 and parts[0] == "workload" and parts[1] in _OTHER_SOURCE:
        node.pop(_OTHER_SOURCE[parts[1]], None)
    if len(parts) == 2 and parts[0] == "engine":
        node.pop(stale_context(node, {parts[1]}) or "", None)


LIST_KEYS = ("policies",)  # scenario keys whose value is a list


def _descend(node: dict[str, Any] | list[Any], p: str, below: str,
             key: str) -> dict[str, Any] | list[Any]:
    """The mapping or list at ``p`` under ``node``, ``below`` being the next key part (a
    missing mapping is created; an engine named by preset becomes ``{preset: name}``)."""
    if isinstance(node, list):
        child = node[_list_index(node, p, key)]
    else:
        child = node.get(p)
        if isinstance(child, str) and p == "engine":
            child = {"preset": child}
        if child is None and below.isdigit():
            raise InputError("--set", key, f"'{p}' has no list in this scenario to index; "
                             f"set the whole list ({p}=[...])")
        if child is None and p in LIST_KEYS:
            raise InputError("--set", key, f"'{p}' is a list: {p}.N.KEY sets a key of its "
                             f"item N, {p}=[...] the whole list")
        if child is None:
            child = {}
        node[p] = child
    if not isinstance(child, (dict, list)):
        raise InputError("--set", key, f"'{p}' is not a mapping or list in this scenario")
    return child


def _list_index(node: list[Any], p: str, key: str) -> int:
    if not p.isdigit() or int(p) >= len(node):
        have = f"0..{len(node) - 1}" if node else "none: the list is empty"
        raise InputError("--set", key, f"'{p}' must be an item number of the list there "
                         f"({have}); set the whole list to add items")
    return int(p)


def _resolve_named(raw: dict[str, Any], key: str, loader: Any) -> Any:
    value = raw.get(key)
    return loader(value) if isinstance(value, str) else value


def _resolve_host(data: dict[str, Any], gpu: Any) -> dict[str, Any]:
    """``host`` and ``host_default``: a named (or inline) host as given; none named, the
    GPU's default (kvsim.config.catalog.default_host).  A resolved scenario dumped with
    ``host_default: true`` gets its host again from its (maybe changed) GPU, so a card
    swapped in (``kvsim compare --gpus``) brings its own memory; naming a host pins it."""
    host = data.get("host")
    if host is None or (isinstance(host, dict) and data.get("host_default") is True):
        if not isinstance(gpu, GpuSpec):
            return {"host_default": True}  # NOTE: the GPU's own error comes first
        return {"host": default_host(gpu), "host_default": True}
    return {"host": _resolve_named(data, "host", load_host), "host_default": False}


def _validated(value: Any, spec: type[BaseModel], field: str) -> Any:
    """An inline profile (a mapping) as its spec; a loaded one as it is; anything else
    (a number, a list) is an InputError."""
    if isinstance(value, spec):
        return value
    if not isinstance(value, dict):
        raise InputError(field, value, f"a {field} profile name (kvsim profiles list "
                         f"{field}s) or an inline mapping of its keys")
    try:
        return spec.model_validate(value)
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=field) from None


def resolve_scenario(raw: dict[str, Any], base_dir: Path | None = None) -> Scenario:
    """Resolve profile names and engine presets in a raw mapping → :class:`Scenario`."""
    data = dict(raw)
    for key in ("gpu", "model"):
        if key not in data:
            raise InputError(key, None, f"a scenario needs '{key}'")
    for key in ("gpu", "model", "host", "link", "gpu_link"):
        data[key] = _profile_beside(data.get(key), base_dir) if key in data else None
        if data[key] is None:
            del data[key]
    data.update(_resolve_gpus(data))
    data["model"] = _resolve_named(data, "model",
                                   lambda name: load_model(model_slug(name, "model")))
    gpu = data["gpu"]
    data.update(_resolve_host(data, gpu))
    link_name = data.get("link", getattr(gpu, "default_link", None))
    data["link"] = load_link(link_name) if isinstance(link_name, str) else link_name
    model = data["model"] = _validated(data["model"], ModelSpec, "model")
    data["engine"] = engine_for_gpu(data.get("engine", "llama.cpp"), gpu, model,
                                    weights=data.get("weights", "q4_k_m"),
                                    more_gpus=tuple(data["more_gpus"]))
    wl = data.get("workload")
    if isinstance(wl, str):
        wl = _workload_section(wl)
    data["workload"] = _beside(wl, "trace", base_dir)
    if "latency" in data:
        data["latency"] = _beside(data["latency"], "path", base_dir)
        data["latency"] = _beside(data["latency"], "constants", base_dir)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, model=Scenario) from None
    return _hybrid_manager_rule(scenario)


def _resolve_gpus(data: dict[str, Any]) -> dict[str, Any]:
    """``gpu``, ``more_gpus`` and ``gpu_link`` from the scenario's ``gpu`` (one card or a
    set, kvsim.config.gpu_set) and ``gpu_link`` (a name, an inline link, or unset: the
    cards' default link)."""
    more = data.get("more_gpus") or []
    if not isinstance(more, list | tuple):
        raise InputError("more_gpus", more, "a list of GPU profiles (or name them all in "
                         "'gpu': 2x NAME, NAME+NAME or a list)")
    items = gpu_items([*gpu_items(data["gpu"]), *more])
    gpus = tuple(_validated(load_gpu(g) if isinstance(g, str) else g, GpuSpec, "gpu")
                 for g in items)
    link = data.get("gpu_link", default_gpu_link(gpus))
    if isinstance(link, str):
        link = load_gpu_link(link)
    elif link is not None:
        link = _validated(link, GpuLinkSpec, "gpu_link")
    return {"gpu": gpus[0], "more_gpus": gpus[1:], "gpu_link": link}


def _beside(section: Any, key: str, base_dir: Path | None) -> Any:
    """``section`` with its relative file path ``key`` (a workload's trace, a calibrated
    latency's artifact) read beside the scenario file when it is there, else as given
    (from the current folder: a ``--set`` on a bundled scenario)."""
    if not isinstance(section, dict) or not isinstance(section.get(key), str) \
            or base_dir is None:
        return section
    p = Path(section[key])
    if p.is_absolute() or not (base_dir / p).exists():
        return section
    return {**section, key: str(base_dir / p)}


def _profile_beside(value: Any, base_dir: Path | None) -> Any:
    """A profile named by a relative ``.yaml`` path (``model: my-model.yaml``) read beside
    the scenario file when it is there, as a trace is; else as given."""
    if not isinstance(value, str) or not value.endswith((".yaml", ".yml")) or \
            base_dir is None or Path(value).is_absolute() or not (base_dir / value).is_file():
        return value
    return str(base_dir / value)


def _hybrid_manager_rule(s: Scenario) -> Scenario:
    """vLLM turns its hybrid KV cache manager off with a KV connector (a host KV tier,
    docs/reference/engines.md §1.6-§1.7); asked for there, it refuses.  (V0 swap: the engine's own
    settings, kvsim.model.hybrid.hybrid_off_reason.)"""
    eng = s.engine
    windowed = any(g.kind in ("sliding", "chunked") for g in s.model.layer_groups)
    if not isinstance(eng, PagedEngineConfig) or not windowed or not \
            engine_for(eng.preset).hybrid_off_with_kv_connector or not any(
                p.host_tier for p in s.policies):
        return s
    if eng.disable_hybrid_kv_cache_manager is True:
        return s
    if eng.disable_hybrid_kv_cache_manager is False:
        raise InputError("engine.disable_hybrid_kv_cache_manager", False,
                         "true or unset: vLLM turns the hybrid KV cache manager off with a "
                         "host KV tier (KV connector)")
    return s.model_copy(update={"engine": eng.model_copy(
        update={"disable_hybrid_kv_cache_manager": True})})


def load_scenario(path: str | Path, sets: list[str] | None = None) -> Scenario:
    """Load a scenario YAML (or a bundled scenario name) and apply ``--set`` overrides."""
    p = Path(path)
    if not p.is_file():
        if str(path).endswith((".yaml", ".yml")):
            raise no_such_file("scenario", path, "a scenario .yaml file")
        p = bundled_path("scenarios", str(path))
    raw = read_yaml(p, "scenario")
    return resolve_scenario(apply_overrides(raw, sets or []), base_dir=p.parent)


def scenario_hash(s: Scenario) -> str:
    """Stable sha256 (hex, 16 chars) of the resolved scenario without its labels."""
    labels = {"name", "description", "host_default", "slo"}
    # NOTE: a one-GPU scenario hashes as it did before several GPUs existed
    doc = s.model_dump(mode="json", exclude=labels | ({"more_gpus", "gpu_link"}
                                                      if not s.more_gpus else set()))
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
