"""The ``references`` table: recorded from the recall scorer, saved and loaded as Parquet,
and read back from ``events`` for folders written before the table existed."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvsim.api import simulate
from kvsim.errors import InputError
from kvsim.metrics.accuracy import LOST, Outcome, ScoredEvent
from kvsim.metrics.results import (
    REFERENCE_COLUMNS,
    Results,
    references_frame,
    references_from_events,
)
from kvsim.scenario import load_scenario
from kvsim.workload.schema import ReferenceEvent, Session, Turn


def _ref(lo: int, content: str) -> ReferenceEvent:
    return ReferenceEvent(turn=0, part="input", offset_tokens=lo, length_tokens=16,
                          content=content)


@pytest.fixture(scope="module")
def res() -> Results:
    """Session a: a 3000-token turn whose spans a 1024-token window drops (LOST: exact
    0.1, gist 0.9); session b: a 300-token turn, still in the window (INTACT 1.0)."""
    a = Session(session_id="a", turns=(
        Turn(start_s=0.0, input_tokens=3000, output_tokens=50),
        Turn(think_s=5.0, input_tokens=20, output_tokens=10,
             references=(_ref(96, "exact"), _ref(100, "gist")))))
    b = Session(session_id="b", turns=(
        Turn(start_s=100.0, input_tokens=300, output_tokens=20),
        Turn(think_s=5.0, input_tokens=20, output_tokens=10, references=(_ref(10, "exact"),))))
    sc = load_scenario("quickstart", ["engine.context_tokens=16384", "engine.parallel=1",
                                      "policies=[{kind: sliding_window, window_tokens: 1024}]"])
    return simulate(sc, sessions=[a, b])


def test_simulate_records_one_row_per_scored_reference(res: Results) -> None:
    ref = res.references
    assert tuple(ref.columns) == REFERENCE_COLUMNS
    assert ref[["session_id", "request_id", "content", "outcome", "score"]].values.tolist() == [
        ["a", "a#1", "exact", "LOST", 0.1], ["a", "a#1", "gist", "LOST", 0.9],
        ["b", "b#1", "exact", "INTACT", 1.0]]
    assert ref["bits"].tolist() == [16.0] * 3 and ref["added_s"].tolist() == [0.0] * 3
    # the same events as the summary's recall keys, and as the events table's rows
    assert res.summary["reference_events"] == 3
    assert ref["score"].mean() == res.summary["recall_mean"] == pytest.approx(2 / 3)
    assert (ref["score"] < 0.5).mean() == res.summary["recall_share_below_0_5"]
    assert ref["time_s"].tolist() == res.events[res.events["kind"] == "reference"][
        "time_s"].tolist()


def test_references_round_trip_through_parquet(res: Results, tmp_path) -> None:
    path = res.save(tmp_path / "run")
    assert json.loads((path / "meta.json").read_text())["tables"] == [
        "requests", "itl", "steps", "memory", "events", "references"]
    back = Results.load(path)
    pd.testing.assert_frame_equal(back.references, res.references)
    assert back.path == str(path)


def test_older_folder_without_the_table_reads_them_from_events(res: Results, tmp_path) -> None:
    path = res.save(tmp_path / "old")
    (path / "references.parquet").unlink()
    meta = json.loads((path / "meta.json").read_text())
    meta["tables"] = meta["tables"][:5]
    (path / "meta.json").write_text(json.dumps(meta))
    back = Results.load(path)
    # the event details carry the precision only for DEGRADED (and the score to 4 places)
    assert back.references["bits"].isna().all()
    pd.testing.assert_frame_equal(back.references.drop(columns="bits"),
                                  res.references.drop(columns="bits"))


def test_damaged_references_table_is_named(res: Results, tmp_path) -> None:
    path = res.save(tmp_path / "bad")
    (path / "references.parquet").write_text("not parquet")
    with pytest.raises(InputError, match="references.parquet"):
        Results.load(path)


def test_references_from_event_details() -> None:
    events = pd.DataFrame({
        "time_s": [1.0, 2.0, 3.0, 4.0], "kind": ["reference", "evict", "reference", "reference"],
        "request_id": ["s#1", "s#1", "s#2", "gone#3"],
        "detail": ["DEGRADED(4.5) exact s/t0/in[0:8] m=0.9700 added_s=0", "x",
                   "RECOVERED gist s/t1/in[2:9] via=host at=12 m=1.0000 added_s=0.0125",
                   "COLLAPSE exact gone/t0/in[0:4] m=0.0500 added_s=0"],
        "bytes": [0, 0, 4096, 0]})
    requests = pd.DataFrame({"request_id": ["s#1", "s#2"], "session_id": ["sess", "sess"]})
    ref = references_from_events(events, requests)
    assert ref.values.tolist() == [
        [1.0, "sess", "s#1", "exact", "DEGRADED", 4.5, 0.0, 0.97],
        [3.0, "sess", "s#2", "gist", "RECOVERED", pytest.approx(float("nan"), nan_ok=True),
         0.0125, 1.0],
        [4.0, "gone", "gone#3", "exact", "COLLAPSE", pytest.approx(float("nan"), nan_ok=True),
         0.0, 0.05]]


def test_results_without_references_and_without_events_have_an_empty_table() -> None:
    empty = {c: [] for c in ("time_s", "kind", "request_id", "detail", "bytes")}
    frames = {n: pd.DataFrame() for n in ("requests", "itl", "steps", "memory")}
    res = Results(**frames, events=pd.DataFrame(empty), summary={})
    assert tuple(res.references.columns) == REFERENCE_COLUMNS and len(res.references) == 0


def test_references_frame_from_scored_events() -> None:
    ev = ScoredEvent(2.5, "s", "s#3", "gist", Outcome(LOST, 8.0, 0.0, kept=0.1), 0.65)
    assert references_frame([ev]).values.tolist() == [
        [2.5, "s", "s#3", "gist", "LOST", 8.0, 0.0, 0.65]]
