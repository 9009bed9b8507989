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
    assert (rc, err) == (2, f"error: --sessions / --rate: '{value}' — give exactly one of "
                            "--sessions or --rate")
