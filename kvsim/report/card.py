"""The scenario card: what was simulated, by which kvsim, with which latency model.

A report is shared without its inputs, so the card carries the resolved scenario
(collapsible JSON), its hash, the kvsim and results-format versions, the source
(simulated or measured), the latency model's provenance (roofline, constant, or a
calibrated artifact with its fit error) and the headline summary numbers.

``card_data`` is pure (tested without HTML); ``card_html`` renders it.

NOTE: everything that came from a user — scenario name and description, paths,
profile names — is HTML-escaped in ``card_html``; nothing here is trusted markup.
"""

from __future__ import annotations

import html
import json
import math
import numbers
from pathlib import Path
from typing import Any

from kvsim import __version__
from kvsim.config.units import format_latency
from kvsim.metrics.accuracy import recall_measured
from kvsim.report.data_run import run_config

HEADLINE = (  # (summary key, label, format)
    ("requests", "requests", "{:,.0f}"), ("failed_requests", "failed requests", "{:,.0f}"),
    ("unfinished_requests", "unfinished at the stop", "{:,.0f}"),
    ("ttft_p50_s", "TTFT p50", "latency"), ("ttft_p95_s", "TTFT p95", "latency"),
    ("itl_p50_s", "ITL p50", "latency"), ("itl_p95_s", "ITL p95", "latency"),
    ("peak_device_fraction", "peak device use", "{:.1%}"),
    ("peak_kv_allocated_bytes", "peak KV allocated", "gib"),
    ("prefix_hit_rate", "prefix hit rate", "{:.1%}"), ("preemptions", "preemptions", "{:,.0f}"),
    ("output_tokens_per_busy_s", "output tokens/s while busy", "sig3"),
    ("tokens_per_s", "output tokens/s (whole run)", "sig3"),
    ("accuracy_mean", "recall proxy (mean)", "{:.3f}"),
    ("recall_mean", "recall proxy (mean)", "{:.3f}"),
    ("recall_worst", "recall proxy (worst reference)", "{:.3f}"),
    ("recall_share_below_0_5", "references recalled below 0.5", "{:.1%}"),
    ("oom_risk", "OOM risk", "{:.3g}"),
)
# shown only when positive (a run that was not cut short has none)
IF_POSITIVE = frozenset({"unfinished_requests"})
# null when the workload had no reference events (kvsim.metrics.accuracy): "n/a"
NOT_MEASURED = frozenset({"recall_mean", "recall_worst", "recall_share_below_0_5"})


def significant(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits (0.366, 12.3, 457); from 10^digits on,
    whole numbers with thousands separators (12,345)."""
    text = f"{value:.{digits}g}"
    return f"{value:,.0f}" if abs(float(text)) >= 10**digits else text


def latency_provenance(config: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """Which latency model produced the numbers, and how well it was fitted.

    ``summary["latency_model"]`` is the model's own provenance line written by the
    simulator (``roofline(gpu, model, weights)``, ``calibrated(path, dtype, MAPE x%)``,
    ``constant(...)``); the scenario's ``latency`` block adds its settings, and summary
    keys starting with ``latency_fit_`` (fit errors) are shown as well.
    """
    prov = {f"config.{k}": v for k, v in (config.get("latency") or {}).items()}
    if summary.get("latency_model"):
        prov["model"] = summary["latency_model"]
    for key, value in summary.items():
        if key.startswith("latency_fit_"):
            prov[key] = value
    band = [summary.get(f"latency_fit_{m}_speed_p{q}") for m in ("decode", "prompt")
            for q in (10, 90)]
    if None not in band:  # NOTE: kvsim.latency.speed_band.SpeedBand.summary
        prov["speed on cards the fit left out (8 in 10)"] = (
            f"decode {band[0]:.2f}–{band[1]:.2f}×, prompt processing {band[2]:.2f}–"
            f"{band[3]:.2f}× kvsim's")
    return prov


def card_data(results: Any) -> dict[str, Any]:
    """Plain dict describing one run for the card (see module docstring).

    Reads ``scenario``, ``scenario_hash``, ``source`` and ``summary`` of a Results and
    an optional ``meta`` dict (``meta.json``: ``kvsim_version``, ``format_version``).
    """
    config, digest = run_config(results)
    meta = dict(getattr(results, "meta", None) or {})
    summary = dict(getattr(results, "summary", None) or {})
    gpu, model, engine = (config.get(k) or {} for k in ("gpu", "model", "engine"))
    facts = [
        ("GPU", gpu.get("display_name") or gpu.get("name")),
        ("model", model.get("display_name") or model.get("name")),
        ("weights", config.get("weights")),
        ("engine", _engine(engine)),
        ("workload", _workload(config.get("workload") or {})),
        ("seed", config.get("seed")),
        ("source", meta.get("source") or getattr(results, "source", None)),
        ("kvsim version (results)", meta.get("kvsim_version")),
        ("results format", meta.get("format_version")),
        ("kvsim version (report)", __version__),
        ("scenario hash", digest),
    ]
    return {
        "name": str(config.get("name") or "scenario"),
        "description": str(config.get("description") or ""),
        "facts": [(k, str(v)) for k, v in facts if v not in (None, "")],
        "latency": latency_provenance(config, summary),
        "headline": headline(summary),
        "config_json": json.dumps(config, indent=2, sort_keys=True, default=str),
    }


def headline(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, text)`` of the :data:`HEADLINE` keys the summary holds; a recall
    score that was not measured (null: no reference events) reads "n/a"."""
    out: list[tuple[str, str]] = []
    for key, label, fmt in HEADLINE:
        if key in NOT_MEASURED and key in summary and not recall_measured(summary, key):
            shown = any(t.startswith("n/a") for _, t in out)
            out.append((label, "n/a" if shown else "n/a (no reference events)"))
            continue
        if not _number(summary.get(key)):
            continue
        value = float(summary[key])
        if key in IF_POSITIVE and not value > 0:
            continue
        if key == "tokens_per_s" and "output_tokens_per_busy_s" in summary:
            continue  # NOTE: a whole-day average reads like a broken server; older folders
        text = f"{value / 2**30:.2f} GiB" if fmt == "gib" else format_latency(value) \
            if fmt == "latency" else significant(value) if fmt == "sig3" else fmt.format(value)
        out.append((label, text))
    return out


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and math.isfinite(float(value))


def _engine(engine: dict[str, Any]) -> str:
    from kvsim.engines.config import context_words

    parts = [str(engine.get("preset") or "")]
    for key, label in (("allocator", ""), ("context_tokens", "context "),
                       ("parallel", "parallel "), ("max_num_seqs", "max seqs ")):
        if engine.get(key) is not None:
            shrunk = " (-c unset: --fit may shrink it)" if key == "context_tokens" \
                and engine.get("fit_context") else ""
            text = context_words(engine) if key == "context_tokens" else \
                f"{label}{engine[key]}"
            parts.append(text + shrunk)
    if engine.get("cache_type_k"):
        parts.append(f"KV {engine['cache_type_k']}/{engine.get('cache_type_v', '')}")
    return ", ".join(p for p in parts if p)


def describe(config: dict[str, Any]) -> str:
    """A one-line description of what a resolved scenario runs: its workload (and its
    cut), model and weights, GPU and engine — for a scenario changed by ``--set``,
    whose own ``description`` was written for what it ran before."""
    wl, sim = config.get("workload") or {}, config.get("sim") or {}
    if wl.get("preset"):
        days = float(wl.get("days", 1))
        what = f"{wl['preset']} household, {days:g} day{'s' if days != 1 else ''}"
    else:
        what = f"trace {Path(str(wl.get('trace') or '')).name}"
    if wl.get("max_sessions"):
        what += f", down-sampled to {wl['max_sessions']} sessions"
    if sim.get("max_sim_time_s"):
        what += f", cut at {float(sim['max_sim_time_s']):g} s"
    gpu, model = config.get("gpu") or {}, config.get("model") or {}
    return (f"{what}; {model.get('display_name') or model.get('name')} "
            f"{config.get('weights', '')} on {gpu.get('display_name') or gpu.get('name')}; "
            f"{_engine(config.get('engine') or {})}")


def _workload(wl: dict[str, Any]) -> str:
    if wl.get("preset"):
        return f"{wl['preset']} ({wl.get('days', 1)} d)"
    return str(wl.get("trace") or "")


def card_html(card: dict[str, Any]) -> str:
    """Render :func:`card_data` output as an escaped HTML block."""
    e = html.escape
    facts = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in card["facts"])
    lat = card["latency"]
    lat_rows = "".join(f"<tr><th>{e(str(k))}</th><td>{e(_fmt(v))}</td></tr>"
                       for k, v in sorted(lat.items()))
    heads = "".join(f"<div class='kpi'><span>{e(label)}</span><b>{e(text)}</b></div>"
                    for label, text in card["headline"])
    desc = f"<p>{e(card['description'])}</p>" if card["description"] else ""
    return (
        f"<section class='card'><h2>{e(card['name'])}</h2>{desc}"
        f"<div class='kpis'>{heads}</div>"
        f"<div class='cols'><table class='facts'>{facts}</table>"
        f"<table class='facts'><caption>latency model</caption>{lat_rows}</table></div>"
        f"<details><summary>resolved scenario</summary><pre>{e(card['config_json'])}</pre>"
        f"</details></section>")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)
