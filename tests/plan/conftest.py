"""Shared fixtures for the planning tests (helpers live in sweep_files.py)."""

from pathlib import Path

import pytest
import yaml
from sweep_files import BASE


@pytest.fixture()
def base_yaml(tmp_path: Path) -> Path:
    p = tmp_path / "base.yaml"
    p.write_text(yaml.safe_dump(BASE), encoding="utf-8")
    return p
