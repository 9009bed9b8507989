"""Per-token transitions on slot engines' KV: windows, budgets, demotion, host copies.

After every step the eviction-family policy (kvsim.policies.eviction /
quantization) acts on each busy slot:

- ``sliding_window``: tokens older than the window (beyond the pinned head and the
  turn boundaries) are DROPPED — or OFFLOADED with ``write_back`` (copied to host
  first, device→host on the link);
- ``score_eviction``: above the budget, the lowest-score blocks outside the recent
  window go (per session, or ``scope: global`` over all slots, largest first);
- ``kivi`` / ``recoverable_eviction``: tokens older than the recent window are
  demoted in place in ``chunk_tokens`` steps (QUANT, or QUANT_BACKED with the full
  copy written to host).

Host copies are bounded by the host's KV budget: over it, the oldest copies are
discarded (a QUANT_BACKED span falls back to QUANT, an OFFLOADED one to DROPPED).

NOTE: the slot's token sequence (``slot.cache``) and ``n_tokens`` are edited in
place, so the engine's prompt-cache reuse sees exactly what is left.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from kvsim.core.kv.prefix import pieces_in_range
from kvsim.core.kv.slots import Slot
from kvsim.policies.base import EvictionPolicy
from kvsim.policies.blocks import (
    DROPPED,
    FULL,
    OFFLOADED,
    QUANT,
    QUANT_BACKED,
    pinned_len,
    seq_remove,
    unpinned,
)
from kvsim.policies.eviction import score_victims


class SlotEvictor:
    """The scenario's eviction-family policy applied to a slot engine's slots."""

    def __init__(self, rt: Any, pol: EvictionPolicy, host_limit_bytes: int) -> None:
        self.rt, self.pol = rt, pol
        self.host_limit_bytes = host_limit_bytes
        self.backups: deque[tuple[str, str, int, int, int]] = deque()
        self.host_backed_bytes = 0
        self.global_budget = pol.global_budget_tokens()

    def _boundary(self) -> int:
        return self.pol.boundary_tokens if self.pol.pin_turn_boundaries else 0

    def after_step(self, now_s: float) -> None:
        if self.global_budget is not None:
            self._global_budget(now_s, self.global_budget)
            return
        for slot in self.rt.slots:
            if slot.req is not None:
                self._evict_slot(slot, now_s)

    def quiet_steps(self) -> float:
        """Decode steps (each adding one token to every busy slot) after each of which
        :meth:`after_step` changes nothing: 0 when it may act after the next one.

        NOTE: the thresholds of :meth:`_evict_slot` solved for the step count: after
        decode step ``k`` (from 0) a slot holds ``n + k + 1`` tokens.  A window or
        budget acts once that exceeds ``pin + keep + chunk``; a demotion once it reaches
        ``wm + recent + chunk`` (the watermark only moves when it acts).
        """
        if self.global_budget is not None:
            return 0
        pol, quiet = self.pol, math.inf
        for slot in self.rt.slots:
            if slot.req is None:
                continue
            n = slot.n_tokens
            pin = pinned_len(slot.cache, pol.sink_tokens, pol.pin_system_prompt)
            wm = max(self.rt.wm.get(slot.slot_id, 0), pin)
            steps = pol.quiet_steps(n, pin, wm)
            quiet = min(quiet, max(steps, 0))
        return quiet

    def _evict_slot(self, slot: Slot, now_s: float) -> None:
        self.pol.act(self, slot, now_s)

    def drop_window(self, slot: Slot, now_s: float, write_back: bool) -> None:
        """Drop (or with ``write_back`` offload) tokens older than the window."""
        pol = self.pol
        n, seq = slot.n_tokens, tuple(slot.cache)
        pin = pinned_len(seq, pol.sink_tokens, pol.pin_system_prompt)
        recent = pol.keep_recent()
        if n > pin + recent + pol.chunk_tokens:
            self._drop(slot, unpinned(pieces_in_range(seq, pin, n - recent), self._boundary()),
                       write_back, now_s)

    def drop_over_budget(self, slot: Slot, now_s: float, budget: int, block_tokens: int
                         ) -> None:
        """Drop the lowest-score blocks (of ``block_tokens``) of a slot above ``budget``."""
        pol, rt = self.pol, self.rt
        n, seq = slot.n_tokens, tuple(slot.cache)
        pin = pinned_len(seq, pol.sink_tokens, pol.pin_system_prompt)
        if n > pin + budget + pol.chunk_tokens:
            cands = unpinned(pieces_in_range(seq, pin, max(pin, n - pol.keep_recent())),
                             self._boundary())
            hits = rt.scorer.hits.get(rt.slot_session.get(slot.slot_id, ""), {})
            self._drop(slot, score_victims(cands, hits, n - pin - budget, block_tokens),
                       False, now_s)

    def demote_old(self, slot: Slot, now_s: float) -> None:
        """Demote tokens older than the recent window in place, in ``chunk_tokens`` steps."""
        pol, rt = self.pol, self.rt
        n, seq = slot.n_tokens, tuple(slot.cache)
        pin = pinned_len(seq, pol.sink_tokens, pol.pin_system_prompt)
        chunk = pol.chunk_tokens
        wm = max(rt.wm.get(slot.slot_id, 0), pin)
        end = wm + (n - pol.keep_recent() - wm) // chunk * chunk
        if end > wm:
            self._demote(slot, unpinned(pieces_in_range(seq, wm, end), self._boundary()), now_s)
            rt.wm[slot.slot_id] = end

    def _demote(self, slot: Slot, pieces: list, now_s: float) -> None:
        rt = self.rt
        sid = rt.slot_session.get(slot.slot_id, "")
        led = rt.ledger(sid)
        backed = self.pol.host_backed
        state = QUANT_BACKED if backed else QUANT
        changed = 0
        for psid, a, b in pieces:
            k = led.mark(psid, a, b, state, rt.demote_bits, only=(FULL,))
            changed += k
            if backed and k:
                self.backup(sid, psid, a, b, k * rt.bpt)
        if changed:
            rt.c["quantized_tokens"] += changed
            nbytes = changed * rt.bpt if backed else 0
            if backed:
                self._write_back(nbytes, now_s)
            rt.emit(now_s, "quantize", slot.req.request_id if slot.req else "",
                    f"{changed} tokens to {rt.demote_bits:g} bits"
                    + (" (full copy on host)" if backed else ""), nbytes)
            rt.refresh_credits()

    def _write_back(self, nbytes: int, now_s: float) -> None:
        """Full-precision copy of demoted or dropped tokens to the host (device→host)."""
        rt = self.rt
        if rt.link is not None:
            rt.link.d2h.reserve(nbytes, now_s)
            rt.c["offload_bytes"] += nbytes

    def _drop(self, slot: Slot, victims: list, write_back: bool, now_s: float) -> None:
        if not victims:
            return
        rt = self.rt
        sid = rt.slot_session.get(slot.slot_id, "")
        led = rt.ledger(sid)
        ranges: dict[str, list[tuple[int, int]]] = {}
        k = 0
        for psid, a, b in victims:
            led.mark(psid, a, b, OFFLOADED if write_back else DROPPED)
            ranges.setdefault(psid, []).append((a, b))
            k += b - a
            if write_back:
                self.backup(sid, psid, a, b, (b - a) * rt.bpt)
        slot.cache = list(seq_remove(tuple(slot.cache), ranges))
        slot.n_tokens -= k
        rt.c["evicted_tokens"] += k
        nbytes = k * rt.bpt if write_back else 0
        if write_back:
            self._write_back(nbytes, now_s)
        rt.emit(now_s, "evict", slot.req.request_id if slot.req else "",
                f"{k} tokens " + ("offloaded (write-back)" if write_back else "dropped"), nbytes)

    def _global_budget(self, now_s: float, budget: int) -> None:
        pol, rt = self.pol, self.rt
        total = sum(s.n_tokens for s in rt.slots)
        if total <= budget + pol.chunk_tokens:
            return
        for slot in sorted(rt.slots, key=lambda s: -s.n_tokens):
            if total <= budget:
                break
            seq, n = tuple(slot.cache), slot.n_tokens
            pin = pinned_len(seq, pol.sink_tokens, pol.pin_system_prompt)
            cands = unpinned(pieces_in_range(seq, pin, max(pin, n - pol.keep_recent())),
                             self._boundary())
            hits = rt.scorer.hits.get(rt.slot_session.get(slot.slot_id, ""), {})
            before = slot.n_tokens
            self._drop(slot, score_victims(cands, hits, total - budget, pol.page_tokens),
                       False, now_s)
            total -= before - slot.n_tokens

    def backup(self, sid: str, psid: str, a: int, b: int, nbytes: int) -> None:
        """Track a host copy; over the host budget the oldest copies are discarded."""
        self.backups.append((sid, psid, a, b, nbytes))
        self.host_backed_bytes += nbytes
        rt = self.rt
        while self.host_backed_bytes > self.host_limit_bytes and self.backups:
            osid, opsid, oa, ob, ob_bytes = self.backups.popleft()
            led = rt.ledger(osid)
            led.mark(opsid, oa, ob, QUANT, rt.demote_bits, only=(QUANT_BACKED,))
            led.mark(opsid, oa, ob, DROPPED, only=(OFFLOADED,))
            self.host_backed_bytes -= ob_bytes
            rt.c["host_evictions"] += 1
