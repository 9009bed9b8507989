"""Why a request failed, in three kinds a user acts on differently.

- ``too_long``: the request cannot fit the context the engine was started with, however
  idle the server (llama-server's ``exceed_context_size_error``, vLLM / SGLang's maximum
  context length, prompt + max_tokens past it): raise the context or shorten the
  conversation — more memory at the same settings does not help;
- ``busy``: refused because too many requests waited (Ollama's queue limit, HTTP 503);
- ``memory``: the KV memory ran out under load (llama.cpp's unified pool exhausted, a
  request needing more blocks than the pool holds) — and any reason kvsim does not
  recognise (a real server's words from ``kvsim replay``), counted as memory so that an
  unknown failure is never hidden from the OOM risk.

NOTE: only ``memory`` failures are OOM-class (kvsim.plan.replicate.oom_reason); the
summary counts each kind (kvsim.metrics.summary).
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
TOO_LONG = frozenset({FAIL_PROMPT_TOO_LONG, FAIL_MAX_LEN, FAIL_MAX_TOKENS})
BUSY = frozenset({FAIL_QUEUE_FULL})
_TOO_LONG_WORDS = ("maximum context length", "exceeds the available context size",
                   "exceed_context_size", "is longer than the model's context length")


def failure_kind(reason: str) -> FailureKind:
    """The kind of a failure reason (kvsim's own or a real server's, as replay records it)."""
    if reason in TOO_LONG or any(w in reason.lower() for w in _TOO_LONG_WORDS):
        return "too_long"
    if reason in BUSY or reason.startswith("HTTP 503"):
        return "busy"
    return "memory"
