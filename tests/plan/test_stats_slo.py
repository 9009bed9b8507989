"""Confidence intervals and SLO parsing, checked against closed-form values."""

import math

import numpy as np
import pytest

from kvsim.errors import InputError
from kvsim.plan.slo import build_constraints, judge, parse_slo
from kvsim.plan.stats import mean_interval, wilson_interval

Z = 1.959963984540054  # two-sided 95 % normal quantile


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    p = k / n
    denom = 1 + Z * Z / n
    centre = (p + Z * Z / (2 * n)) / denom
    half = Z / denom * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("k,n", [(0, 40), (20, 40), (40, 40), (1, 8), (3, 100)])
def test_wilson_matches_closed_form(k, n):
    iv = wilson_interval(k, n)
    lo, hi = wilson_by_hand(k, n)
    assert iv.estimate == k / n
    assert iv.low == pytest.approx(max(lo, 0.0), abs=1e-12)
    assert iv.high == pytest.approx(min(hi, 1.0), abs=1e-12)


def test_wilson_zero_of_n_upper_bound_is_z2_over_n_plus_z2():
    # at p̂ = 0 the Wilson upper bound reduces to z² / (n + z²)
    assert wilson_interval(0, 40).high == pytest.approx(Z * Z / (40 + Z * Z), rel=1e-12)


def test_wilson_rejects_no_trials():
    with pytest.raises(InputError, match="replications: 0 — need at least one replication"):
        wilson_interval(0, 0)


def test_mean_interval_constant_and_nan():
    iv = mean_interval([0.3, 0.3, float("nan"), 0.3])
    assert (iv.estimate, iv.low, iv.high, iv.n) == (0.3, 0.3, 0.3, 3)
    empty = mean_interval([float("nan")])
    assert empty.n == 0 and math.isnan(empty.estimate)


def test_one_run_gives_no_interval():
    # no spread can be estimated from one run: the ends are unknown, not the value
    iv = mean_interval([0.7, float("nan")])
    assert (iv.estimate, iv.n, iv.bounded) == (0.7, 1, False)
    assert math.isnan(iv.low) and math.isnan(iv.high)


def test_mean_interval_is_student_t_by_hand():
    # x = 1, 2, 6: mean 3, s = sqrt(((−2)² + (−1)² + 3²) / 2) = sqrt(7),
    # t(0.975, 2) = 4.302652729749464 → half width 4.3026527 · sqrt(7) / sqrt(3)
    iv = mean_interval([1.0, 2.0, 6.0])
    half = 4.302652729749464 * math.sqrt(7) / math.sqrt(3)
    assert iv.estimate == 3.0 and iv.bounded
    assert (iv.low, iv.high) == (pytest.approx(3 - half, rel=1e-12),
                                 pytest.approx(3 + half, rel=1e-12))


def test_mean_interval_width_matches_normal_theory_for_many_runs():
    x = np.random.default_rng(7).normal(10.0, 2.0, 400)
    iv = mean_interval(x)
    half = Z * x.std(ddof=1) / math.sqrt(len(x))  # CLT: mean ± z·s/√n
    assert iv.estimate == pytest.approx(x.mean())
    assert (iv.high - iv.low) / 2 == pytest.approx(half, rel=0.01)  # t(399) ≈ z


def test_parse_slo_units():
    assert parse_slo("ttft_p95=2s").key == "ttft_p95_s"
    assert parse_slo("ttft_p95=2s").limit_s == 2.0
    assert parse_slo("itl_p95=150ms").limit_s == pytest.approx(0.150)
    assert parse_slo("e2e_p99<=1.5 min").limit_s == pytest.approx(90.0)


@pytest.mark.parametrize("bad", ["ttft=2s", "ttft_p95", "ttft_p95=fast", "tpot_p95=1s",
                                 "ttft_p97=1s", "ttft_p95=0s", "ttft_p95=-1s", "itl_p95=3 parsecs"])
def test_unparsable_slos(bad):
    with pytest.raises(InputError) as exc:
        build_constraints([bad])
    assert "--slo" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("slos,kw,match", [
    (["ttft_p95=2s", "ttft_p95=1s"], {},                 # same metric twice
     r"--slo: 'ttft_p95=1s' — contradicts ttft_p95=2s given earlier"),
    (["ttft_p95=2s", "e2e_p95=1s"], {},                  # e2e below ttft
     r"--slo: 'e2e_p95=1s' — end-to-end bound below ttft_p95=2s"),
    ([], {"max_device_fraction": 0.0}, r"--max-device-fraction: 0\.0 — a fraction in \(0, 1\]"),
    ([], {"max_device_fraction": 1.2}, r"--max-device-fraction: 1\.2 — a fraction in \(0, 1\]"),
    ([], {"max_oom_risk": -0.1}, r"--max-oom-risk: -0\.1 — a probability in \[0, 1\]"),
    ([], {"min_recall": 1.5}, r"--min-recall: 1\.5 — a recall score in \[0, 1\]"),
])
def test_contradictory_or_impossible_constraints(slos, kw, match):
    with pytest.raises(InputError, match=match):
        build_constraints(slos, **kw)


def test_same_slo_twice_with_same_value_is_fine():
    c = build_constraints(["ttft_p95=2s", "ttft_p95=2000ms"])
    assert len(c.latency) == 1


def test_judge_binding_and_recall_note():
    c = build_constraints(["ttft_p95=2s", "itl_p95=100ms"], max_device_fraction=0.85,
                          max_oom_risk=0.05, min_recall=0.9)
    ok = judge(c, {"ttft_p95_s": 1.0, "itl_p95_s": 0.09, "device_fraction": 0.5,
                   "oom_risk": 0.0})
    assert ok.feasible and ok.binding == "itl_p95"  # slack 0.1 is the tightest
    assert any("recall" in n for n in ok.notes)
    bad = judge(c, {"ttft_p95_s": 3.0, "itl_p95_s": 0.2, "device_fraction": 0.5,
                    "oom_risk": 0.0, "recall": 1.0})
    # ttft violated by 50 %, itl by 100 % → itl binds
    assert not bad.feasible and bad.binding == "itl_p95"
    assert judge(c, {}, loads=False).binding == "load"
