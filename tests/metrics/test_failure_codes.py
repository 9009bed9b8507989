"""Failure reasons as data: one code from a closed set beside the engine's own words,
counted per code and per kind in the summary; older folders get their codes on load."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from kvsim.metrics.failures import (
    CODE_KIND,
    FAIL_MAX_LEN,
    FAIL_MAX_TOKENS,
    FAIL_NO_ROOM,
    FAIL_POOL_EXHAUSTED,
    FAIL_PROMPT_TOO_LONG,
    FAIL_QUEUE_FULL,
    FAILURE_CODES,
    failure_code,
    failure_kind,
)
from kvsim.metrics.results import Results
from kvsim.metrics.summary import failed_by_reason


@pytest.mark.parametrize("reason,code", [
    # kvsim's own words, as each engine says them (kvsim.core's schedulers)
    (FAIL_PROMPT_TOO_LONG, "prompt_exceeds_context"),   # llama-server, HTTP 400
    (FAIL_MAX_LEN, "prompt_exceeds_context"),           # vLLM / SGLang
    (FAIL_MAX_TOKENS, "max_tokens_exceed_context"),     # prompt + max_tokens > max_model_len
    (FAIL_QUEUE_FULL, "queue_full"),                    # Ollama past OLLAMA_MAX_QUEUE
    (FAIL_POOL_EXHAUSTED, "kv_exhausted"),              # llama.cpp's unified pool
    (FAIL_NO_ROOM, "kv_exhausted"),                     # more blocks than the pool holds
    # a real server's words, as kvsim replay records them
    ("This model's maximum context length is 8192 tokens. However, you requested 9000 "
     "tokens", "prompt_exceeds_context"),
    ("'max_tokens' is too large: 1000. This model's maximum context length is 8192",
     "max_tokens_exceed_context"),
    ("HTTP 503: server busy, please try again", "queue_full"),
    ("CUDA error: out of memory", "device_out_of_memory"),
    ("error loading model: failed to load", "oom_at_load"),
    ("something else entirely", "engine_error"),
])
def test_every_reason_gets_one_code(reason: str, code: str) -> None:
    assert failure_code(reason) == code
    assert failure_kind(reason) == CODE_KIND[code]


def test_the_set_is_closed_and_unknown_words_count_as_memory() -> None:
    assert set(CODE_KIND) == set(FAILURE_CODES)
    assert {k for k in CODE_KIND.values()} == {"too_long", "busy", "memory"}
    # NOTE: an unrecognised failure is never hidden from the OOM risk
    assert CODE_KIND["engine_error"] == "memory"


def _requests(reasons: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"request_id": [f"s#{i}" for i in range(len(reasons))],
                         "failed": [bool(r) for r in reasons], "failure_reason": reasons})


def test_summary_counts_each_code_and_each_kind() -> None:
    reasons = ["", FAIL_POOL_EXHAUSTED, FAIL_POOL_EXHAUSTED, FAIL_PROMPT_TOO_LONG,
               FAIL_MAX_TOKENS, FAIL_QUEUE_FULL, ""]
    got = failed_by_reason(_requests(reasons))
    # 2 kv_exhausted; 1 prompt_exceeds_context + 1 max_tokens = 2 too long; 1 busy
    assert got["failed_kv_exhausted_requests"] == 2
    assert got["failed_prompt_exceeds_context_requests"] == 1
    assert got["failed_max_tokens_exceed_context_requests"] == 1
    assert got["failed_queue_full_requests"] == 1
    assert (got["failed_too_long_requests"], got["failed_busy_requests"],
            got["failed_memory_requests"]) == (2, 1, 2)
    assert sum(got[f"failed_{c}_requests"] for c in FAILURE_CODES) == 5


def test_a_folder_written_before_failure_codes_loads_with_them(tmp_path, make_results) -> None:
    path = make_results(tmp_path / "r", ["a", "b"])
    req = pd.read_parquet(path / "requests.parquet")
    req["failed"] = [True] + [False] * (len(req) - 1)
    req["failure_reason"] = [FAIL_POOL_EXHAUSTED] + [""] * (len(req) - 1)
    req.drop(columns=["failure_code"], errors="ignore").to_parquet(
        path / "requests.parquet", index=False)
    back = Results.load(path)
    assert list(back.requests["failure_code"]) == ["kv_exhausted"] + [""] * (len(req) - 1)
    assert list(back.requests["failure_reason"])[0] == "Context size has been exceeded."
    copy = shutil.copytree(path, tmp_path / "again")
    back.save(copy)  # saved again, the codes are kept as written
    assert list(pd.read_parquet(copy / "requests.parquet")["failure_code"])[0] == "kv_exhausted"
