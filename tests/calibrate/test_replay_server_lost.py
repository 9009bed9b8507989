"""A server that dies during a replay is not an engine failure (audit 3, defect 4: the
replay went on, exited 0 and called every later request "failed", with new chats
after them).  The replay stops with one error line, exit code 2, keeping what was
answered before; Ctrl-C keeps it too (exit code 130)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvsim.calibrate.replay import ReplayOptions, replay
from kvsim.errors import RunStopped
from kvsim.metrics.results import Results
from kvsim.workload.io import write_trace
from kvsim.workload.schema import Session, Turn

from .fake_llama import FakeLlama

ROOT = Path(__file__).resolve().parents[2]


def _session(think_s: float, turns: int = 5) -> Session:
    ts = [Turn(start_s=0.0 if i == 0 else None, think_s=think_s if i else 0.0,
               input_tokens=10, output_tokens=4) for i in range(turns)]
    return Session(session_id="s", system_prompt_id="a", system_prompt_tokens=20,
                   turns=tuple(ts))


def _wait_for(srv: FakeLlama, prompts: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(srv.prompts) < prompts:
        assert time.monotonic() < deadline, "the replay never sent that many requests"
        time.sleep(0.005)


def _die_after(srv: FakeLlama, prompts: int) -> threading.Thread:
    """Stop accepting connections once ``prompts`` requests arrived (the requests
    already accepted are answered in full: their handler threads go on)."""
    def run() -> None:
        _wait_for(srv, prompts)
        srv.server.shutdown()
        srv.server.server_close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_dead_server_stops_the_replay_keeping_what_it_answered():
    srv = FakeLlama()
    srv.thread.start()
    _die_after(srv, 2)
    res = replay([_session(think_s=0.3)], ReplayOptions(url=srv.url, after_failure="new_chat"))
    stop = res.stopped
    assert isinstance(stop, RunStopped)
    assert (stop.field, stop.value) == ("--url", srv.url)
    assert stop.allowed.startswith("the server stopped answering ")
    # refused (ConnectError) or reset while queued on the closing socket (ReadError)
    assert re.fullmatch(r"the server stopped answering \d+\.\d s into the replay "
                        r"\((ConnectError: .+|ReadError)\); replay stopped", stop.allowed)
    assert list(res.requests["request_id"]) == ["s#0", "s#1"]
    assert not res.requests["failed"].any()
    s = res.summary
    assert (s["requests"], s["failed_requests"], s["transport_errors"],
            s["unfinished_requests"], s["new_chats"]) == (2, 0, 1, 0, 0)
    assert s["stopped_reason"] == stop.allowed
    assert list(res.events["kind"]) == ["transport_error"]
    assert list(res.events["request_id"]) == ["s#2"]


def test_the_cli_saves_what_was_measured_and_exits_2(tmp_path, kvsim_cli):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [_session(think_s=0.3)])
    srv = FakeLlama()
    srv.thread.start()
    _die_after(srv, 2)
    out = tmp_path / "out"
    rc, err, stdout = kvsim_cli("replay", "--url", srv.url, trace, "-o", out)
    assert rc == 2 and stdout == ""
    assert err.startswith(f"error: --url: '{srv.url}' — the server stopped answering ")
    assert err.endswith(f"; replay stopped; the 2 requests answered before are saved in {out}")
    saved = Results.load(out)
    assert len(saved.requests) == 2 and saved.summary["transport_errors"] == 1


_WITH_CTRL_C = ("import runpy, signal, sys; signal.signal(signal.SIGINT, "
                "signal.default_int_handler); sys.argv[0] = 'kvsim'; "
                "runpy.run_module('kvsim', run_name='__main__')")


def test_ctrl_c_saves_what_was_measured_and_exits_130(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [_session(think_s=3.0)])
    out = tmp_path / "out"
    with FakeLlama() as srv:
        # NOTE: Ctrl-C's default handler in the child even where this test runs with
        # SIGINT ignored (a background job of a non-interactive shell inherits SIG_IGN,
        # and Python keeps it: the replay would then run to its end and exit 0)
        proc = subprocess.Popen([sys.executable, "-c", _WITH_CTRL_C, "replay", "--url",
                                 srv.url, str(trace), "-o", str(out)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            _wait_for(srv, 1)
            time.sleep(0.5)  # answered (4 tokens at once); the next turn is 3 s away
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, (stderr, stdout[-2000:])
    assert stderr.splitlines() == [
        f"interrupted: the 1 requests answered so far are saved in {out}"]
    saved = Results.load(out)
    assert list(saved.requests["request_id"]) == ["s#0"]
    assert saved.summary["stopped_reason"] == "interrupted (Ctrl-C)"
