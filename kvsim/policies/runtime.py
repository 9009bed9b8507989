"""Policy runtime: block states, PCIe transfers and the accuracy proxy around a scheduler.

:func:`install` wraps a built scheduler's three entry points (``add_request``,
``schedule``, ``memory``) and returns a :class:`PolicyRuntime` that is also the
engine's step hook:

- *admission* (``add_request``): the prompt of a session whose KV lost spans to a
  window/budget policy is the history minus those spans (the model never sees them
  again — StreamingLLM semantics); the turn's reference events are queued;
- *scheduling* (``schedule``): idle slots past ``idle_after_s`` are offloaded; a
  turn admitted in this step is scored (kvsim.metrics.accuracy) from the state of
  the blocks holding each referenced span; demoted/offloaded spans it refers to are
  recalled over the link and the step waits for the copy; quantized tokens add
  their dequantization time; the engine's own prompt-cache saves and restores go
  over the link (FIFO per direction, kvsim.core.link);
- *after each step* (:meth:`after_step`): window, budget and KIVI policies act on
  the slots that grew.

Quantized tokens take fewer bytes: on a unified pool (llama.cpp ``-kvu``) the saved
bytes become free cells (exact capacity effect); ``kv_allocated_bytes`` reports the
exact mixed-precision bytes everywhere.

NOTE: policies that act per token (windows, budgets, KIVI, recall) make
:meth:`next_trigger_s` return *now* while a slot is busy, so a fast-forward never
jumps across one; ``idle_offload`` alone reports its exact next offload time.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from fractions import Fraction
from typing import Any

from kvsim.core.kv.prefix import pieces_in_range
from kvsim.core.requests import seq_len
from kvsim.core.step import EngineEvent
from kvsim.metrics.accuracy import AccuracyConfig, ScoredEvent, classify, multiplier, recall_summary
from kvsim.policies.blocks import (
    DROPPED,
    FULL,
    FULL_BACKED,
    OFFLOADED,
    QUANT,
    QUANT_BACKED,
    Ledger,
    locate,
    pinned_len,
    seq_remove,
    session_references,
)
from kvsim.policies.eviction import score_victims

SINK_TOKENS = 4  # StreamingLLM's attention sinks: always pinned for the COLLAPSE check


class PolicyRuntime:
    """Block-state ledger, transfers and recall scoring for one simulated server."""

    def __init__(self, sched: Any, *, link: Any, accuracy: AccuracyConfig, evict: Any = None,
                 offload: Any = None, bytes_per_token: int, engine_bits: float,
                 quant_ratio: Fraction = Fraction(1), demote_bits: float = 16.0,
                 dequant_s_per_byte: float = 0.0, recompute_s: Any = None,
                 host_backup_bytes: int = 0) -> None:
        self.sched, self.link, self.acc = sched, link, accuracy
        self.evict, self.offload = evict, offload
        self.bpt, self.engine_bits = bytes_per_token, engine_bits
        self.ratio, self.demote_bits = quant_ratio, demote_bits
        self.dequant_s_per_byte = dequant_s_per_byte
        self.recompute_s = recompute_s
        self.host_backup_limit = host_backup_bytes
        pool = getattr(sched, "pool", None)
        self.slots = list(getattr(pool, "slots", ()))
        self.unified = bool(getattr(pool, "unified", False))
        self.base_cells = getattr(pool, "pool_cells", 0)
        self.base_slot_tokens = getattr(pool, "slot_tokens", 0)
        self.ledgers: dict[str, Ledger] = {}
        self.hits: dict[str, dict[str, int]] = {}
        self.refs: dict[tuple[str, int], list[tuple[str, int, int, str]]] = {}
        self.pinned: dict[str, tuple[str, int]] = {}
        self.pending: set[str] = set()
        self.scored: list[ScoredEvent] = []
        self.slot_session: dict[int, str] = {}
        self.wm: dict[int, int] = {}
        self._qcache: dict[int, tuple[Any, int, int]] = {}
        self.backups: deque[tuple[str, str, int, int, int]] = deque()
        self.host_backed_bytes = 0
        self.c = dict.fromkeys(("evicted_tokens", "quantized_tokens", "offload_bytes",
                                "restore_bytes", "recall_bytes", "host_evictions",
                                "restore_recomputes", "offloaded_slots"), 0)
        self._now, self._stall_end = 0.0, 0.0
        self._schedule, self._add, self._memory = sched.schedule, sched.add_request, sched.memory
        sched.schedule, sched.add_request, sched.memory = self.schedule, self.add_request, \
            self.memory
        if hasattr(sched, "restore_time_s"):
            sched.restore_time_s = self._restore_time

    # -- workload ----------------------------------------------------------------------
    def tap(self, sessions: Any):
        """Pass sessions through, remembering their reference events and pinned head."""
        for s in sessions:
            self.register(s)
            yield s

    def register(self, s: Any) -> None:
        head, refs = session_references(s, SINK_TOKENS)
        if head is not None:
            self.pinned[s.session_id] = head
        self.refs.update(refs)

    def _ledger(self, sid: str) -> Ledger:
        led = self.ledgers.get(sid)
        if led is None:
            led = self.ledgers[sid] = Ledger()
        return led

    def _emit(self, t: float, kind: str, rid: str, detail: str, nbytes: int = 0) -> None:
        self.sched.events.append(EngineEvent(t, kind, rid, detail, int(nbytes)))

    # -- scheduler entry points ------------------------------------------------------------
    def add_request(self, req: Any, now_s: float) -> bool:
        led = self.ledgers.get(req.session_id)
        if led is not None:
            gone = led.dropped_ranges()
            if gone:
                req.prompt = seq_remove(req.prompt, gone)
                req.prompt_tokens = seq_len(req.prompt)
        ok = self._add(req, now_s)
        if ok:
            self.pending.add(req.request_id)
        else:
            self.refs.pop((req.session_id, req.turn), None)
        return ok

    def schedule(self, now_s: float) -> Any:
        self._now, self._stall_end = now_s, now_s
        self._time_policies(now_s)
        self._refresh_credits()
        events = self.sched.events
        start = len(events)
        plan = self._schedule(now_s)
        for ev in events[start:]:
            if ev.kind in ("cache_save", "purge_idle_slot") and ev.bytes > 0 and self.link:
                self.link.d2h.reserve(ev.bytes, now_s)
                self.c["offload_bytes"] += ev.bytes
        if plan is None:
            return None
        recall_end = now_s
        dequant = 0.0
        for item in plan.items:
            req = item.req
            if req.request_id in self.pending:
                recall_end = max(recall_end, self._admit(req, now_s))
            if self.dequant_s_per_byte and self.slots and req.slot_id >= 0:
                q = self._qcount(self.slots[req.slot_id])
                dequant += self.dequant_s_per_byte * float(q * self.bpt * self.ratio)
        extra = max(0.0, recall_end - (now_s + plan.extra_s)) + dequant
        return dataclasses.replace(plan, extra_s=plan.extra_s + extra) if extra > 0 else plan

    def memory(self) -> Any:
        m = self._memory()
        q = sum(self._qcount(s) for s in self.slots)
        quant = int(q * self.bpt * self.ratio)
        alloc = m.kv_allocated_bytes - q * self.bpt + quant
        if self.engine_bits < 16:
            quant = alloc
        return dataclasses.replace(m, kv_allocated_bytes=alloc, kv_quant_bytes=quant,
                                   host_kv_bytes=m.host_kv_bytes + self.host_backed_bytes)

    # -- step hook ----------------------------------------------------------------------
    def after_step(self, scheduler: Any, plan: Any, now_s: float) -> float:
        self._time_policies(now_s)
        pol = self.evict
        if pol is None or not self.slots:
            return 0.0
        if getattr(pol, "scope", "session") == "global":
            self._global_budget(now_s)
            return 0.0
        for slot in self.slots:
            if slot.req is not None:
                self._evict_slot(slot, now_s)
        return 0.0

    def next_trigger_s(self, now_s: float) -> float:
        if self.evict is not None and any(s.req is not None for s in self.slots):
            return now_s
        t = math.inf
        if self.offload is not None:
            for s in self.slots:
                if s.req is None and s.n_tokens and s.last_used_s >= 0:
                    t = min(t, max(now_s, s.last_used_s + self.offload.idle_after_s))
        return t

    # -- admission and scoring -------------------------------------------------------------
    def _admit(self, req: Any, now_s: float) -> float:
        """A turn got its slot: refresh block states, score its references; return the
        time its recalls finish."""
        self.pending.discard(req.request_id)
        sid = req.session_id
        led = self._ledger(sid)
        n_past = req.cached_tokens
        if self.slots and req.slot_id >= 0:
            self.slot_session[req.slot_id] = sid
            self.wm[req.slot_id] = min(self.wm.get(req.slot_id, 0), n_past)
            for psid, a, b in pieces_in_range(req.prompt, n_past, req.prompt_tokens):
                led.mark(psid, a, b, FULL, only=(QUANT, QUANT_BACKED, FULL_BACKED))
        refs = self.refs.pop((sid, req.turn), None)
        if not refs:
            return now_s
        head = self.pinned.get(sid)
        collapsed = head is not None and sum(
            b - a for _, a, b in locate(req.prompt, head[0], 0, head[1])) < head[1]
        end = now_s
        hits = self.hits.setdefault(sid, {})
        for seg, lo, hi, content in refs:
            end = max(end, self._score(req, led, seg, lo, hi, content, collapsed, now_s))
            hits[seg] = hits.get(seg, 0) + 1
        return end

    def _score(self, req: Any, led: Ledger, seg: str, lo: int, hi: int, content: str,
               collapsed: bool, now_s: float) -> float:
        runs = locate(req.prompt, seg, lo, hi)
        missing = (hi - lo) - sum(b - a for _, a, b in runs)
        bits, recall, lost = self.engine_bits, 0, False
        if missing:
            off = sum(b - a for a, b, st, _ in led.iter_states(seg, lo, hi) if st == OFFLOADED)
            lost = off < missing or self.link is None
            recall += 0 if lost else missing
        for pos, a, b in runs:
            k = min(b - a, max(0, req.cached_tokens - pos))  # reused from the slot's KV
            for x, y, st, bt in led.iter_states(seg, a, a + k):
                if st == QUANT:
                    bits = min(bits, bt)
                elif st == QUANT_BACKED:
                    recall += y - x
        added, nbytes, end = 0.0, 0, now_s
        if recall and not lost and not collapsed and self.link is not None:
            blk = getattr(self.evict, "block_tokens", 1)
            nbytes = -(-recall // blk) * blk * self.bpt
            _, end = self.link.h2d.reserve(nbytes, now_s)
            added = end - now_s
            self.c["recall_bytes"] += nbytes
        out = classify(collapsed=collapsed, lost=lost, recalled=bool(nbytes), bits=bits,
                       added_s=added)
        m = multiplier(self.acc, out, content)
        self.scored.append(ScoredEvent(now_s, req.session_id, req.request_id, content, out, m))
        self._emit(now_s, "reference", req.request_id,
                   f"{out.name} {content} {seg}[{lo}:{hi}] m={m:.4f} added_s={added:.6g}", nbytes)
        return end

    # -- per-token policies ---------------------------------------------------------------
    def _evict_slot(self, slot: Any, now_s: float) -> None:
        pol = self.evict
        n, seq = slot.n_tokens, tuple(slot.cache)
        pin = pinned_len(seq, pol.sink_tokens, pol.pin_system_prompt)
        recent = pol.keep_recent()
        chunk = pol.chunk_tokens
        if pol.kind == "sliding_window":
            if n > pin + recent + chunk:
                self._drop(slot, pieces_in_range(seq, pin, n - recent), pol.write_back, now_s)
        elif pol.kind == "score_eviction":
            budget = pol.budget_tokens
            if n > pin + budget + chunk:
                cands = pieces_in_range(seq, pin, max(pin, n - recent))
                hits = self.hits.get(self.slot_session.get(slot.slot_id, ""), {})
                self._drop(slot, score_victims(cands, hits, n - pin - budget, pol.block_tokens),
                           False, now_s)
        else:  # kivi / recoverable_eviction: demote old tokens in place
            wm = max(self.wm.get(slot.slot_id, 0), pin)
            end = wm + (n - recent - wm) // chunk * chunk
            if end > wm:
                self._demote(slot, pieces_in_range(seq, wm, end), now_s)
                self.wm[slot.slot_id] = end

    def _demote(self, slot: Any, pieces: list, now_s: float) -> None:
        sid = self.slot_session.get(slot.slot_id, "")
        led = self._ledger(sid)
        backed = self.evict.kind == "recoverable_eviction"
        state = QUANT_BACKED if backed else QUANT
        changed = 0
        for psid, a, b in pieces:
            k = led.mark(psid, a, b, state, self.demote_bits, only=(FULL,))
            changed += k
            if backed and k:
                self._backup(sid, psid, a, b, k * self.bpt)
        if changed:
            self.c["quantized_tokens"] += changed
            nbytes = changed * self.bpt if backed else 0
            if backed and self.link is not None:
                self.link.d2h.reserve(nbytes, now_s)
                self.c["offload_bytes"] += nbytes
            self._emit(now_s, "quantize", slot.req.request_id if slot.req else "",
                       f"{changed} tokens to {self.demote_bits:g} bits"
                       + (" (full copy on host)" if backed else ""), nbytes)
            self._refresh_credits()

    def _drop(self, slot: Any, victims: list, write_back: bool, now_s: float) -> None:
        if not victims:
            return
        sid = self.slot_session.get(slot.slot_id, "")
        led = self._ledger(sid)
        ranges: dict[str, list[tuple[int, int]]] = {}
        k = 0
        for psid, a, b in victims:
            led.mark(psid, a, b, OFFLOADED if write_back else DROPPED)
            ranges.setdefault(psid, []).append((a, b))
            k += b - a
            if write_back:
                self._backup(sid, psid, a, b, (b - a) * self.bpt)
        slot.cache = list(seq_remove(tuple(slot.cache), ranges))
        slot.n_tokens -= k
        self.c["evicted_tokens"] += k
        nbytes = k * self.bpt if write_back else 0
        if write_back and self.link is not None:
            self.link.d2h.reserve(nbytes, now_s)
            self.c["offload_bytes"] += nbytes
        self._emit(now_s, "evict", slot.req.request_id if slot.req else "",
                   f"{k} tokens " + ("offloaded (write-back)" if write_back else "dropped"),
                   nbytes)

    def _global_budget(self, now_s: float) -> None:
        pol = self.evict
        total = sum(s.n_tokens for s in self.slots)
        if total <= pol.budget_tokens + pol.chunk_tokens:
            return
        for slot in sorted(self.slots, key=lambda s: -s.n_tokens):
            if total <= pol.budget_tokens:
                break
            seq, n = tuple(slot.cache), slot.n_tokens
            pin = pinned_len(seq, pol.sink_tokens, pol.pin_system_prompt)
            cands = pieces_in_range(seq, pin, max(pin, n - pol.recent_tokens))
            hits = self.hits.get(self.slot_session.get(slot.slot_id, ""), {})
            before = slot.n_tokens
            self._drop(slot, score_victims(cands, hits, total - pol.budget_tokens,
                                           pol.block_tokens), False, now_s)
            total -= before - slot.n_tokens

    def _backup(self, sid: str, psid: str, a: int, b: int, nbytes: int) -> None:
        """Track a host copy; over the host budget the oldest copies are discarded."""
        self.backups.append((sid, psid, a, b, nbytes))
        self.host_backed_bytes += nbytes
        while self.host_backed_bytes > self.host_backup_limit and self.backups:
            osid, opsid, oa, ob, ob_bytes = self.backups.popleft()
            led = self._ledger(osid)
            led.mark(opsid, oa, ob, QUANT, self.demote_bits, only=(QUANT_BACKED,))
            led.mark(opsid, oa, ob, DROPPED, only=(OFFLOADED,))
            self.host_backed_bytes -= ob_bytes
            self.c["host_evictions"] += 1

    # -- time policies, restores, capacity -----------------------------------------------
    def _time_policies(self, now_s: float) -> None:
        off = self.offload
        if off is None:
            return
        for slot in self.slots:
            if slot.req is not None or not slot.n_tokens or slot.last_used_s < 0:
                continue
            t0 = slot.last_used_s + off.idle_after_s
            if t0 > now_s:
                continue
            saved = 0
            if off.mode == "offload":
                saved = self.sched.ram.save(tuple(slot.cache), t0)
                if self.link is not None:
                    self.link.d2h.reserve(saved, t0)
                self.c["offload_bytes"] += saved
            self.c["offloaded_slots"] += 1
            self._emit(t0, "offload" if saved else "evict", "",
                       f"idle slot {slot.slot_id}: {slot.n_tokens} tokens "
                       + ("to host" if saved else "dropped"), saved)
            slot.clear()
            self.wm[slot.slot_id] = 0

    def _restore_time(self, nbytes: int) -> float:
        """Stall for restoring a saved slot: the h2d copy, or recompute when cheaper."""
        now = self._now
        h2d = self.link.h2d if self.link is not None else None
        if nbytes <= 0:
            return 0.0
        if h2d is None:
            return 0.0
        if self.offload is not None and self.offload.restore == "auto" and self.recompute_s:
            start = max(now, h2d.busy_until_s)
            xfer_end = start + h2d.duration_s(nbytes, start)
            rec_end = now + self.recompute_s(nbytes // self.bpt)
            if rec_end < xfer_end:
                self.c["restore_recomputes"] += 1
                return self._incremental(rec_end)
        _, end = h2d.reserve(nbytes, now)
        self.c["restore_bytes"] += nbytes
        return self._incremental(end)

    def _incremental(self, end: float) -> float:
        prev = self._stall_end
        self._stall_end = max(prev, end)
        return max(0.0, end - prev)

    def _qcount(self, slot: Any) -> int:
        if self.ratio == 1 or not self.slots:
            return 0
        led = self.ledgers.get(self.slot_session.get(slot.slot_id, ""))
        if led is None:
            return 0
        key = self._qcache.get(slot.slot_id)
        if key is not None and key[0] is slot.cache and key[1] == led.version:
            return key[2]
        n = led.count(slot.cache, (QUANT, QUANT_BACKED))
        self._qcache[slot.slot_id] = (slot.cache, led.version, n)
        return n

    def _refresh_credits(self) -> None:
        """Unified pool: bytes saved by quantized tokens become free cells."""
        if self.ratio == 1 or not self.unified:
            return
        saved = sum(self._qcount(s) for s in self.slots) * (1 - self.ratio)
        pool = self.sched.pool
        pool.pool_cells = self.base_cells + int(saved)
        pool.slot_tokens = self.base_slot_tokens + int(saved)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = recall_summary(self.scored)
        out.update(self.c)
        if self.link is not None:
            out.update(self.link.summary())
        return out

