"""The recorder builds request rows positionally: they equal the keyword-built row."""

import math

from kvsim.core.requests import Request, Status
from kvsim.metrics.records import Recorder
from kvsim.metrics.rows import RequestRow


def test_the_recorded_row_is_the_keyword_built_row():
    # NOTE: every field a distinct value, so a swapped pair of fields cannot pass
    req = Request(request_id="s#3", session_id="s", turn=3, arrival_s=1.0,
                  prompt=(("s/sys", 0, 40),), output_id="s/t3/out", max_output_tokens=9,
                  member="m", kind="chat", prompt_tokens=40, status=Status.FINISHED,
                  num_output=7, first_scheduled_s=1.5, first_token_s=2.25, finish_s=4.125,
                  cached_tokens=11, computed_prompt_tokens=29, recomputed_tokens=5,
                  preemptions=2, truncated=True, truncated_prompt_tokens=13)
    rec = Recorder()
    rec.request_done(req)
    want = RequestRow(
        request_id="s#3", session_id="s", turn=3, member="m", kind="chat", arrival_s=1.0,
        first_scheduled_s=1.5, first_token_s=2.25, finish_s=4.125, queue_s=0.5, ttft_s=1.25,
        e2e_s=3.125, prompt_tokens=53, cached_tokens=11, computed_prompt_tokens=29,
        recomputed_tokens=5, output_tokens=7, preemptions=2, failed=False, failure_reason="",
        truncated=True, truncated_prompt_tokens=13)
    got = rec.request_rows[0]
    assert type(got) is RequestRow
    assert got[:-4] == want[:-4]
    assert all(math.isnan(x) for x in (*got[-4:], *want[-4:]))


def test_a_failed_request_row_has_no_e2e():
    req = Request(request_id="s#0", session_id="s", turn=0, arrival_s=0.0,
                  prompt=(("s/sys", 0, 4),), output_id="s/t0/out", max_output_tokens=1,
                  status=Status.FAILED, failure_reason="oom")
    rec = Recorder()
    rec.request_done(req)
    row = rec.request_rows[0]
    assert (row.failed, row.failure_reason) == (True, "oom") and math.isnan(row.e2e_s)
