"""``--dask`` at an address that accepts TCP but never speaks Dask (issue 26: the
Client waited for the handshake forever).  Connect and handshake are both bounded by
``--dask-timeout``: one line, exit code 2."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest
from sweep_files import write_sweep

pytest.importorskip("distributed")


class SilentPeer:
    """A TCP server that accepts every connection and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def test_a_silent_peer_fails_in_one_line_within_the_timeout(tmp_path, base_yaml):
    sweep = write_sweep(tmp_path, factors={"engine.parallel": [1]})
    peer = SilentPeer()
    address = f"tcp://127.0.0.1:{peer.port}"
    try:
        # NOTE: a subprocess so a hang shows as this timeout, not a stuck test run
        proc = subprocess.run([sys.executable, "-m", "kvsim", "sweep", str(sweep), "-o",
                               str(tmp_path / "o"), "--dask", address, "--dask-timeout",
                               "1", "--no-progress"],
                              capture_output=True, text=True, timeout=90, check=False)
    finally:
        peer.close()
    assert peer.conns, "kvsim never connected"
    assert proc.returncode == 2, proc.stderr
    line = (f"error: --dask: '{address}' — accepts connections but did not answer the Dask "
            "handshake within 1 s; is it a Dask scheduler?")
    assert proc.stderr.splitlines() == [line], proc.stderr
    assert not (tmp_path / "o" / "results").exists() or not any(
        (tmp_path / "o" / "results").iterdir())
