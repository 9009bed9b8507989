"""``kvsim report --slo`` uses the plan's SLO parser: the same limits (audit D40)."""

from __future__ import annotations

import pytest

from kvsim.errors import InputError
from kvsim.plan.slo import parse_slo

WHY = ("a latency bound in (0, 86400] s (no run can meet 0; a bound over a day bounds "
       "nothing)")


@pytest.mark.parametrize("slo", ["ttft_p95=0", "ttft_p95=1e300", "itl_p95=2d"])
def test_report_refuses_what_plan_refuses(tmp_path, make_results, kvsim_cli, slo):
    with pytest.raises(InputError, match="latency bound"):
        parse_slo(slo)
    r = make_results(tmp_path / "r", ["a"])
    rc, err, _ = kvsim_cli("report", r, "--slo", slo, "-o", tmp_path / "r.html")
    assert (rc, err) == (2, f"error: --slo: '{slo}' — {WHY}")


def test_report_draws_only_ttft_and_itl_p95(tmp_path, make_results, kvsim_cli):
    r = make_results(tmp_path / "r", ["a"])
    rc, err, _ = kvsim_cli("report", r, "--slo", "e2e_p95=3s", "-o", tmp_path / "r.html")
    assert (rc, err) == (2, ("error: --slo: 'e2e_p95=3s' — a report draws only "
                            "ttft_p95=<duration> or itl_p95=<duration>"))


def test_a_good_slo_still_reports(tmp_path, make_results, kvsim_cli):
    r = make_results(tmp_path / "r", ["a"])
    rc, err, _ = kvsim_cli("report", r, "--slo", "ttft_p95=2s", "-o", tmp_path / "r.html")
    assert (rc, err) == (0, "") and (tmp_path / "r.html").is_file()
