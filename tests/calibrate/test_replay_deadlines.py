"""Every network wait of a replay has a wall-clock deadline (issue 26: a server that
answered ``/props`` and then trickled one SSE line a second held ``kvsim replay``
forever, because the read timeout resets on every byte).  Past its deadline a request
stops the replay: one error line naming it and the deadline, exit code 2, and what was
measured before is saved."""

from __future__ import annotations

import json
import re
import time
from http.server import BaseHTTPRequestHandler

import pytest

from kvsim.calibrate.replay import ReplayOptions, replay
from kvsim.errors import InputError, RunStopped
from kvsim.metrics.results import Results
from kvsim.workload.io import write_trace
from kvsim.workload.schema import Session, Turn

from .fake_llama import FakeLlama


def _session(turns: int = 3) -> Session:
    ts = [Turn(start_s=0.0 if i == 0 else None, think_s=0.0, input_tokens=10,
               output_tokens=4) for i in range(turns)]
    return Session(session_id="s", system_prompt_id="a", system_prompt_tokens=20,
                   turns=tuple(ts))


class SlowLlama(FakeLlama):
    """FakeLlama whose request number ``slow_from`` and later get a 200 and then either
    one token event every ``trickle_s`` (never the final one) or nothing at all
    (``trickle_s=None``: it stalls), until the client goes away."""

    def __init__(self, slow_from: int, trickle_s: float | None) -> None:
        super().__init__()
        self.slow_from, self.trickle_s = slow_from, trickle_s
        self.gone = False  # the client hung up on a slow answer

    def handle(self, h: BaseHTTPRequestHandler, body: dict) -> None:
        if len(self.prompts) < self.slow_from:
            super().handle(h, body)
            return
        self.prompts.append(body["prompt"])
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        h.wfile.flush()
        deadline = time.monotonic() + 60  # NOTE: never hold a test server thread longer
        try:
            while time.monotonic() < deadline:
                if self.trickle_s is None:
                    h.wfile.write(b"")  # NOTE: a stalled server sends nothing
                    h.rfile.peek()  # returns once the client closes the connection
                    break
                time.sleep(self.trickle_s)
                event = {"tokens": [7], "content": " x", "stop": False}
                h.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                h.wfile.flush()
        except OSError:
            pass
        self.gone = True
        h.close_connection = True


def _wait_until_gone(srv: SlowLlama | TricklingProps) -> None:
    """The client hung up on the slow answer (the server sees it at its next write)."""
    deadline = time.monotonic() + 30
    while not srv.gone:
        assert time.monotonic() < deadline, "the client never hung up"
        time.sleep(0.05)


@pytest.mark.parametrize("trickle_s", [0.2, None], ids=["trickles", "stalls"])
def test_a_request_past_its_deadline_stops_the_replay_keeping_what_was_measured(
        tmp_path, kvsim_cli, trickle_s):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [_session()])
    out = tmp_path / "out"
    with SlowLlama(slow_from=1, trickle_s=trickle_s) as srv:
        rc, err, stdout = kvsim_cli("replay", "--url", srv.url, trace, "-o", out,
                                    "--request-timeout", "1")
        _wait_until_gone(srv)
    assert rc == 2 and stdout == ""
    assert kvsim_cli.stderr == err + "\n"  # the one line is the whole stderr
    assert re.fullmatch(r"error: --request-timeout: 1\.0 — request s#1 got no complete "
                        r"answer within 1 s \(\d+\.\d s into the replay\); replay stopped; "
                        rf"the 1 requests answered before are saved in {re.escape(str(out))}",
                        err), err
    saved = Results.load(out)
    assert list(saved.requests["request_id"]) == ["s#0"]
    assert not saved.requests["failed"].any()
    assert list(saved.events["kind"]) == ["transport_error"]
    assert list(saved.events["request_id"]) == ["s#1"]
    assert saved.summary["stopped_reason"].startswith("request s#1 got no complete answer")


def test_the_library_call_returns_the_stop_with_the_results(tmp_path):
    with SlowLlama(slow_from=2, trickle_s=0.2) as srv:
        res = replay([_session()], ReplayOptions(url=srv.url, request_timeout_s=1.0))
    assert isinstance(res.stopped, RunStopped)
    assert (res.stopped.field, res.stopped.value) == ("--request-timeout", 1.0)
    assert list(res.requests["request_id"]) == ["s#0", "s#1"]
    assert (res.summary["requests"], res.summary["transport_errors"]) == (2, 1)


class TricklingProps(FakeLlama):
    """Answers ``/props`` one byte every 0.2 s (a whole answer would take minutes)."""

    def __init__(self) -> None:
        super().__init__()
        owner, base = self, self.server.RequestHandlerClass

        class Handler(base):  # type: ignore[misc, valid-type]
            def do_GET(self) -> None:
                data = json.dumps({"default_generation_settings": {"n_ctx": 200},
                                   "pad": "x" * 1000}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    for i in range(len(data)):
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        time.sleep(0.2)
                except OSError:
                    owner.gone = True

        self.gone = False
        self.server.RequestHandlerClass = Handler


def test_the_server_check_has_a_deadline(tmp_path, kvsim_cli):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [_session()])
    with TricklingProps() as srv:
        rc, err, _ = kvsim_cli("replay", "--url", srv.url, trace, "-o", tmp_path / "out",
                               "--check-timeout", "1")
        _wait_until_gone(srv)
        assert srv.prompts == []  # nothing was sent
    assert rc == 2
    assert err == (f"error: --url: '{srv.url}' — the server check GET /props got no "
                   "complete answer within 1 s (--check-timeout); nothing was replayed")


@pytest.mark.parametrize("flag,bad,most", [
    ("--request-timeout", "0", "86400"), ("--request-timeout", "nan", "86400"),
    ("--request-timeout", "1e9", "86400"), ("--check-timeout", "-1", "3600"),
    ("--check-timeout", "inf", "3600")])
def test_a_deadline_out_of_range_is_one_line(tmp_path, kvsim_cli, flag, bad, most):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [_session()])
    rc, err, _ = kvsim_cli("replay", "--url", "http://127.0.0.1:9", trace, "-o",
                           tmp_path / "out", flag, bad)
    assert rc == 2 and err.startswith(f"error: {flag}: ")
    assert err.endswith(f" — seconds in (0, {most}]")
    with pytest.raises(InputError, match=re.escape(f"seconds in (0, {most}]")):
        ReplayOptions(url="http://127.0.0.1:9", **{
            flag.removeprefix("--").replace("-", "_") + "_s": float(bad)})


class LegacyErrorLlama(FakeLlama):
    """Its second request fails after the stream began, as older llama-servers send it:
    a non-standard ``error: {...}`` SSE field (which SSE readers ignore by the spec)."""

    def handle(self, h: BaseHTTPRequestHandler, body: dict) -> None:
        if len(self.prompts) != 1:
            super().handle(h, body)
            return
        self.prompts.append(body["prompt"])
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        err = {"code": 400, "message": "the request exceeds the available context size",
               "type": "exceed_context_size_error"}
        h.wfile.write(f"error: {json.dumps(err)}\n\n".encode())
        h.wfile.flush()
        h.close_connection = True


def test_llama_cpp_stream_errors_keep_the_engine_wording():
    with LegacyErrorLlama() as srv:
        res = replay([_session()], ReplayOptions(url=srv.url))
    req = res.requests.set_index("request_id")
    assert req.loc["s#1", "failed"]
    assert req.loc["s#1", "failure_reason"] == "exceed_context_size_error"
    assert res.stopped is None and res.summary["failed_requests"] == 1
