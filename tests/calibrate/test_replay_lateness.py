"""How late `kvsim replay`'s client sends its turns (kvsim.calibrate.lateness): the arrival
delay a simulation of that replay takes (latency.arrival_delay_s / arrival_jitter_s)."""

import json
import math
import subprocess
import sys

import pytest

from kvsim.calibrate.lateness import client_lateness, turn_lateness
from kvsim.calibrate.replay import ReplayOptions, _Row, replay
from kvsim.calibrate.wire import StreamResult, TokenSpace
from kvsim.workload.schema import Session, Turn

from .fake_llama import FakeLlama

SPACE = TokenSpace(low=300, high=900, banned=tuple(range(3, 259)))


def _session(sid: str, start: float, thinks: list[float]) -> Session:
    turns = [Turn(start_s=start, input_tokens=10, output_tokens=4)]
    turns += [Turn(think_s=t, input_tokens=7, output_tokens=4) for t in thinks]
    return Session(session_id=sid, system_prompt_id="a", system_prompt_tokens=20,
                   turns=tuple(turns))


def test_each_turn_is_late_after_its_start_or_its_think_time() -> None:
    """1, 3 and 2 ms late: after its start (0.1 s) and after each answer plus its think
    time (0.15 s, 0.2 s), all doubled on a replay at --time-scale 2."""
    s = _session("s", 0.1, [0.15, 0.2])
    rows = [_Row(s, 2, 0.7 + 0.4 + 0.002, 0, StreamResult(), finish_s=math.nan),
            _Row(s, 0, 0.201, 0, StreamResult(), finish_s=0.25),
            _Row(s, 1, 0.25 + 0.3 + 0.003, 0, StreamResult(), finish_s=0.7)]
    late = turn_lateness(rows, time_scale=2.0)
    assert late == pytest.approx([0.001, 0.003, 0.002], abs=1e-12)  # in send order
    mean, sd = client_lateness(late)
    assert mean == pytest.approx(0.002, abs=1e-12)
    assert sd == pytest.approx(0.001, abs=1e-12)
    assert client_lateness(late[:1]) is None


def test_a_replay_reports_its_clients_lateness() -> None:
    with FakeLlama() as srv:
        res = replay([_session("a", 0.0, [0.02, 0.02]), _session("b", 0.01, [0.03])],
                     ReplayOptions(url=srv.url, space=SPACE))
    late, sd = res.summary["client_late_s"], res.summary["client_late_sd_s"]
    assert 0.0 <= late < 0.25 and 0.0 <= sd < 0.25  # a client on an idle fake: ~ms


def test_the_cli_prints_the_keys_a_simulation_of_the_replay_takes(tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    lines = [{"trace_meta": {}}] + [
        {"session_id": f"s{i}", "turns": [{"start_s": 0.01 * i, "input_tokens": 5,
                                           "output_tokens": 2},
                                          {"think_s": 0.02, "input_tokens": 3,
                                           "output_tokens": 2}]} for i in range(3)]
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with FakeLlama() as srv:
        r = subprocess.run([sys.executable, "-m", "kvsim", "replay", "--url", srv.url,
                            "--token-range", "300:900", str(trace), "-o",
                            str(tmp_path / "m")],
                           capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    late, sd = summary["client_late_s"], summary["client_late_sd_s"]
    line = r.stdout.splitlines()[-1]
    assert line == (f"client: turns went out {late * 1000:.2f} ms late (sd {sd * 1000:.2f} "
                    "ms) after their start or think time; latency.arrival_delay_s: "
                    f"{late:.3g} and latency.arrival_jitter_s: {sd:.3g} replay that in a "
                    "simulation of it")
