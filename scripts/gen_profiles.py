#!/usr/bin/env python3
"""Generate the GPU, model, link and host catalogue YAML from the reference CSVs.

The committed YAML files under ``hardware_profiles/`` are the data; this script
exists so numbers are copied from ``docs/reference/{gpus,models}.csv`` and
``hardware-and-models.md`` by a program rather than retyped.  Re-run it after the
reference files change::

    python scripts/gen_profiles.py --reference docs/reference [--only gpus]

GPUs come from three tables: the reference ``gpus.csv`` (39 rows),
``scripts/data/gpus-added.csv`` (every further card, same columns plus its slug,
architecture, vector FP32 rate, compute units, boost clock, printed aliases and
unified-memory limit rule; each row names its sources) and
``scripts/data/gpu-extra-fields.csv`` (those new fields for the 39 reference rows, with
where they come from).  NOTE: a reference row's other numbers are never changed here.

Per-model layer layouts (which layers slide, MLA latent size, recurrent state
elements) come from each row's ``window_layer_pattern`` and ``kv_formula`` columns;
they are written out in ``scripts/profile_tables.py`` with the formula they encode.
"""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path
from typing import Any

import yaml
from profile_tables import (
    FFN_WIDTHS,
    GPU_SLUGS,
    LINKS,
    MLA_LATENT,
    MODEL_SLUGS,
    NO_POSITION_LIMIT_TOKENS,
    RECURRENT_STATE,
    RELEASED_EXPERT_FORMAT,
    TIED_EMBEDDINGS,
    VISION_ENCODERS,
)

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "hardware_profiles"
DATA = REPO / "scripts" / "data"
GIB = 2**30



def _num(text: str) -> float | None:
    text = text.strip()
    return float(text) if text else None


def _int(text: str) -> int | None:
    """Integer cell, or None when empty or not a number ("MLA latent", "n/a")."""
    text = text.strip()
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None


# hardware-and-models.md §4 "Unified memory limits": what the GPU may use by default on a
# unified-memory machine.  Apple: "about 65-75% of RAM" -> the midpoint, 70 %; Strix Halo:
# the BIOS carve-out of up to 96 GB (Linux GTT reaches ~108 GB or more: set it in the
# profile if you run that); DGX Spark: "about 110-120 GB" -> the midpoint, 115 GB.  All
# marked UNCERTAIN there; Jetson is not covered (its whole memory).
UNIFIED_GPU_LIMIT: dict[str, tuple[str, float]] = {
    "apple-m2-ultra": ("fraction", 0.70), "apple-m3-max": ("fraction", 0.70),
    "apple-m4-max": ("fraction", 0.70), "strix-halo": ("gib", 96.0),
    "dgx-spark": ("gib", 115.0),
}


def _gpu_limit(slug: str, memory_bytes: int, rule: str = "") -> int | None:
    """The default GPU share of a unified-memory machine: the slug's entry above, or a
    gpus-added.csv rule ``fraction:0.70`` / ``gib:96`` (the same §4 figures: every
    Apple part gets Apple's 70 %); None (all of memory_bytes) where §4 says nothing."""
    if rule:
        kind, _, text = rule.partition(":")
        value = float(text)
    elif slug in UNIFIED_GPU_LIMIT:
        kind, value = UNIFIED_GPU_LIMIT[slug]
    else:
        return None
    return int(value * memory_bytes) if kind == "fraction" else int(value * GIB)


def _experts(text: str) -> tuple[int | None, int | None]:
    """Routed experts and those active per token, from "128 experts, 8 active",
    "64 routed (6 active)", "16 experts (1 active)" (models.csv attention_kind / notes)."""
    m = re.search(r"(\d+)\s+(?:routed\s*)?(?:experts?\s*)?[,(]\s*(\d+)\s+active", text)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _new_gpu_fields(row: dict[str, str]) -> dict[str, Any]:
    """The fields beyond gpus.csv's columns (GpuSpec: architecture … aliases)."""
    return {
        "architecture": row["architecture"],
        "fp32_flops": float(row["fp32_tflops"]) * 1e12,
        "compute_units": int(row["compute_units"]),
        "boost_clock_hz": float(row["boost_clock_mhz"]) * 1e6,
        "aliases": [a.strip() for a in row["aliases"].split("|") if a.strip()],
    }


def gpu_profile(row: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, Any]:
    """A GPU profile from a gpus.csv-shaped row: a reference row (slug from GPU_SLUGS,
    new fields from ``extra``) or a gpus-added.csv row (it carries both itself)."""
    slug = row.get("slug") or GPU_SLUGS[row["name"]]
    fields = _new_gpu_fields(extra if extra is not None else row)
    unified = "unified" in row["segment"].lower()
    gen, lanes = _int(row["pcie_gen"]), _int(row["pcie_lanes"])
    fp16 = _num(row["fp16_tensor_tflops_dense"])
    fp16_32 = _num(row["fp16_tensor_tflops_dense_fp32acc"])
    fp8, int8 = _num(row["fp8_tensor_tflops_dense"]), _num(row["int8_tops_dense"])
    l2 = _num(row["l2_cache_mb"])
    notes = row["notes"].strip()
    if row["memory_capacity_note"].strip():
        notes = f"{notes} | memory: {row['memory_capacity_note'].strip()}"
    if row["interconnect_or_unified"].strip() not in ("", "none"):
        notes = f"{notes} | interconnect: {row['interconnect_or_unified'].strip()}"
    memory_bytes = int(float(row["memory_gib"]) * GIB)
    return {
        "name": slug,
        "display_name": row["name"],
        "vendor": row["vendor"],
        "segment": row["segment"],
        "memory_bytes": memory_bytes,
        "memory_type": row["memory_type"],
        "memory_bandwidth_bytes_per_s": float(row["memory_bandwidth_gbps"]) * 1e9,
        "fp16_tensor_flops": fp16 * 1e12,
        "fp16_fp32acc_tensor_flops": fp16_32 * 1e12,
        "fp8_tensor_flops": fp8 * 1e12 if fp8 else None,
        "int8_tensor_ops": int8 * 1e12 if int8 else None,
        "pcie_gen": gen,
        "pcie_lanes": lanes,
        "unified_memory": unified,
        "gpu_memory_limit_bytes": _gpu_limit(slug, memory_bytes,
                                             row.get("gpu_memory_limit", "")),
        "default_link": None if unified or gen is None else f"pcie{gen}-x{lanes}",
        "tdp_w": row["tdp_w"],
        "launch_price_usd": _num(row["launch_msrp_usd"]),
        "launch_year": _int(row["launch_year"]),
        # NOTE: "MB" of L2 cache is binary (MiB) on vendor spec sheets.
        "l2_cache_bytes": int(l2 * 2**20) if l2 else None,
        **fields,
        "nvlink": "nvlink" in row["interconnect_or_unified"].lower(),
        "source": row["source"],
        "notes": notes,
    }


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


def gpu_profiles(reference_rows: list[dict[str, str]], data: Path) -> list[dict[str, Any]]:
    """Every GPU: the reference rows (plus their extra fields) and the added rows."""
    extra = {r["slug"]: r for r in _read_csv(data / "gpu-extra-fields.csv")}
    missing = sorted(set(GPU_SLUGS.values()) - set(extra))
    if missing:
        raise SystemExit(f"gpu-extra-fields.csv lacks {', '.join(missing)}")
    out = [gpu_profile(r, extra[GPU_SLUGS[r["name"]]]) for r in reference_rows]
    out += [gpu_profile(r) for r in _read_csv(data / "gpus-added.csv")]
    totals = {r["slug"]: r for r in _read_csv(data / "gpu-cuda-totals.csv")}
    for g in out:  # the driver-reported totals start-up logs printed (kvsim.config.device_memory)
        if g["name"] in totals:
            t = totals.pop(g["name"])
            g["cuda_total_bytes"] = int(float(t["cuda_total_mib"]) * 2**20)
            g["cuda_total_source"] = t["source"]
    if totals:
        raise SystemExit(f"gpu-cuda-totals.csv names unknown GPUs: {', '.join(totals)}")
    slugs = [g["name"] for g in out]
    twice = sorted({s for s in slugs if slugs.count(s) > 1})
    if twice:
        raise SystemExit(f"GPU slugs defined twice: {', '.join(twice)}")
    return out


def _attn_group(kind: str, idx: list[int], kv: int, hd: int,
                window: int | None = None) -> dict[str, Any]:
    g: dict[str, Any] = {"kind": kind, "layers": len(idx), "layer_indices": idx,
                         "n_kv_heads": kv, "head_dim_k": hd, "head_dim_v": hd}
    if window:
        g["window_tokens"] = window
    return g


def layer_groups(row: dict[str, str]) -> list[dict[str, Any]]:
    """Layer groups encoded by a models.csv row (pattern + kv_formula columns)."""
    name, n = row["name"], int(row["num_layers"])
    every = list(range(n))
    if name in MLA_LATENT:
        return [{"kind": "mla", "layers": n, "latent_dim": MLA_LATENT[name]}]
    if name in RECURRENT_STATE:
        ssm, window = RECURRENT_STATE[name]
        kv, hd = _int(row["num_kv_heads"]) or 0, _int(row["head_dim"]) or 0
        if name.startswith("Qwen3-Next"):
            attn = [i for i in every if (i + 1) % 4 == 0]        # full_attention_interval 4
        elif name.startswith("Jamba"):
            attn = [i for i in every if i % 8 == 4]              # period 8, offset 4
        else:
            attn = []
        rec = [i for i in every if i not in attn]
        groups = [_attn_group("full", attn, kv, hd)] if attn else []
        groups.append({"kind": "recurrent", "layers": len(rec), "layer_indices": rec,
                       "state_elements": ssm + window, "conv_state_elements": window})
        return groups
    kv, hd = int(row["num_kv_heads"]), int(row["head_dim"])
    window = _int(row["sliding_window"])
    if not window:
        return [_attn_group("full", every, kv, hd)]
    if name.startswith(("Gemma-2", "gpt-oss")):
        local = [i for i in every if i % 2 == 0]                 # even layers slide
        kind = "sliding"
    elif name.startswith("Gemma-3"):
        local = [i for i in every if (i + 1) % 6 != 0]           # global iff (i+1)%6==0
        kind = "sliding"
    elif name.startswith("Llama-4"):
        local = [i for i in every if (i + 1) % 4 != 0]           # NoPE global every 4th
        kind = "chunked"
    else:
        raise SystemExit(f"no layer pattern for {name}")
    glob = [i for i in every if i not in local]
    return [_attn_group("full", glob, kv, hd), _attn_group(kind, local, kv, hd, window)]


def model_profile(row: dict[str, str]) -> dict[str, Any]:
    name = row["name"]
    groups = layer_groups(row)
    mla = name in MLA_LATENT
    max_pos = _int(row["max_position_embeddings"])
    notes = row["notes"].strip()
    if max_pos is None:
        notes += (f" | max_context_tokens: no positional limit (recurrent); "
                  f"{NO_POSITION_LIMIT_TOKENS} is a kvsim planning cap")
    if mla:
        notes += " | num_kv_heads/head_dim describe the one shared MLA latent per layer"
    if name in RECURRENT_STATE:
        notes += (" | state_elements: the SSM state + a convolution window of d_conv - 1 "
                  "columns, as llama.cpp (n_embd_r) and vLLM allocate it")
    experts = _experts(f"{row['attention_kind']} {row['notes']}")
    ffn, ffn_src = _ffn_fields(MODEL_SLUGS[name])
    total, active = float(row["params_total_b"]), float(row["params_active_b"])
    text = re.search(r"text-only ([0-9.]+)\s*B", row["notes"])
    if text and active == total:  # models.csv: plan with the text weights (the vision
        total = active = float(text.group(1))  # tower is a separate GGUF / not loaded)
        notes += f" | params_total: text-only {total}B (vision tower excluded)"
    return {
        "name": MODEL_SLUGS[name],
        "display_name": name,
        "hf_repo": row["hf_repo"],
        # NOTE: whole parameters (8.03 * 1e9 is 8029999999.999999 in floating point)
        "params_total": float(round(total * 1e9)),
        "params_active": float(round(active * 1e9)),
        "num_layers": int(row["num_layers"]),
        "hidden_size": int(row["hidden_size"]),
        "num_attention_heads": int(row["num_attention_heads"]),
        "num_kv_heads": 1 if mla else (_int(row["num_kv_heads"]) or 0),
        "head_dim": MLA_LATENT[name] if mla else (_int(row["head_dim"]) or 0),
        "vocab_size": int(row["vocab_size"]),
        "max_context_tokens": max_pos or NO_POSITION_LIMIT_TOKENS,
        "layer_groups": groups,
        "num_experts": experts[0],
        "num_experts_active": experts[1],
        "attention_kind": row["attention_kind"],
        "tied_embeddings": MODEL_SLUGS[name] in TIED_EMBEDDINGS,
        **({"vision_encoder": VISION_ENCODERS[MODEL_SLUGS[name]]}
           if MODEL_SLUGS[name] in VISION_ENCODERS else {}),
        **ffn,
        "source": row["source"] + ffn_src,
        "notes": f"{notes} | kv_formula: {row['kv_formula']}".strip(" |"),
    }


def _ffn_fields(slug: str) -> tuple[dict[str, Any], str]:
    """FFN widths and a released expert format where recorded (FFN_WIDTHS), and the
    widths' source as it joins the profile's; nothing where none is."""
    ff, moe, src = FFN_WIDTHS.get(slug, (None, None, ""))
    out: dict[str, Any] = {"ffn_intermediate_size": ff} if ff else {}
    if moe:
        out["moe_intermediate_size"] = moe
    if slug in RELEASED_EXPERT_FORMAT:
        out["released_expert_format"] = RELEASED_EXPERT_FORMAT[slug]
    return out, f"; FFN widths: {src}" if src else ""




def link_profiles() -> list[dict[str, Any]]:
    out = []
    for slug, disp, bw, theo, note, src in LINKS:
        out.append({
            "name": slug, "display_name": disp,
            "h2d_bytes_per_s": bw, "d2h_bytes_per_s": bw,
            "latency_s": 7.5e-6, "duplex_factor": 0.9, "pageable_factor": 0.55,
            "theoretical_bytes_per_s": theo, "source": src,
            "notes": (f"{note}. Latency 7.5 us = midpoint of 5-10 us per small copy; duplex 0.9x "
                      "per direction; pageable 0.55 = midpoint of 40-70% of pinned "
                      "(hardware-and-models.md §3)"),
        })
    out.append({
        "name": "unified", "display_name": "Unified memory (no host-device hop)",
        "h2d_bytes_per_s": 1e15, "d2h_bytes_per_s": 1e15, "latency_s": 0.0,
        "duplex_factor": 1.0, "pageable_factor": 1.0, "theoretical_bytes_per_s": None,
        "source": "hardware-and-models.md §3 (unified-memory machines have no PCIe hop)",
        "notes": ("Sentinel for Apple M-series, DGX Spark, Jetson, Strix Halo: there is no copy, "
                  "so offload is only a capacity question. 1 PB/s and 0 latency make transfers "
                  "free; CPU and GPU share the DRAM bandwidth of the GPU profile."),
    })
    return out


def host_profiles(gpus: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    ddr5 = 89.6e9   # dual-channel DDR5-5600: 2 x 64 bit x 5600 MT/s
    desk_note = ("ESTIMATE (not in docs/reference): dual-channel DDR5-5600 desktop, "
                 "89.6 GB/s theoretical = 2 ch x 8 B x 5600 MT/s; cpu_flops 0.5 TFLOP/s is a "
                 "planning guess for an 8-16 core AVX2/AVX-512 CPU running offloaded layers")
    out = []
    for gb in (32, 64, 128):
        out.append({"name": f"desktop-{gb}gb", "display_name": f"Desktop, {gb} GB DDR5",
                    "memory_bytes": gb * GIB, "memory_bandwidth_bytes_per_s": ddr5,
                    "cpu_flops": 0.5e12, "unified_with_gpu": False,
                    "source": "kvsim planning estimate", "notes": desk_note})
    unified = [
        ("apple-m2-ultra-192gb", "Apple M2 Ultra (76-core GPU)", "Apple M2 Ultra, 192 GB"),
        ("apple-m3-max-128gb", "Apple M3 Max (16-core CPU / 40-core GPU)", "Apple M3 Max, 128 GB"),
        ("apple-m4-max-128gb", "Apple M4 Max (16-core CPU / 40-core GPU)", "Apple M4 Max, 128 GB"),
        ("dgx-spark-128gb", "NVIDIA DGX Spark (GB10)", "NVIDIA DGX Spark, 128 GB"),
        ("strix-halo-128gb", "AMD Ryzen AI Max+ 395 (Strix Halo, Radeon 8060S)",
         "AMD Strix Halo, 128 GB"),
        ("jetson-agx-orin-64gb", "NVIDIA Jetson AGX Orin 64GB", "NVIDIA Jetson AGX Orin, 64 GB"),
    ]
    for slug, gpu_name, disp in unified:
        row = gpus[gpu_name]
        out.append({
            "name": slug, "display_name": disp,
            "memory_bytes": int(float(row["memory_gib"]) * GIB),
            "memory_bandwidth_bytes_per_s": float(row["memory_bandwidth_gbps"]) * 1e9,
            "cpu_flops": 0.5e12, "unified_with_gpu": True,
            "source": f"gpus.csv row '{gpu_name}' (memory, bandwidth); {row['source']}",
            "notes": ("Unified memory: host and GPU share these bytes and this bandwidth. "
                      f"{row['memory_capacity_note']}. cpu_flops 0.5 TFLOP/s is a planning "
                      "ESTIMATE. Usable GPU share: hardware-and-models.md §4 (Apple ~65-75% by "
                      "default, Strix Halo 96 GB carve-out / ~108 GB GTT, Spark ~110-120 GB)"),
        })
    return out


class _Dumper(yaml.SafeDumper):
    """Lists of plain numbers (layer indices) in flow style: ``[0, 2, 4]``."""


def _list_repr(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(isinstance(x, (int, float)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _list_repr)


def _dump(folder: Path, items: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for item in items:
        text = ("# Generated by scripts/gen_profiles.py from docs/reference; "
                "edit the reference or the script, then re-run.\n")
        text += yaml.dump(item, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
        (folder / f"{item['name']}.yaml").write_text(text, encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=REPO / "docs" / "reference")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--data", type=Path, default=DATA,
                    help="folder of gpus-added.csv and gpu-extra-fields.csv")
    ap.add_argument("--only", choices=("gpus", "models", "links", "hosts"), action="append",
                    help="write only these kinds (repeatable; default: all)")
    args = ap.parse_args()
    kinds = set(args.only or ("gpus", "models", "links", "hosts"))
    gpu_rows = _read_csv(args.reference / "gpus.csv")
    model_rows = _read_csv(args.reference / "models.csv")
    wrote = []
    if "gpus" in kinds:
        gpus = gpu_profiles(gpu_rows, args.data)
        _dump(args.out / "gpus", gpus)
        wrote.append(f"{len(gpus)} gpus")
    if "models" in kinds:
        _dump(args.out / "models", [model_profile(r) for r in model_rows])
        wrote.append(f"{len(model_rows)} models")
    if "links" in kinds:
        _dump(args.out / "links", link_profiles())
        wrote.append(f"{len(LINKS) + 1} links")
    if "hosts" in kinds:
        _dump(args.out / "hosts", host_profiles({r["name"]: r for r in gpu_rows}))
        wrote.append("hosts")
    print(f"wrote {', '.join(wrote)} to {args.out}")


if __name__ == "__main__":
    main()
