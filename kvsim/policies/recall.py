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
"""

from __future__ import annotations

from typing import Any

from kvsim.core.kv.prefix import pieces_in_range
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
        self.pinned: dict[str, tuple[str, int]] = {}
        self.hits: dict[str, dict[str, int]] = {}  # session → segment → references so far
        self.pending: set[str] = set()
        self.scored: list[ScoredEvent] = []
        self.via: dict[str, int] = {"gpu": 0, "host": 0, "recompute": 0}

    def register(self, s: Any) -> None:
        head, refs = session_references(s, SINK_TOKENS)
        if head is not None:
            self.pinned[s.session_id] = head
        self.refs.update(refs)

    def admit(self, req: Any, now_s: float) -> float:
        """A turn got its KV: refresh block states, score its references; return the
        time its recalls finish."""
        self.pending.discard(req.request_id)
        rt = self.rt
        sid = req.session_id
        led = rt.ledger(sid)
        n_past = req.cached_tokens
        if rt.slots and req.slot_id >= 0:
            rt.slot_session[req.slot_id] = sid
            rt.wm[req.slot_id] = min(rt.wm.get(req.slot_id, 0), n_past)
            for psid, a, b in pieces_in_range(req.prompt, n_past, req.prompt_tokens):
                led.mark(psid, a, b, FULL, only=(QUANT, QUANT_BACKED, FULL_BACKED))
        refs = self.refs.pop((sid, req.turn), None)
        if not refs:
            return now_s
        head = self.pinned.get(sid)
        collapsed = (head is not None and sum(
            b - a for _, a, b in locate(req.prompt, head[0], 0, head[1])) < head[1]) \
            or lost_boundary(led, req.prompt)
        end = now_s
        hits = self.hits.setdefault(sid, {})
        for seg, lo, hi, content in refs:
            if rt.slots:
                end = max(end, self._score(req, led, seg, lo, hi, content, collapsed, now_s))
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

    def _score(self, req: Any, led: Ledger, seg: str, lo: int, hi: int, content: str,
               collapsed: bool, now_s: float) -> float:
        rt = self.rt
        runs = locate(req.prompt, seg, lo, hi)
        missing = (hi - lo) - sum(b - a for _, a, b in runs)
        bits, recall, lost = rt.engine_bits, 0, False
        promote: list[tuple[int, int]] = []
        if missing:
            off = sum(b - a for a, b, st, _ in led.iter_states(seg, lo, hi) if st == OFFLOADED)
            lost = off < missing or rt.link is None
            recall += 0 if lost else missing
        for pos, a, b in runs:
            k = min(b - a, max(0, req.cached_tokens - pos))  # reused from the slot's KV
            for x, y, st, bt in led.iter_states(seg, a, a + k):
                if st == QUANT:
                    bits = min(bits, bt)
                elif st == QUANT_BACKED:
                    recall += y - x
                    promote.append((x, y))
        added, nbytes, end = 0.0, 0, now_s
        if recall and not lost and not collapsed and rt.link is not None:
            blk = getattr(rt.evict, "block_tokens", 1)
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
                       added_s=added, kept=_kept_share(led, req.prompt_tokens) if lost else 1.0)
        self._record(req, now_s, out, content, f"{seg}[{lo}:{hi}]", nbytes)
        return end


def _kept_share(led: Ledger, kept_tokens: int) -> float:
    """Share of the session's context the model still reads: the prompt it is given
    over that plus every span dropped or offloaded from it."""
    gone = sum(b - a for spans in led.dropped_ranges().values() for a, b in spans)
    return kept_tokens / max(kept_tokens + gone, 1)
