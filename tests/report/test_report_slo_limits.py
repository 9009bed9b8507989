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


def test_every_slo_the_help_names_is_drawn_on_its_metrics_cdf(tmp_path, make_results,
                                                              kvsim_cli):
    """The help says METRIC in ttft/itl/e2e and PCT in p50/p95/p99 (audit: e2e_p95 was
    refused): an E2E bound is a line on the E2E CDF, a p99 bound adds the 0.99 level."""
    rc, _, out = kvsim_cli("report", "--help")
    assert rc == 0 and "ttft/itl/e2e" in out and "p50/p95/p99" in out
    r = make_results(tmp_path / "r", ["a", "b"])  # TTFT 1 s, E2E 2 s each
    rc, err, _ = kvsim_cli("report", r, "--slo", "e2e_p99=3s", "--slo", "ttft_p50=0.5s",
                           "-o", tmp_path / "r.html")
    assert (rc, err) == (0, "")
    html = (tmp_path / "r.html").read_text()
    assert "End-to-end latency CDF" in html
    assert "p99 SLO 3 s" in html and "p50 SLO 0.5 s" in html


def test_slo_lines_sit_at_the_limit_and_the_percentile_level():
    from kvsim.report.figures_run import cdf_figure

    curve = {"x_s": [1.0, 2.0], "p": [0.5, 1.0], "n": 2, "p95_s": 2.0}
    fig = cdf_figure([("run", curve)], "E2E CDF", "s", [("p99", 3.0), ("p50", 1.5)])
    shapes = fig.layout.shapes
    # levels: p95 (always) plus the SLOs' p50 and p99; a vertical line per SLO within
    # the data (1.5 s), the one beyond it (3 s) said at the axis' edge instead of
    # stretching the axis: it stays fitted to the data, 1-2 s padded by 4 % of the span
    assert sorted(sh.y0 for sh in shapes if sh.y0 == sh.y1) == [0.5, 0.95, 0.99]
    assert sorted(sh.x0 for sh in shapes if sh.x0 == sh.x1) == [1.5]
    assert [a.text for a in fig.layout.annotations if "beyond" in a.text] == [
        "p99 SLO 3 s → (beyond the data)"]
    assert list(fig.layout.xaxis.range) == pytest.approx([0.96, 2.04])


def test_a_good_slo_still_reports(tmp_path, make_results, kvsim_cli):
    r = make_results(tmp_path / "r", ["a"])
    rc, err, _ = kvsim_cli("report", r, "--slo", "ttft_p95=2s", "-o", tmp_path / "r.html")
    assert (rc, err) == (0, "") and (tmp_path / "r.html").is_file()
