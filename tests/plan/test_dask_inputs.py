"""``--dask`` / ``--dask-timeout``: refused in one line before any Client exists (audit
B18: a KeyError traceback, a garbage-collection traceback, a negative timeout)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sweep_files import write_sweep

pytest.importorskip("distributed")


@pytest.mark.parametrize("timeout", ["nan", "-1", "0", "inf"])
def test_a_bad_timeout(tmp_path, base_yaml, kvsim_cli, timeout):
    sweep = write_sweep(tmp_path, factors={"engine.parallel": [1]})
    rc, err, _ = kvsim_cli("sweep", sweep, "-o", tmp_path / "o", "--dask",
                           "tcp://127.0.0.1:9", "--dask-timeout", timeout)
    assert rc == 2 and err.startswith("error: --dask-timeout: ")
    assert err.endswith(" — seconds in (0, 3600]")


@pytest.mark.parametrize("address", ["notanaddress", "tcp://[::1"])
def test_a_bad_address_is_one_line_even_at_exit(tmp_path, base_yaml, address):
    # NOTE: a subprocess: the traceback came from a half-built Client's __del__ at exit
    sweep = write_sweep(tmp_path, factors={"engine.parallel": [1]})
    proc = subprocess.run([sys.executable, "-m", "kvsim", "sweep", str(sweep), "-o",
                           str(tmp_path / "o"), "--dask", address, "--no-progress"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith(f"error: --dask: '{address}' — not a Dask scheduler address")
