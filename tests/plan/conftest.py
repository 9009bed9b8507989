"""Shared fixtures for the planning tests: a small base scenario and sweep files."""

from pathlib import Path

import pytest
import yaml

BASE = {"name": "base", "gpu": "rtx-4090", "model": "llama-3.1-8b",
        "engine": {"preset": "llama.cpp", "allocator": "slots", "context_tokens": 8192,
                   "parallel": 2},
        "workload": {"preset": "family-4", "days": 0.25}}


@pytest.fixture()
def base_yaml(tmp_path: Path) -> Path:
    p = tmp_path / "base.yaml"
    p.write_text(yaml.safe_dump(BASE), encoding="utf-8")
    return p


def write_sweep(tmp_path: Path, **spec) -> Path:
    doc = {"name": "t", "base": "base.yaml", **spec}
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return p
