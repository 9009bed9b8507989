"""Reference events: score each one from the state of its span, recall and promote.

When a turn is first scheduled, each of its reference events (kvsim.workload.schema
``ReferenceEvent``) is scored by kvsim.metrics.accuracy from where the referenced
tokens are at that moment:

- *slot engines* (llama.cpp / Ollama): from the block-state ledger — tokens the
  window or budget dropped are LOST; demoted tokens read at their bit width
  (DEGRADED) unless a full copy on the host is recalled (RECOVERED, paying
  ``latency + bytes / h2d`` on the link, rounded up to whole pages of the policy's
  ``block_tokens``); offloaded (write-back) tokens are recalled the same way.
- *paged engines* (vLLM / SGLang): the prompt is always the full history, so the
  content is never lost; what changes is where its KV came from — a GPU prefix hit,
  a host-tier load, or a recompute (preempted or evicted blocks re-prefilled).  The
  event is INTACT (DEGRADED below 8 bits of the cache type) and the detail says
  ``via=gpu|host|recompute``; the time a recompute or load costs is already in the
  turn's TTFT, so no recall latency is added.

PROMOTE (kv-policies §6.3): a recalled demoted span becomes FULL_BACKED — its GPU
bytes return to full precision (kv_allocated_bytes grows back) and a later reference
reads it INTACT without another transfer.  A turn whose prompt lost a pinned token —
the sinks, the system prompt or a turn boundary — collapses (§1.8, §6.4).

The pinned head is read from the prompt *as the client sent it* (:meth:`RecallScorer.sent`,
before a policy's dropped spans or the engine's truncation leave it): the system prompt,
else — in a ``history: full`` session — the first ``SINK_TOKENS`` of its first piece.
That is the first tokens of the current *chat*, so after a failure the new chat
(``workload.after_failure: new_chat``, kvsim.core.sessions) pins its own first turn,
not turn 0 of the session.  A span that is not in the sent prompt at all — an old
chat's content, an earlier turn of a ``history: none`` session, the turn's own answer —
is LOST: no host copy can be recalled into a sequence that does not hold it.
"""

from __future__ import annotations

from typing import Any

from kvsim.core.kv.prefix import pieces_in_range
from kvsim.core.requests import Piece, TokenSeq
from kvsim.metrics.accuracy import ScoredEvent, classify, multiplier
from kvsim.policies.blocks import (
    FULL,
    FULL_BACKED,
    OFFLOADED,
    QUANT,
    QUANT_BACKED,
    Ledger,
    locate,
    lost_boundary,
    session_references,
)

SINK_TOKENS = 4  # StreamingLLM's attention sinks: always pinned for the COLLAPSE check


class RecallScorer:
    """Reference events of one run: registered per turn, scored at first schedule."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.refs: dict[tuple[str, int], list[tuple[str, int, int, str]]] = {}
        self.no_history: set[str] = set()  # history none (with references): no chat
        self.hits: dict[str, dict[str, int]] = {}  # session → segment → references so far
        # NOTE: every request admitted and not yet scheduled (the runtime's ``in`` / empty
        # checks); for a turn with references, its pinned head and prompt as sent
        self.pending: dict[str, tuple[Piece | None, TokenSeq] | None] = {}
        self._fresh: list[Any] = []  # requests sent since the last schedule
        self.scored: list[ScoredEvent] = []
        self.via: dict[str, int] = {"gpu": 0, "host": 0, "recompute": 0}

    def register(self, s: Any) -> None:
        refs = session_references(s)
        if refs and s.history != "full":
            self.no_history.add(s.session_id)
        self.refs.update(refs)

    def sent(self, req: Any) -> None:
        """A request arrived (the runtime's ``on_admit``), its prompt still as the client
        sent it: remember its pinned head and that prompt when the turn has references."""
        self._fresh.append(req)
        if (req.session_id, req.turn) not in self.refs:
            self.pending[req.request_id] = None
            return
        head = prompt_head(req.prompt, req.session_id not in self.no_history)
        self.pending[req.request_id] = (head, req.prompt)

    def forget_rejected(self) -> None:
        """Drop the requests the scheduler refused at entry since the last schedule: they
        will never be scheduled (left pending, they would keep the runtime's per-plan
        check on for the rest of the run).

        NOTE: a scheduler refuses a request inside ``add_request``, right after the
        runtime's ``on_admit``, so each request sent is looked at once, at the next
        schedule."""
        for req in self._fresh:
            if req.failure_reason:
                self.pending.pop(req.request_id, None)
        self._fresh.clear()

    def admit(self, req: Any, now_s: float) -> float:
        """A turn got its KV: refresh block states, score its references; return the
        time its recalls finish."""
        entry = self.pending.pop(req.request_id, None)
        rt = self.rt
        sid = req.session_id
        led = rt.ledger(sid)
        n_past = req.cached_tokens
        if rt.slots and req.slot_id >= 0:
            rt.slot_session[req.slot_id] = sid
            rt.wm[req.slot_id] = min(rt.wm.get(req.slot_id, 0), n_past)
            spans = led.spans  # NOTE: a segment without spans is all FULL: nothing to mark
            if spans:
                for psid, a, b in pieces_in_range(req.prompt, n_past, req.prompt_tokens):
                    if psid in spans:
                        led.mark(psid, a, b, FULL, only=(QUANT, QUANT_BACKED, FULL_BACKED))
        refs = self.refs.pop((sid, req.turn), None)
        if not refs:
            return now_s
        head, sent = entry if entry is not None else (None, None)
        collapsed = (head is not None and _held(req.prompt, head) < head[2] - head[1]) \
            or lost_boundary(led, req.prompt)
        end = now_s
        hits = self.hits.setdefault(sid, {})
        for seg, lo, hi, content in refs:
            if rt.slots:
                end = max(end, self._score(req, led, (seg, lo, hi), content, collapsed,
                                           sent, now_s))
            else:
                self._score_paged(req, seg, lo, hi, content, now_s)
            hits[seg] = hits.get(seg, 0) + 1
        return end

    def _record(self, req: Any, now_s: float, out: Any, content: str, where: str,
                nbytes: int) -> None:
        m = multiplier(self.rt.acc, out, content)
        self.scored.append(ScoredEvent(now_s, req.session_id, req.request_id, content, out, m))
        self.rt.emit(now_s, "reference", req.request_id,
                     f"{out.name} {content} {where} m={m:.4f} added_s={out.added_s:.6g}",
                     nbytes)

    def _score_paged(self, req: Any, seg: str, lo: int, hi: int, content: str,
                     now_s: float) -> None:
        """Full-history prompt: the span is read at the cache's precision; note its source."""
        gpu = req.cached_tokens - self.rt.loaded_tokens(req)
        host = req.cached_tokens
        runs = locate(req.prompt, seg, lo, hi)
        start = min((p for p, _, _ in runs), default=0)
        end = max((p + b - a for p, a, b in runs), default=0)
        via = "gpu" if end <= gpu else "host" if end <= host else "recompute"
        self.via[via] += 1
        out = classify(collapsed=False, lost=not runs, recalled=False, bits=self.rt.engine_bits)
        self._record(req, now_s, out, content, f"{seg}[{lo}:{hi}] via={via} at={start}", 0)

    def _score(self, req: Any, led: Ledger, span: Piece, content: str, collapsed: bool,
               sent: TokenSeq | None, now_s: float) -> float:
        """Score one reference to ``span`` on a slot engine (``sent``: the prompt as sent).

        NOTE: only tokens the sent prompt holds can come back from the host; a span (part)
        absent from it is LOST whatever the ledger says of it (an old chat's content).
        """
        rt = self.rt
        seg, lo, hi = span
        runs = locate(req.prompt, seg, lo, hi)
        missing = (hi - lo) - sum(b - a for _, a, b in runs)
        bits, recall, lost = rt.engine_bits, 0, False
        promote: list[tuple[int, int]] = []
        miss_bits: float | None = bits  # NOTE: a selector miss reads the GPU's copy...
        if missing:
            off = sum(b - a for a, b, st, _ in led.iter_states(seg, lo, hi) if st == OFFLOADED)
            absent = 0 if sent is None else (hi - lo) - _held(sent, span)
            lost = absent > 0 or off < missing or rt.link is None
            recall += 0 if lost else missing
            miss_bits = None  # ...but an offloaded part has none: the miss is LOST
        for pos, a, b in runs:
            k = min(b - a, max(0, req.cached_tokens - pos))  # reused from the slot's KV
            for x, y, st, bt in led.iter_states(seg, a, a + k):
                if st == QUANT:
                    bits = min(bits, bt)
                elif st == QUANT_BACKED:
                    recall += y - x
                    promote.append((x, y))
                    miss_bits = None if miss_bits is None else min(miss_bits, bt)
        added, nbytes, end = 0.0, 0, now_s
        if recall and not lost and not collapsed and rt.link is not None:
            blk = rt.evict.page_tokens
            nbytes = -(-recall // blk) * blk * rt.bpt
            _, end = rt.link.h2d.reserve(nbytes, now_s)
            added = end - now_s
            rt.c["recall_bytes"] += nbytes
            for x, y in promote:  # PROMOTE: the full copy now sits on the GPU too
                rt.c["promoted_tokens"] += led.mark(seg, x, y, FULL_BACKED,
                                                    only=(QUANT_BACKED,))
            if promote:
                rt.refresh_credits()
        out = classify(collapsed=collapsed, lost=lost, recalled=bool(nbytes), bits=bits,
                       added_s=added, kept=_kept_share(led, req.prompt_tokens) if lost else 1.0,
                       miss_bits=None if miss_bits is None else min(miss_bits, bits))
        self._record(req, now_s, out, content, f"{seg}[{lo}:{hi}]", nbytes)
        return end


def prompt_head(prompt: TokenSeq, full_history: bool) -> Piece | None:
    """The pinned head of a prompt as sent: its system prompt, else (``full_history``)
    the first ``SINK_TOKENS`` of its first piece; None for an independent request
    without a system prompt.

    NOTE: a ``history: full`` prompt starts with its chat's first tokens (kvsim.core.
    sessions), so this is the chat's head: turn 0's for the first chat, the first turn
    of a new chat after a failure.
    """
    if not prompt:
        return None
    sid, a, b = prompt[0]
    if sid.startswith("sys/"):
        return sid, a, b
    return (sid, a, a + min(SINK_TOKENS, b - a)) if full_history else None


def _held(seq: TokenSeq, span: Piece) -> int:
    """Tokens of content ``span`` that ``seq`` holds."""
    return sum(b - a for _, a, b in locate(seq, *span))


def _kept_share(led: Ledger, kept_tokens: int) -> float:
    """Share of the session's context the model still reads: the prompt it is given
    over that plus every span dropped or offloaded from it."""
    gone = sum(b - a for spans in led.dropped_ranges().values() for a, b in spans)
    return kept_tokens / max(kept_tokens + gone, 1)
