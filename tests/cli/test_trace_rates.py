"""``kvsim trace sample --scale-to-rate`` and ``trace inspect`` service rates: NaN, inf
and unreachable rates are one line and exit code 2 (audit C32, D40)."""

from __future__ import annotations

import pytest


@pytest.fixture()
def day(tmp_path, kvsim_cli):
    p = tmp_path / "day.jsonl"
    assert kvsim_cli("trace", "generate", "family-4", "--days", "1", "-o", p)[0] == 0
    return p


def test_an_unreachable_rate_is_refused(tmp_path, day, kvsim_cli):
    out = tmp_path / "s.jsonl"
    rc, err, _ = kvsim_cli("trace", "sample", day, "--sessions", "2", "--scale-to-rate",
                           "1e300", "-o", out)
    assert rc == 2 and err.startswith("error: --scale-to-rate: 1e+300 — not reachable: the "
                                      "requests arrive at about ")
    assert "think times within a session are not scaled" in err and not out.exists()


def test_a_reachable_rate_is_written(tmp_path, day, kvsim_cli):
    out = tmp_path / "s.jsonl"
    rc, err, _ = kvsim_cli("trace", "sample", day, "--sessions", "30", "--scale-to-rate",
                           "0.01", "-o", out)
    assert (rc, err) == (0, "") and out.is_file()


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_non_finite_rates(tmp_path, day, kvsim_cli, value):
    rc, err, _ = kvsim_cli("trace", "sample", day, "--sessions", "2", "--scale-to-rate",
                           value, "-o", tmp_path / "s.jsonl")
    assert rc == 2 and err.startswith("error: --scale-to-rate: ")
    assert err.endswith(" — a finite number > 0 (requests per second)")


@pytest.mark.parametrize("flag", ["--decode-tok-s", "--prefill-tok-s"])
@pytest.mark.parametrize("value", ["inf", "nan", "0"])
def test_inspect_service_rates(day, kvsim_cli, flag, value):
    rc, err, _ = kvsim_cli("trace", "inspect", day, flag, value)
    assert rc == 2 and err.startswith(f"error: {flag}: ")
    assert err.endswith(" — a finite number > 0 (tokens per second)")


@pytest.mark.parametrize("args, value", [((), "neither"), (("--sessions", "2", "--rate", "0.1"),
                                                            "both")])
def test_sessions_or_rate_exactly_one(tmp_path, day, kvsim_cli, args, value):
    rc, err, _ = kvsim_cli("trace", "sample", day, *args, "-o", tmp_path / "s.jsonl")
    assert (rc, err) == (2, (f"error: --sessions / --rate: '{value}' — give exactly one of "
                             "--sessions or --rate"))


def test_an_open_loop_trace_reaches_the_rate(tmp_path, kvsim_cli):
    """Open-loop turns arrive at their own start_s: a reaches 0, 50, 200 s, b 100 s —
    4 requests over 200 s — so 0.04/s halves every start_s (the first turns alone,
    4 over 100 s, would read as 0.04/s already and leave the trace as it is)."""
    from kvsim.workload.io import iter_sessions, write_trace
    from kvsim.workload.schema import Session, TraceMeta, Turn

    def session(sid, *starts):
        return Session(session_id=sid, history="none", turns=tuple(
            Turn(start_s=s, input_tokens=5, output_tokens=1) for s in starts))

    src, out = tmp_path / "open.jsonl", tmp_path / "s.jsonl"
    write_trace(src, [session("a", 0.0, 50.0, 200.0), session("b", 100.0)],
                TraceMeta(source="test"))
    rc, err, _ = kvsim_cli("trace", "sample", src, "--sessions", "2", "--scale-to-rate",
                           "0.04", "-o", out)
    assert (rc, err) == (0, "")
    assert [[t.start_s for t in s.turns] for s in iter_sessions(out)] == [[0.0, 25.0, 100.0],
                                                                          [50.0]]
