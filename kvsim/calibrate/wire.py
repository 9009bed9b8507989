"""The HTTP side of replay: request bodies, server checks and streamed-response parsing.

Two APIs (``docs/reference/engines.md`` §3.4, §3.7):

- ``llama.cpp``: ``POST /completion`` with a token-id prompt, ``cache_prompt``,
  ``n_predict`` + ``ignore_eos`` so the answer has exactly the trace's length,
  ``return_tokens`` so the generated ids can be fed back in the next turn's prompt
  (then the server's prompt cache sees the same history the simulator does), and
  ``logit_bias`` banning the byte tokens (a byte token can be withheld from the stream
  as partial UTF-8, which would distort the inter-token gaps).  The final event's
  ``timings`` carry ``cache_n`` (prompt tokens reused) and ``prompt_n`` (computed);
  ``timings_per_token`` adds the server's cumulative ``predicted_ms`` to every token
  event, so inter-token gaps are the engine's own, free of the client's scheduling
  jitter (on a busy machine two events can reach the client together).
- ``openai``: ``POST /v1/chat/completions`` streaming (Ollama, vLLM, SGLang), prompts
  as text, usage from ``stream_options.include_usage``.

NOTE: :func:`check_server` runs before any load is sent: an unreachable server or the
wrong API is an :class:`InputError`, never a replay of failed requests.
Streamed answers are read with httpx-sse (:func:`sse_events`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import numpy as np
from httpx_sse import EventSource

from kvsim.errors import InputError
from kvsim.workload.schema import Segment, Session, output_segment

Api = Literal["llama.cpp", "openai"]
# Short words that common BPE vocabularies hold as single tokens (with a leading space).
WORDS = ("the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no", "way", "could", "people", "my", "than", "first", "water", "been", "call", "who", "oil", "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part")


LLAMA_CPP_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0",
                         "q5_1")
"""llama-server ``-ctk``/``-ctv`` values (``docs/reference/engines.md`` §3.2)."""


def server_url(url: str, field: str = "--url") -> str:
    """A server base URL checked before anything connects (trailing ``/`` dropped)."""
    allowed = "an http:// or https:// base URL with a host, e.g. http://127.0.0.1:8080"
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise InputError(field, url, f"not a valid URL; {allowed}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InputError(field, url, allowed)
    return url.rstrip("/")


@dataclass(frozen=True)
class TokenSpace:
    """Token ids a segment may map to: ``[low, high)`` minus ``banned``."""

    low: int = 1000
    high: int = 30000
    banned: tuple[int, ...] = ()

    def segment_ids(self, segment_id: str, n: int) -> list[int]:
        """Deterministic ids for a segment: same id → same tokens in every session."""
        seed = int.from_bytes(hashlib.blake2b(segment_id.encode(), digest_size=8).digest(),
                              "little")
        ids = np.random.default_rng(seed).integers(self.low, self.high, size=n)
        if self.banned:
            bad = np.isin(ids, self.banned)
            ids[bad] = self.low + (ids[bad] - self.low + 1) % (self.high - self.low)
        return ids.tolist()


def segment_text(ids: list[int]) -> str:
    return "".join(" " + WORDS[i % len(WORDS)] for i in ids)


@dataclass
class StreamResult:
    """What one streamed request returned."""

    token_times_s: list[float] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    server_ms: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    final: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # the engine failed the request (HTTP status, an error event)
    transport: str = ""  # no answer from the engine at all (connection refused/lost)


def llama_body(prompt: list[int], n_predict: int, space: TokenSpace, seed: int
               ) -> dict[str, Any]:
    return {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True,
            "cache_prompt": True, "stream": True, "return_tokens": True, "seed": seed,
            "timings_per_token": True,
            "logit_bias": [[t, False] for t in space.banned]}


def openai_body(model: str, messages: list[dict[str, str]], max_tokens: int, seed: int
                ) -> dict[str, Any]:
    return {"model": model, "messages": messages, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            "temperature": 0.0, "seed": seed}


def chat_messages(s: Session, i: int, segs: list[Segment], space: TokenSpace,
                  generated_text: dict[str, str]) -> list[dict[str, str]]:
    """Turn ``i``'s prompt as OpenAI chat messages: earlier outputs as assistant turns
    (the text the server generated, when known), the leading system segments (a
    session's shared prefix and system prompt) as the system message, the rest as user
    text."""
    msgs: list[dict[str, str]] = []
    outs = {output_segment(s, j).id for j in range(i)}
    user: list[str] = []
    system: list[str] = []  # the leading sys/ segments: one system message
    for seg in segs:
        if seg.id in outs:
            msgs.append({"role": "user", "content": "".join(user)})
            user = []
            text = generated_text.get(seg.id)
            msgs.append({"role": "assistant", "content": text if text is not None
                         else segment_text(space.segment_ids(seg.id, seg.tokens))})
        elif seg.id.startswith("sys/") and not user and len(msgs) == int(bool(system)):
            system.append(segment_text(space.segment_ids(seg.id, seg.tokens)))
            msgs[:] = [{"role": "system", "content": "".join(system)}]
        else:
            user.append(segment_text(space.segment_ids(seg.id, seg.tokens)))
    msgs.append({"role": "user", "content": "".join(user)})
    return [m for m in msgs if m["content"] or m["role"] != "user"]


def error_reason(status: int, body: str) -> str:
    """The engine's own wording of an error response (``type`` or ``message``)."""
    try:
        err = json.loads(body).get("error", {})
    except (json.JSONDecodeError, AttributeError):
        return f"HTTP {status}: {body.strip()[:200]}"
    if isinstance(err, dict):
        return str(err.get("type") or err.get("message") or f"HTTP {status}")
    return str(err)


def parse_event(api: Api, data: dict[str, Any], res: StreamResult, now_s: float) -> None:
    """Fold one streamed JSON event into ``res``."""
    if "error" in data:
        res.error = error_reason(500, json.dumps(data))
        return
    if api == "llama.cpp":
        toks = data.get("tokens") or []
        if not data.get("stop"):
            res.tokens.extend(toks)
            res.text += data.get("content", "")
            n = len(toks) or (1 if data.get("content") else 0)
            if n:
                res.token_times_s.append(now_s)
                res.token_counts.append(n)
                ms = (data.get("timings") or {}).get("predicted_ms")
                if ms is not None:
                    res.server_ms.append(float(ms))
        else:
            res.final = data
            if not res.tokens and toks:
                res.tokens = list(toks)
        return
    if data.get("usage"):
        res.usage = data["usage"]
    for choice in data.get("choices") or []:
        piece = (choice.get("delta") or {}).get("content") or ""
        if piece:
            res.text += piece
            res.token_times_s.append(now_s)
            res.token_counts.append(1)


CHECK_TIMEOUT_S = 10.0
"""Default deadline of the server check (``--check-timeout``), wall clock."""
MAX_CHECK_TIMEOUT_S = 3600.0
REQUEST_TIMEOUT_S = 600.0
"""Default deadline of one replayed request, send to last event (``--request-timeout``)."""
MAX_REQUEST_TIMEOUT_S = 86400.0


def check_server(url: str, api: Api, timeout_s: float = CHECK_TIMEOUT_S) -> dict[str, Any]:
    """Confirm the server at ``url`` is up and speaks ``api``; return its props / model list.

    NOTE: ``timeout_s`` bounds the whole check by the wall clock (connect, headers and
    body): a server that trickles its answer a byte at a time cannot hold it, as it
    would a read timeout, which every byte resets.
    """
    return asyncio.run(_check_server(url, api, timeout_s))


async def _check_server(url: str, api: Api, timeout_s: float) -> dict[str, Any]:
    path = "/props" if api == "llama.cpp" else "/v1/models"
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        try:
            async with asyncio.timeout(timeout_s):
                r = await client.get(path)
        except TimeoutError:
            raise InputError("--url", str(client.base_url), f"the server check GET {path} "
                             f"got no complete answer within {timeout_s:g} s "
                             "(--check-timeout); nothing was replayed") from None
        except httpx.HTTPError as exc:
            raise InputError("--url", str(client.base_url),
                             f"server unreachable ({type(exc).__name__}: {exc})") from None
    try:
        body = r.json()
    except ValueError:
        body = None
    ok = isinstance(body, dict) and (
        "default_generation_settings" in body if api == "llama.cpp"
        else isinstance(body.get("data"), list))
    if r.status_code != 200 or not ok:
        other = "openai" if api == "llama.cpp" else "llama.cpp"
        raise InputError("--api", api, f"{client.base_url}{path} answered HTTP "
                         f"{r.status_code} without the {api} shape; is it a {other} server?")
    return body


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of a streamed answer, read with httpx-sse.

    An ``error`` event comes as ``{"error": <its data>}``; ``[DONE]``, empty and non-JSON
    data are skipped.
    NOTE: llama.cpp sends an error after the stream began as a non-standard
    ``error: {...}`` field, which an SSE reader ignores (as the SSE spec says); each such
    line is handed to httpx-sse as the standard ``event: error`` + ``data:``.
    NOTE: the body is read as an event stream whatever its Content-Type says.
    """
    source = EventSource(httpx.Response(200, headers={"content-type": "text/event-stream"},
                                        content=_standard_lines(response)))
    async for sse in source.aiter_sse():
        if not sse.data or sse.data == "[DONE]":
            continue
        try:
            data = json.loads(sse.data)
        except json.JSONDecodeError:
            continue
        if sse.event == "error":
            data = {"error": data}
        if isinstance(data, dict):
            yield data


async def _standard_lines(response: httpx.Response) -> AsyncIterator[bytes]:
    """The body's lines, llama.cpp's ``error:`` field as ``event: error`` (sse_events)."""
    async for line in response.aiter_lines():
        if line.startswith("error:"):
            line = "event: error\ndata:" + line.removeprefix("error:")
        yield (line + "\n").encode()
