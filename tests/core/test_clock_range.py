"""A request past the range the clock resolves is refused, not run forever: at 1e99 s a
step's end equals its start (issue 26, "no hangs"); a trace time, a think time or an
arrival delay that large ran without end."""

import json
import subprocess
import sys

import pytest

from kvsim.core.simclock import MAX_CLOCK_S


def _trace(path, turns) -> str:
    lines = [{"trace_meta": {}}, {"session_id": "s", "turns": turns}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


@pytest.mark.parametrize(("turns", "request_id"), [
    ([{"start_s": 1e99, "input_tokens": 5, "output_tokens": 2}], "s#0"),
    ([{"start_s": 0, "input_tokens": 5, "output_tokens": 2},
      {"think_s": 1e99, "input_tokens": 3, "output_tokens": 2}], "s#1"),
])
def test_a_request_past_the_clocks_range_is_one_line(tmp_path, turns, request_id) -> None:
    trace = _trace(tmp_path / "t.jsonl", turns)
    r = subprocess.run([sys.executable, "-m", "kvsim", "simulate", "quickstart", "--set",
                        f"workload.trace={trace}", "-o", str(tmp_path / "o"), "--no-report"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2
    assert r.stderr == (f"error: workload: 'request {request_id} at 1e+99 s' — arrivals "
                        "before 1e+09 s (~31.7 years), where the clock still resolves a "
                        "step: keep the trace's start_s and think_s near 0\n")


def test_the_range_still_resolves_a_microsecond_step() -> None:
    assert MAX_CLOCK_S + 1e-6 > MAX_CLOCK_S
    assert (MAX_CLOCK_S + 1e-6) - MAX_CLOCK_S == pytest.approx(1e-6, rel=0.25)
