"""vLLM and SGLang refuse a request whose prompt + max_tokens does not fit max_model_len
with HTTP 400, before it runs (they do not cut the output): vLLM above the context
("'max_tokens' ... is too large: M ... (M > C - N)"), SGLang at it too ("Requested token
count exceeds the model's maximum context length", input + max_new_tokens >= context_len).
kvsim's clients send max_tokens = the turn's output tokens, as kvsim replay does."""

import pytest
from core_helpers import req, run_until_idle

from kvsim.core.build import PoolSizing, make_scheduler
from kvsim.core.requests import Status
from kvsim.engines.resolve import resolve_engine
from kvsim.metrics.failures import FAIL_MAX_TOKENS

SIZING = PoolSizing(kv_pool_tokens=4096, slot_tokens=100, kv_reserved_bytes=4096 * 16,
                    num_gpu_blocks=256, block_tokens=16)


def _sched(preset: str):
    return make_scheduler(resolve_engine({"preset": preset, "context_tokens": 100}), SIZING)


@pytest.mark.parametrize("preset,out,refused", [
    ("vllm", 10, False),    # 90 + 10 = 100 = max_model_len: fits
    ("vllm", 11, True),     # 101 > 100
    ("sglang", 9, False),   # 99 < 100
    ("sglang", 10, True),   # 100 >= 100: SGLang refuses a total equal to the context
])
def test_prompt_plus_max_tokens_past_the_context_is_refused(preset, out, refused):
    s = _sched(preset)
    r = req("a#0", [("a", 90)], out=out)
    assert s.add_request(r, 0.0) is not refused
    if refused:
        assert r.status is Status.FAILED and r.failure_reason == FAIL_MAX_TOKENS
        [event] = s.events
        assert (event.kind, event.detail) == (
            "fail", f"prompt 90 + max_tokens {out} = {90 + out} tokens, max_model_len 100")
    else:
        run_until_idle(s)
        assert r.status is Status.FINISHED and r.num_output == out
