"""Demoting precision adds no context positions (the quickstart oddity): a prompt longer
than llama-server's context fails with ``exceed_context_size_error`` whatever the policy.
What a demoting policy does give on a unified pool is room: its demoted tokens take fewer
bytes, which become free cells for all slots (kvsim.policies.runtime), so the requests
that failed only because the pool ran out ("Context size has been exceeded.") run."""

import pandas as pd
import pytest

from kvsim.api import simulate
from kvsim.scenario import load_scenario

POLICY = "policies=[{kind: recoverable_eviction, window_tokens: 4096, cache_type: q4_0}]"
TOO_LONG = "teen-2-d0-05#7"  # a 16,789-token prompt against -c 16384 (4 unified slots)


@pytest.fixture(scope="module")
def runs() -> dict[str, pd.DataFrame]:
    # seed 2's day has two requests the unified pool cannot hold (and none too long)
    return {name: simulate(load_scenario("quickstart", sets)).requests
            for name, sets in (("plain", []), ("demoting", [POLICY]),
                               ("plain2", ["seed=2"]), ("demoting2", ["seed=2", POLICY]))}


def test_a_prompt_longer_than_the_context_fails_whatever_the_policy(runs):
    for reqs in (runs["plain"], runs["demoting"]):
        row = reqs.set_index("request_id").loc[TOO_LONG]
        assert row.prompt_tokens == 16789 and row.status == "failed"
        assert row.failure_reason == "exceed_context_size_error"


def test_demoted_bytes_become_room_not_positions(runs):
    plain, demoting = (r.set_index("request_id") for r in (runs["plain2"], runs["demoting2"]))
    exhausted = plain.index[plain.failure_reason == "Context size has been exceeded."]
    assert list(plain.index[plain.status == "failed"]) == list(exhausted) and \
        len(exhausted) == 2
    # the pool-exhausted requests all run once demoted tokens free cells ...
    assert (demoting.loc[exhausted, "status"] == "finished").all()
    # ... and what fails then no policy can help: a session that now goes on grows a
    # prompt past -c (16,388 tokens against a slot's 16,384)
    left = demoting[demoting.status == "failed"]
    assert len(left) >= 1 and set(left.failure_reason) == {"exceed_context_size_error"}
    assert (left.prompt_tokens > 16384).all()
