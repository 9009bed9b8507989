"""End-to-end: `kvsim calibrate bench` on real llama-bench output of this machine, then
`kvsim validate --calibration` on settings the fit did not see (marker ``e2e``).

llama-bench is built from the same vendored llama.cpp as llama-server
(scripts/build_llama_server.sh) and runs the tiny random GGUF on the CPU; the fit sees
one grid of prompt / generation lengths and depths, the check another (longer
prompts, other depths, another ubatch), and every held-out throughput must be
predicted within ±10 %.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.calibrate.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
FIT = ["-p", "32,128,512", "-n", "16,64", "-d", "0,1024", "-ub", "128"]
HELD_OUT = ["-p", "256", "-n", "32", "-d", "512,2048", "-ub", "256"]


@pytest.fixture(scope="module")
def bench() -> Path:
    out = subprocess.run([str(ROOT / "scripts/build_llama_server.sh")], check=True,
                         capture_output=True, text=True, timeout=3600)
    return Path(out.stdout.strip().splitlines()[-1]).parent / "llama-bench"


def _bench(bench: Path, gguf: Path, flags: list[str], out: Path) -> Path:
    # -t 1: one thread, so the other core's load moves the timings less
    run = subprocess.run([str(bench), "-m", str(gguf), *flags, "-t", "1", "-r", "3",
                          "-o", "json"], check=True, capture_output=True, text=True,
                         timeout=600)
    out.write_text(run.stdout, encoding="utf-8")
    return out


def _kvsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsim", *args], capture_output=True,
                          text=True, timeout=600)


def test_calibrated_card_predicts_held_out_llama_bench_runs(bench: Path, tmp_path: Path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    fit = _bench(bench, gguf, FIT, tmp_path / "fit.json")
    held = _bench(bench, gguf, HELD_OUT, tmp_path / "held.json")
    art = tmp_path / "cpu__tiny.json"
    run = _kvsim("calibrate", "bench", str(fit), "--model", str(gguf), "-o", str(art))
    assert run.returncode == 0, run.stderr
    saved = json.loads(art.read_text(encoding="utf-8"))
    assert saved["kind"] == "llama-bench" and saved["backend"] == "CPU"
    assert saved["rows"] == 3 * 2 + 2 * 2      # pp x depth + tg x depth
    run = _kvsim("validate", str(held), "--calibration", str(art), "--model", str(gguf),
                 "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["skipped"] == []
    errs = {r["id"]: r["rel_err"] for r in out["rows"]}
    assert len(errs) == 4                       # pp256 and tg32 at two depths
    print("held-out relative errors:", {k: f"{100 * v:+.1f} %" for k, v in errs.items()})
    assert max(abs(v) for v in errs.values()) <= 0.10, errs
