"""End-to-end: the readers on fresh output of the llama-bench / llama-batched-bench
that scripts/build_llama_server.sh builds (marker ``e2e``: runs with the other e2e
suites; the build is cached, and the tiny GGUF makes each run well under a second).

Guards the fixtures in tests/validate/data against a llama.cpp bump changing the
output the readers expect.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvsim.calibrate.tiny_gguf import write_tiny_gguf
from kvsim.validate.llamabench import BATCHED_MD, BENCH_JSON, BENCH_MD, detect_format, read_bench

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    out = subprocess.run([str(ROOT / "scripts/build_llama_server.sh")], check=True,
                         capture_output=True, text=True, timeout=3600)
    return Path(out.stdout.strip().splitlines()[-1]).parent


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_fresh_llama_bench_json_and_markdown_agree(bin_dir: Path, gguf: Path) -> None:
    run = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-p", "32",
                          "-n", "8", "-d", "0,64", "-t", "1", "-r", "1",
                          "-o", "json", "-oe", "md"],
                         check=True, capture_output=True, text=True, timeout=120)
    assert (detect_format(run.stdout), detect_format(run.stderr)) == (BENCH_JSON, BENCH_MD)
    js, s1 = read_bench(run.stdout, origin="json")
    md, s2 = read_bench(run.stderr, origin="md")
    assert s1 == s2 == []
    assert [(m.metric, m.n_prompt, m.n_gen, m.depth) for m in js] == [
        ("pp_tps", 32, 0, 0), ("tg_tps", 0, 8, 0), ("pp_tps", 32, 0, 64), ("tg_tps", 0, 8, 64)]
    assert [m.value for m in md] == [round(m.value, 2) for m in js]
    assert {(m.backend, m.weight_format) for m in js + md} == {("CPU", "F32")}


def test_fresh_llama_batched_bench_table(bin_dir: Path, gguf: Path) -> None:
    for _ in range(8):
        run = subprocess.run([str(bin_dir / "llama-batched-bench"), "-m", str(gguf), "-c",
                              "512", "-npp", "32", "-ntg", "8", "-npl", "1,2", "-t", "1"],
                             check=True, capture_output=True, text=True, timeout=120)
        # NOTE: this build of llama-batched-bench sometimes ends after the B=1 row, exit
        # code 0 and nothing on stderr (seen here in about half the runs, whatever -c or
        # -kvu): a run that printed both rows is the one to read
        if run.stdout.count("|    32 |") == 2:
            break
    assert detect_format(run.stdout) == BATCHED_MD
    ms, skipped = read_bench(run.stdout, origin="bb")
    assert skipped == []
    assert [(m.id, m.metric, m.n_prompt, m.n_gen, m.depth, m.batch) for m in ms] == [
        ("bb:1:pp", "pp_tps", 32, 0, 0, 1), ("bb:1:tg", "tg_tps", 0, 8, 32, 1),
        ("bb:2:pp", "pp_tps", 32, 0, 0, 2), ("bb:2:tg", "tg_tps", 0, 8, 32, 2)]
