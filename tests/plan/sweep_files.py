"""A small base scenario and sweep-file writer shared by the planning tests."""

from pathlib import Path

import yaml

BASE = {"name": "base", "gpu": "rtx-4090", "model": "llama-3.1-8b",
        "engine": {"preset": "llama.cpp", "allocator": "slots", "context_tokens": 8192,
                   "parallel": 2},
        "workload": {"preset": "family-4", "days": 0.25}}


def write_sweep(tmp_path: Path, **spec) -> Path:
    doc = {"name": "t", "base": "base.yaml", **spec}
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return p
