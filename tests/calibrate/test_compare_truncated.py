"""kvsim compare on an engine that truncates prompts (Ollama, docs/reference/engines.md §4.5).

The prediction records the prompt as the client sent it and what the engine dropped
(``truncated_prompt_tokens``); an OpenAI-style server (Ollama) reports the prompt it
kept as ``usage.prompt_tokens``.  compare judges the prompt the engine read on both
sides, so a correct prediction of a truncation is a match, not a 300-token error.
"""

from __future__ import annotations

import dataclasses

from kvsim.calibrate.validate import compare_requests, compare_results
from kvsim.metrics.results import Results


def _pair(tmp_path, make_results) -> tuple[Results, Results]:
    m = Results.load(make_results(tmp_path / "m", ["a#0", "b#0"], source="measured"))
    p = Results.load(make_results(tmp_path / "p", ["a#0", "b#0"]))
    # a#0: sent 1,300 tokens, Ollama kept 1,000 (cached 200 + computed 800); b#0 untouched
    counts = {"cached_tokens": [200, 0], "computed_prompt_tokens": [800, 500]}
    m = dataclasses.replace(m, requests=m.requests.assign(
        prompt_tokens=[1000, 500], truncated=[True, False], **counts))
    p = dataclasses.replace(p, requests=p.requests.assign(
        prompt_tokens=[1300, 500], truncated_prompt_tokens=[300, 0], truncated=[True, False],
        **counts))
    return m, p


def test_a_predicted_truncation_matches_the_servers_kept_prompt(tmp_path, make_results):
    m, p = _pair(tmp_path, make_results)
    per = compare_requests(m, p).set_index("request_id")
    assert per["prompt_tokens_predicted"].tolist() == [1000, 500]
    assert per["prompt_tokens_equal"].all()
    table = compare_results(m, p).set_index("metric")
    assert table.loc["prompt_tokens", "measured"] == table.loc["prompt_tokens", "predicted"] \
        == 1500.0
