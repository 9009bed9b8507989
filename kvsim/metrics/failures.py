"""Why a request failed: one reason from a closed set, the engine's own words beside it.

Every failed request keeps the engine's message (``failure_reason``, as llama-server,
vLLM, SGLang or Ollama words it) and gets one **code** from :data:`FAILURE_CODES`
(``failure_code``, :func:`failure_code`):

- ``prompt_exceeds_context``: the prompt alone is longer than the context the engine
  was started with (llama-server's ``exceed_context_size_error``, vLLM / SGLang's
  maximum context length), however idle the server;
- ``max_tokens_exceed_context``: the prompt fits, but prompt + ``max_tokens`` passes
  ``max_model_len`` and the engine refuses it up front (vLLM, SGLang);
- ``queue_full``: refused because too many requests waited (Ollama's ``server busy``,
  HTTP 503 past ``OLLAMA_MAX_QUEUE``);
- ``kv_exhausted``: the KV memory ran out under load (llama.cpp's unified pool
  exhausted — "Context size has been exceeded." —, a request needing more KV blocks
  than the pool holds);
- ``device_out_of_memory``: a real server's CUDA / Metal allocation failure while
  serving (``kvsim replay``);
- ``oom_at_load``: the engine could not load the model and its KV pool (a plan point
  or sweep point that does not start; a replayed server's load failure);
- ``engine_error``: words kvsim does not recognise (a real server's, from ``kvsim
  replay``).

Codes group into three **kinds** a user acts on differently (:data:`CODE_KIND`):
``too_long`` (raise the context or shorten the conversation — more memory at the same
settings does not help), ``busy``, and ``memory`` (more KV memory helps). An
``engine_error`` counts as ``memory`` so that an unknown failure is never hidden from
the OOM risk.

Preemption is no failure: vLLM and SGLang recompute a preempted request
(docs/reference/engines.md §1.4, §2.3); the summary counts ``preemptions`` apart.

NOTE: only ``memory`` kinds are OOM-class (kvsim.plan.replicate.oom_reason); the summary
counts each code and each kind (kvsim.metrics.summary).
Design: docs/design/answers.md.
"""

from __future__ import annotations

from typing import Literal

# The engines' own wording of each failure kvsim simulates (kvsim.core's schedulers)
FAIL_MAX_LEN = "maximum context length exceeded"
FAIL_NO_ROOM = "needs more KV blocks than the pool holds"
FAIL_MAX_TOKENS = "prompt + max_tokens exceed the maximum context length"
FAIL_PROMPT_TOO_LONG = "exceed_context_size_error"
FAIL_POOL_EXHAUSTED = "Context size has been exceeded."
FAIL_QUEUE_FULL = "server busy"  # docs/reference/engines.md §4.1: HTTP 503 past OLLAMA_MAX_QUEUE

FailureKind = Literal["too_long", "busy", "memory"]
FAILURE_KINDS: tuple[FailureKind, ...] = ("too_long", "busy", "memory")
FailureCode = Literal["prompt_exceeds_context", "max_tokens_exceed_context", "queue_full",
                      "kv_exhausted", "device_out_of_memory", "oom_at_load", "engine_error"]
FAILURE_CODES: tuple[FailureCode, ...] = (
    "prompt_exceeds_context", "max_tokens_exceed_context", "queue_full", "kv_exhausted",
    "device_out_of_memory", "oom_at_load", "engine_error")
CODE_KIND: dict[str, FailureKind] = {
    "prompt_exceeds_context": "too_long", "max_tokens_exceed_context": "too_long",
    "queue_full": "busy", "kv_exhausted": "memory", "device_out_of_memory": "memory",
    "oom_at_load": "memory", "engine_error": "memory"}
CODE_WORDS = {  # what a user reads for each code
    "prompt_exceeds_context": "prompt longer than the context",
    "max_tokens_exceed_context": "prompt + max_tokens past the context",
    "queue_full": "refused busy (queue full)",
    "kv_exhausted": "KV memory exhausted under load",
    "device_out_of_memory": "device out of memory while serving",
    "oom_at_load": "the engine could not load",
    "engine_error": "an engine error kvsim does not recognise"}
FAILURE_CODE = "failure_code"  # the requests table's column

_EXACT: dict[str, FailureCode] = {
    FAIL_PROMPT_TOO_LONG: "prompt_exceeds_context", FAIL_MAX_LEN: "prompt_exceeds_context",
    FAIL_MAX_TOKENS: "max_tokens_exceed_context", FAIL_QUEUE_FULL: "queue_full",
    FAIL_POOL_EXHAUSTED: "kv_exhausted", FAIL_NO_ROOM: "kv_exhausted"}
# A real server's words (kvsim replay), lower-cased, first match wins
_WORDS: tuple[tuple[FailureCode, tuple[str, ...]], ...] = (
    ("max_tokens_exceed_context", ("max_tokens", "max_completion_tokens")),
    ("prompt_exceeds_context", ("maximum context length", "exceeds the available context size",
                                "exceed_context_size", "context length exceeded",
                                "is longer than the model's context length")),
    ("queue_full", ("server busy", "too many requests")),
    ("kv_exhausted", ("context size has been exceeded", "kv blocks")),
    ("oom_at_load", ("failed to load", "error loading model", "unable to load model")),
    ("device_out_of_memory", ("out of memory", "cudamalloc failed", "failed to allocate")))


def failure_code(reason: str) -> FailureCode:
    """The code of a failure reason (kvsim's own or a real server's, as replay records it)."""
    if reason in _EXACT:
        return _EXACT[reason]
    low = reason.lower()
    if low.startswith("http 503"):
        return "queue_full"
    for code, words in _WORDS:
        if any(w in low for w in words):
            return code
    return "engine_error"


def failure_kind(reason: str) -> FailureKind:
    """The kind of a failure reason: its code's (:data:`CODE_KIND`)."""
    return CODE_KIND[failure_code(reason)]
