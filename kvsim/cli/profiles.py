"""``kvsim profiles``: list, show and import catalogue profiles.

Answers "which GPUs, models, links, hosts and engine presets does kvsim know?" and
turns a local ``config.json`` or GGUF header into a model profile YAML.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from kvsim.cli._output import check_output, output_errors
from kvsim.config.catalog import KINDS, find_any, list_names, load_raw
from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.config.units import format_bytes
from kvsim.engines import engine_for
from kvsim.errors import InputError


def _console() -> Console:
    return Console(width=max(100, Console().width), soft_wrap=False)


def _gpu_row(d: dict[str, Any]) -> list[str]:
    return [d["name"], d["display_name"], format_bytes(d["memory_bytes"]),
            f"{d['memory_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s",
            f"{d['fp16_tensor_flops'] / 1e12:.0f}", d.get("default_link") or "unified"]


def _model_row(d: dict[str, Any]) -> list[str]:
    from kvsim.model.geometry import kv_geometry
    geo = kv_geometry(ModelSpec.model_validate(d), "f16", "f16", state_dtype="f16")
    kinds = "+".join(sorted({g["kind"] for g in d["layer_groups"]}))
    return [d["name"], f"{d['params_total'] / 1e9:.1f}B", str(d["num_layers"]), kinds,
            f"{geo.full_bytes_per_token / 1024:.1f} KiB", str(d["max_context_tokens"])]


def _link_row(d: dict[str, Any]) -> list[str]:
    return [d["name"], d["display_name"], f"{d['h2d_bytes_per_s'] / 1e9:g} GB/s",
            f"{d['latency_s'] * 1e6:g} µs"]


def _gpu_link_row(d: dict[str, Any]) -> list[str]:
    return [d["name"], d["display_name"], f"{d['bytes_per_s'] / 1e9:g} GB/s",
            f"{d['latency_s'] * 1e6:g} µs"]


def _host_row(d: dict[str, Any]) -> list[str]:
    return [d["name"], d["display_name"], format_bytes(d["memory_bytes"]),
            f"{d['memory_bandwidth_bytes_per_s'] / 1e9:g} GB/s", str(d["unified_with_gpu"])]


_MODEL_MAX = 987_654_321  # a marker maximum context no preset uses


def unset_context(preset: str) -> str:
    """What an unset ``engine.context_tokens`` becomes once a model is known, asked of
    :func:`kvsim.engines.resolve.engine_for_gpu` itself (a stand-in model whose maximum
    is a marker): "model max", "model max, --fit shrinks" (llama.cpp ``-c 0``) or the
    preset's own number, model or not; or the engine's own words where no model decides
    it (:attr:`kvsim.engines.base.Engine.unset_context_words`: Ollama's depends on the
    card's memory)."""
    from types import SimpleNamespace

    from kvsim.config.catalog import load_gpu
    from kvsim.engines.resolve import engine_for_gpu

    words = engine_for(preset).unset_context_words
    if words:
        return words
    model = SimpleNamespace(max_context_tokens=_MODEL_MAX, layer_groups=(), vision_encoder=None)
    eng = engine_for_gpu(preset, load_gpu("rtx-4090"), model)
    size = getattr(eng, "ctx_size", None)  # NOTE: llama.cpp's -c: the training context
    if (eng.context_tokens if size is None else size) != _MODEL_MAX:
        return str(eng.context_tokens)
    return "model max, --fit shrinks" if getattr(eng, "fit_context", False) else "model max"


def _engine_row(d: dict[str, Any]) -> list[str]:
    return [d.get("preset", ""), d.get("display_name", ""), d.get("allocator", ""),
            unset_context(d["preset"]), str(d.get("parallel", d.get("max_num_seqs", "")))]


_COLUMNS = {
    "gpus": (["name", "GPU", "memory", "bandwidth", "FP16 TFLOPS", "link"], _gpu_row),
    "models": (["name", "params", "layers", "layer kinds", "KV/token f16", "max ctx"],
               _model_row),
    "links": (["name", "link", "pinned H2D", "latency"], _link_row),
    "gpu_links": (["name", "GPU-to-GPU link", "per direction", "latency"], _gpu_link_row),
    "hosts": (["name", "host", "memory", "bandwidth", "unified"], _host_row),
    "engines": (["preset", "engine", "allocator", "context (unset)", "parallel / max seqs"],
                _engine_row),
}

CAPTIONS = {"engines": "context (unset): what an unset engine.context_tokens becomes once the "
            "model is known (llama.cpp: -c 0, the training context that --fit shrinks to "
            "fit, each session its slot's share)"}


@click.group()
def profiles() -> None:
    """Which GPUs, models, host links, GPU-to-GPU links, hosts and engine presets kvsim
    knows."""


@profiles.command("list")
@click.argument("kind", required=False)
def list_cmd(kind: str | None) -> None:
    """List profiles of KIND (gpus, models, links, gpu_links, hosts, engines), or all."""
    if kind is not None and kind not in KINDS:
        raise InputError("kind", kind, "one of " + ", ".join(KINDS))
    console = _console()
    for k in [kind] if kind else list(KINDS):
        headers, row = _COLUMNS[k]
        table = Table(title=f"{k} ({len(list_names(k))})", title_justify="left",
                      caption=CAPTIONS.get(k), caption_justify="left")
        # NOTE: the slug stays whole (it is what you type); the other columns wrap or
        # fold rather than being cut off, so every value is readable at 100 columns
        table.add_column(headers[0], no_wrap=True)
        for h in headers[1:]:
            table.add_column(h, overflow="fold")
        for name in list_names(k):
            table.add_row(*row(dict(load_raw(k, name))))
        console.print(table)


@profiles.command("show")
@click.argument("name")
def show_cmd(name: str) -> None:
    """Print a profile as YAML (with its KV geometry for models); a name that is a
    profile of several kinds (a GPU and a host, say) prints each, as separate YAML
    documents."""
    kinds = [k for k in KINDS if name.lower() in list_names(k)]
    if not kinds:
        kinds, found = _printed_name(name)
        if isinstance(found, GpuSpec):  # a unified-memory machine's smaller configuration
            click.echo(f"# gpu profile '{found.name}' (a configuration of a catalogue "
                       "profile, made from the name)")
            click.echo(yaml.safe_dump(found.model_dump(mode="json"), sort_keys=False,
                                      allow_unicode=True, width=100), nl=False)
            return
        name = found
    if not kinds:
        find_any(name)  # raises: unknown name, the closest ones
    for i, kind in enumerate(kinds):
        if i:
            click.echo("---")
        _show_one(kind, name, others=[k[:-1] for k in kinds if k != kind])


def _printed_name(name: str) -> tuple[list[str], str | GpuSpec]:
    """``(["gpus"], slug)`` or ``(["models"], slug)`` for a name as drivers, Hugging Face
    or Ollama print it (``NVIDIA GeForce RTX 4090``, ``qwen2.5:14b``); ``([], name)``
    when it names neither."""
    from kvsim.config.gpu_names import gpu_profiles
    from kvsim.model.names import model_slug

    gpus = gpu_profiles(name, "name")
    if len(gpus) == 1 and gpus[0] != name:
        return ["gpus"], gpus[0]
    model = model_slug(name, "name")
    return (["models"], model) if model != name else ([], name)


def _show_one(kind: str, name: str, others: list[str]) -> None:
    raw = load_raw(kind, name)
    also = f" (also a {' and a '.join(others)} profile of this name)" if others else ""
    click.echo(f"# {kind[:-1]} profile '{name}'{also}")
    click.echo(yaml.safe_dump(dict(raw), sort_keys=False, allow_unicode=True, width=100),
               nl=False)
    if kind == "engines":
        from kvsim.engines.config import context_words
        from kvsim.engines.resolve import resolve_engine

        unset = unset_context(raw["preset"])
        key = "ctx_size" if "ctx_size" in raw else "context_tokens"
        click.echo(f"# {key} unset (a scenario, kvsim fit): {unset}" + (
            "" if unset == str(raw.get(key)) else
            "; the number above applies only where no model is known"))
        if key == "ctx_size":
            click.echo(f"# where no model is known: {context_words(resolve_engine(name))} "
                       "(context_tokens = ctx_size / parallel, per session)")
    if kind == "models":
        from kvsim.model.geometry import kv_geometry
        geo = kv_geometry(ModelSpec.model_validate(raw), "f16", "f16", state_dtype="f16")
        click.echo("# KV geometry at f16: "
                   f"full {geo.full_bytes_per_token} B/token, windowed "
                   f"{geo.windowed_bytes_per_token} B/token (cap {geo.windowed_cap_bytes_per_seq}"
                   f" B/seq), recurrent {geo.recurrent_bytes_per_seq} B/seq")


def profile_yaml(spec: ModelSpec) -> str:
    data = spec.model_dump(mode="json", exclude_none=True)
    for g in data["layer_groups"]:
        for key in [k for k, v in g.items() if v == 0 and k != "layers"]:
            del g[key]
    return "# imported by `kvsim profiles import`\n" + yaml.safe_dump(
        data, sort_keys=False, allow_unicode=True, width=100)


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same folder, then os.replace (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@profiles.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="write the model profile YAML here (default: print it)")
@click.option("--name", default=None, help="slug for the profile (default: from the file)")
def import_cmd(path: Path, output: Path | None, name: str | None) -> None:
    """Make a model profile from a local config.json or GGUF file header."""
    from kvsim.model.geometry import kv_geometry
    from kvsim.model.importers import import_model, slugify
    if name is not None:  # NOTE: made a slug as the default name is ("My Model" → my-model)
        if not any(c.isalnum() for c in name):
            raise InputError("--name", name, "a profile name with a letter or digit "
                             "(made a slug: lowercase, '-' between words, e.g. my-model-8b)")
        name = slugify(name)
    if output is not None:
        check_output("--output", output, folder=False)
    spec = import_model(path, name)
    text = profile_yaml(spec)
    geo = kv_geometry(spec, "f16", "f16", state_dtype="f16")
    summary = (f"{spec.name}: {spec.num_layers} layers, KV f16 {geo.full_bytes_per_token} "
               f"B/token (+{geo.windowed_bytes_per_token} windowed), recurrent "
               f"{geo.recurrent_bytes_per_seq} B/seq")
    if output is None:
        click.echo(text, nl=False)
        click.echo(summary, err=True)
    else:
        with output_errors("--output", output):
            write_atomic(output, text)
        click.echo(f"wrote {output} — {summary}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(profiles())
