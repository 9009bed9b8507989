"""Recall without reference events is not measured: null, "n/a", never a perfect 1.0
(audit: a trace workload showed "recall proxy (mean) 1.000")."""

import json
import math

import pandas as pd

from kvsim.metrics.accuracy import ContentMultipliers, Outcome, ScoredEvent, recall_summary
from kvsim.plan.replicate import ReplicationSet, RunOutput
from kvsim.plan.search import _estimates
from kvsim.plan.slo import build_constraints, judge, measured_recall
from kvsim.report.card import headline
from kvsim.report.data_plan import runs_table

COUNTS = ("recall_intact_events", "recall_degraded_events", "recall_recovered_events",
          "recall_lost_events", "recall_collapse_events")


def test_no_events_give_null_scores_and_zero_counts() -> None:
    out = recall_summary([])
    assert out["reference_events"] == 0 and all(out[k] == 0 for k in COUNTS)
    for key in ("recall_mean", "recall_worst", "recall_share_below_0_5",
                "recall_session_mean_worst"):
        assert key in out and out[key] is None
    assert out["recall_latency_added_s"] == 0.0
    assert '"recall_mean": null' in json.dumps(out)


def test_events_keep_their_scores_and_counts() -> None:
    lost = ContentMultipliers().lost  # 0.10 (docs/reference/kv-policies.md §6.4)
    ev = [ScoredEvent(1.0, "a", "a#1", "exact", Outcome("INTACT"), 1.0),
          ScoredEvent(2.0, "b", "b#1", "exact", Outcome("LOST"), lost)]
    out = recall_summary(ev)
    # mean (1.0 + 0.1) / 2 = 0.55; one of two below 0.5; session means 1.0 and 0.1
    assert out["recall_mean"] == 0.55 and out["recall_worst"] == 0.1
    assert out["recall_share_below_0_5"] == 0.5 and out["recall_session_mean_worst"] == 0.1
    assert (out["recall_intact_events"], out["recall_lost_events"]) == (1, 1)


def test_the_card_says_n_a() -> None:
    summary = {"requests": 3, "reference_events": 0, "recall_mean": None,
               "recall_worst": math.nan, "recall_share_below_0_5": None}  # NaN: loaded
    rows = dict(headline(summary))
    assert rows["recall proxy (mean)"] == "n/a (no reference events)"
    assert rows["recall proxy (worst reference)"] == "n/a"
    assert rows["references recalled below 0.5"] == "n/a"
    assert "1.000" not in rows.values()
    # a summary without the keys at all (a measured replay) shows no recall line
    assert not any("recall" in label for label, _ in headline({"requests": 3}))


def _reps(*recalls) -> ReplicationSet:
    runs = tuple(RunOutput({"recall_mean": r, "peak_device_fraction": 0.5}) for r in recalls)
    return ReplicationSet("h", tuple(range(len(runs))), runs)


def test_plan_takes_an_unmeasured_recall_as_no_constraint() -> None:
    c = build_constraints(min_recall=0.9)
    assert not measured_recall({"recall_mean": None})
    assert not measured_recall({"recall_mean": math.nan}) and not measured_recall({})
    assert measured_recall({"recall_mean": 0.8})
    est = _estimates(_reps(None, None), c, False, 0.5)
    assert "recall" not in est
    v = judge(c, {**est, "oom_risk": 0.0})
    assert v.feasible and "recall taken as 1.0" in v.notes[0]
    # a NaN estimate (loaded results) is the same "not measured", not a violation
    assert judge(c, {"device_fraction": 0.5, "oom_risk": 0.0, "recall": math.nan}).feasible
    # measured in one run of two: the mean of what was measured, (0.8) / 1
    est = _estimates(_reps(None, 0.8), c, False, 0.5)
    assert est["recall"] == 0.8 and not judge(c, {**est, "oom_risk": 0.0}).feasible


class _Run:
    def __init__(self, name: str, summary: dict) -> None:
        self.summary, self.scenario, self.references = summary, {"name": name}, None
        self.requests = pd.DataFrame()


def test_policy_table_leaves_an_unmeasured_recall_empty() -> None:
    table = runs_table([_Run("a", {"recall_mean": None, "ttft_p95_s": 1.0}),
                        _Run("b", {"recall_mean": math.nan, "ttft_p95_s": 2.0})])
    assert "accuracy_mean" not in table.columns
    assert list(table["ttft_p95_s"]) == [1.0, 2.0]


def test_an_older_folder_s_vacuous_one_is_not_measured_either() -> None:
    """Results written before the scores were null say 1.0 beside 0 reference events."""
    old = {"reference_events": 0, "recall_mean": 1.0, "recall_worst": 1.0,
           "recall_share_below_0_5": 0.0}
    assert dict(headline(old))["recall proxy (mean)"] == "n/a (no reference events)"
    assert not measured_recall(old)
    assert measured_recall({**old, "reference_events": 4})
    table = runs_table([_Run("a", {**old, "ttft_p95_s": 1.0}),
                        _Run("b", {**old, "reference_events": 4, "ttft_p95_s": 2.0})])
    assert table["accuracy_mean"].isna().tolist() == [True, False]
