"""The catalogue resolves after a plain, non-editable ``pip install .``.

Builds a wheel from a copy of the source tree (so concurrent runs never share a build
folder), installs it with ``--target`` and imports kvsim from there, from a working
directory outside the repository, so the editable checkout cannot be what answers.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_profiles_resolve_after_non_editable_install(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("kvsim", "hardware_profiles", "workloads"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(src)],
                   check=True, cwd=tmp_path, capture_output=True)
    probe = (
        "import kvsim, json\n"
        "from kvsim.config.catalog import list_names, load_gpu, load_model\n"
        "from kvsim.engines.resolve import resolve_engine\n"
        "print(json.dumps({'file': kvsim.__file__, 'gpus': len(list_names('gpus')),\n"
        " 'models': len(list_names('models')), 'links': len(list_names('links')),\n"
        " 'vram': load_gpu('rtx-4090').memory_bytes,\n"
        " 'layers': load_model('llama-3.1-8b').num_layers,\n"
        " 'block': resolve_engine('vllm').block_tokens}))\n")
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", probe], check=True, cwd=tmp_path, env=env,
                         capture_output=True, text=True).stdout
    import json
    doc = json.loads(out)
    assert doc["file"].startswith(str(target))
    assert (doc["gpus"], doc["models"], doc["vram"], doc["layers"], doc["block"]) == (
        166, 65, 24 * 2**30, 32, 16)
    assert doc["links"] >= 7
