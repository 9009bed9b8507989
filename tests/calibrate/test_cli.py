"""``kvsim calibrate`` / ``kvsim replay`` command lines: output and bad input (exit 2)."""

import json
import subprocess
import sys
from pathlib import Path

FIX = Path(__file__).parent / "fixtures"


def _kvsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvsim", *args], capture_output=True, check=False,
                          text=True, timeout=120)


def test_from_log_prints_the_facts() -> None:
    r = _kvsim("calibrate", "from-log", str(FIX / "llama_server.log"))
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert (facts["engine"], facts["n_ctx_seq"], facts["kv_buffer_bytes"]) == (
        "llama.cpp", 4096, 2048 * 2**20)


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path) -> None:
    r = _kvsim("calibrate", "from-log", str(FIX.parent / "__init__.py"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no vLLM" in r.stderr
    r = _kvsim("calibrate", "kernels", "--model", "llama-3.2-1b", "--cache-types", "fp4",
               "-o", str(tmp_path / "a.json"))
    assert r.returncode == 2 and "--cache-types: 'fp4'" in r.stderr
    assert not (tmp_path / "a.json").exists()
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"trace_meta": {}}\n{"session_id": "s", "turns": [{"start_s": 0, '
                     '"input_tokens": 5, "output_tokens": 2}]}\n')
    r = _kvsim("replay", "--url", "http://127.0.0.1:9", str(trace), "-o", str(tmp_path / "m"))
    assert r.returncode == 2 and "server unreachable" in r.stderr
    assert not (tmp_path / "m").exists()
