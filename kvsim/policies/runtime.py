"""Policy runtime: the scheduler's :class:`~kvsim.core.policy.SchedulerPolicy` and a step hook.

:func:`kvsim.policies.build.wire_policies` gives the scheduler the factory of its
:class:`PolicyRuntime` (built last in its constructor); the scheduler calls it at fixed points
(kvsim.core.policy) and the engine calls it after every step:

- ``on_admit``: the turn's reference events become pending, with the pinned head
  of its prompt as sent (:meth:`RecallScorer.sent`); then the prompt of a session
  whose KV lost spans to a window/budget policy is the history minus those spans
  (StreamingLLM semantics);
- ``before_schedule``: idle slots past ``idle_after_s`` are offloaded (or dropped);
- ``after_schedule``: a turn admitted in this step is scored
  (:mod:`kvsim.policies.recall`); recalls stall the step until the copy ends;
  quantized tokens are read at their quantized bytes (the step's
  ``BatchShape.kv_read_saved_bytes``: a roofline reads that much less KV) and add
  their dequantization time on those bytes (docs/reference/kv-policies.md §2.1(b,c));
- ``on_host_save``: the engine's own prompt-cache save of a taken-over slot is a
  device→host copy on the critical path (llama-server serializes it on its loop
  thread before the new prompt runs); a restore that follows starts after it;
- ``restore_time_s``: a saved slot comes back host→device, or is recomputed when
  that is cheaper (``restore: auto``);
- ``memory``: mixed-precision bytes, host copies;
- ``after_step`` (hook): window, budget and KIVI policies act on the slots that grew
  (:mod:`kvsim.policies.slot_evict`).

Quantized tokens take fewer bytes: on a unified pool (llama.cpp ``-kvu``) the saved
bytes become free cells (exact capacity effect) — room for more tokens of all slots
together, never a longer context: demoting precision adds no positions.

NOTE: fast-forward (kvsim.core.fastforward) never jumps across a policy action:
windows, budgets and KIVI act per token, so :meth:`quiet_steps` counts the decode
steps before they would act (a step that is not a plain decode may: 0);
``idle_offload`` reports its exact next offload time (:meth:`next_trigger_s`);
recall scoring happens at admission, a boundary of every stretch; inside one the
dequantization stall of each step is constant (:meth:`steady_extra_s`), and so are
the saved read bytes (``advanced_plan`` keeps them).  Paged
engines' policy (the host tier) lives inside the scheduler and never triggers.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

from kvsim.core.kv.slots import PromptCache
from kvsim.core.requests import seq_len
from kvsim.core.scheduler import PagedScheduler
from kvsim.core.slot_scheduler import SlotScheduler
from kvsim.core.step import EngineEvent, MemoryState, StepPlan
from kvsim.metrics.accuracy import AccuracyConfig, recall_summary
from kvsim.policies.base import EvictionPolicy
from kvsim.policies.blocks import QUANT, QUANT_BACKED, Ledger, seq_remove
from kvsim.policies.host_ram import QuantAwarePromptCache
from kvsim.policies.recall import RecallScorer
from kvsim.policies.slot_evict import SlotEvictor

COUNTERS = ("evicted_tokens", "quantized_tokens", "offload_bytes", "restore_bytes",
            "recall_bytes", "host_evictions", "restore_recomputes", "offloaded_slots",
            "promoted_tokens")


class PolicyRuntime:
    """Block-state ledger, transfers and recall scoring for one simulated server."""

    def __init__(self, sched: PagedScheduler | SlotScheduler, *, link: Any, accuracy: AccuracyConfig,
                 evict: EvictionPolicy | None = None,
                 offload: Any = None, bytes_per_token: int, engine_bits: float,
                 quant_ratio: Fraction = Fraction(1), demote_bits: float = 16.0,
                 dequant_s_per_byte: float = 0.0, recompute_s: Any = None,
                 host_backup_bytes: int = 0, read_token_bytes: int = 0) -> None:
        self.sched, self.link, self.acc = sched, link, accuracy
        self.evict, self.offload = evict, offload
        self.bpt, self.engine_bits = bytes_per_token, engine_bits
        self.ratio, self.demote_bits = quant_ratio, demote_bits
        self.dequant_s_per_byte = dequant_s_per_byte
        # KV read bytes a quantized token saves a step: the latency model's f16 bytes of
        # one old token (its full-attention layers) × (1 − ratio); 0 = not modelled
        self.read_saved_per_token = Fraction(read_token_bytes) * (1 - quant_ratio)
        self._saved_memo = (0, 0.0)  # NOTE: (quantized tokens, their saved bytes)
        self.recompute_s = recompute_s
        pool = sched.pool if isinstance(sched, SlotScheduler) else None
        self.slots = list(pool.slots) if pool is not None else []
        self.unified = pool is not None and pool.unified
        self.base_cells = pool.pool_cells if pool is not None else 0
        self.ledgers: dict[str, Ledger] = {}
        self.slot_session: dict[int, str] = {}
        self.wm: dict[int, int] = {}  # per slot: tokens below this are already demoted
        self._qcache: dict[int, tuple[Any, int, int]] = {}
        # NOTE: exact bytes of q quantized tokens (Fraction) by q, and the quantized total
        # the pool's credit was last set for: counts change only when tokens are demoted
        # or promoted, so most steps reuse them (Fraction arithmetic is slow)
        self._qbytes: dict[int, Fraction] = {}
        self._credited_q = 0
        self.c = dict.fromkeys(COUNTERS, 0)
        self.scorer = RecallScorer(self)
        self.evictor = SlotEvictor(self, evict, host_backup_bytes) \
            if evict is not None and self.slots else None
        self._now, self._stall_end = 0.0, 0.0

    # -- workload ----------------------------------------------------------------------
    def tap(self, sessions: Any):
        """Pass sessions through, remembering their reference events and pinned head."""
        for s in sessions:
            self.scorer.register(s)
            yield s

    def ledger(self, sid: str) -> Ledger:
        led = self.ledgers.get(sid)
        if led is None:
            led = self.ledgers[sid] = Ledger()
        return led

    def emit(self, t: float, kind: str, rid: str, detail: str, nbytes: int = 0) -> None:
        self.sched.events.append(EngineEvent(t, kind, rid, detail, int(nbytes)))

    def loaded_tokens(self, req: Any) -> int:
        """Tokens of ``req`` a paged scheduler loaded from its host tier."""
        if not isinstance(self.sched, PagedScheduler):
            return 0
        return self.sched.loaded_tokens.get(req.request_id, 0)

    @property
    def _slot_sched(self) -> SlotScheduler:
        """The scheduler on a slot engine's paths (RAM cache, slot pool).

        NOTE: only slot-engine code calls it: a paged scheduler has neither."""
        assert isinstance(self.sched, SlotScheduler)
        return self.sched

    @property
    def host_backed_bytes(self) -> int:
        return self.evictor.host_backed_bytes if self.evictor is not None else 0

    # -- SchedulerPolicy (kvsim.core.policy) ------------------------------------------------
    def ram_cache(self, ram: PromptCache) -> PromptCache:
        """A demoting policy's RAM cache stores a slot's quantized tokens at their
        quantized bytes (kvsim.policies.host_ram); otherwise ``ram`` itself."""
        if self.ratio == 1 or not self.slots:
            return ram
        return QuantAwarePromptCache(ram, self.state_bytes)

    def on_admit(self, req: Any, now_s: float) -> None:
        self.scorer.sent(req)  # NOTE: first: the prompt as sent fixes the pinned head
        led = self.ledgers.get(req.session_id)
        if led is not None:
            gone = led.dropped_ranges()
            if gone:
                req.prompt = seq_remove(req.prompt, gone)
                req.prompt_tokens = seq_len(req.prompt)

    def before_schedule(self, now_s: float) -> None:
        self.scorer.forget_rejected()
        self._now, self._stall_end = now_s, now_s
        self._time_policies(now_s)
        self.refresh_credits()

    def on_host_save(self, nbytes: int, now_s: float) -> float:
        """llama-server writes the taken-over slot to its RAM cache on the loop thread
        before the new prompt runs: the copy is a stall, after earlier stalls."""
        if nbytes <= 0:
            return 0.0
        self.c["offload_bytes"] += nbytes
        if self.link is None:
            return 0.0
        _, end = self.link.d2h.reserve(nbytes, max(now_s, self._stall_end))
        return self._incremental(end)

    def after_schedule(self, plan: StepPlan | None, now_s: float) -> StepPlan | None:
        if plan is None:
            return None
        quant = bool(self.slots) and bool(self.dequant_s_per_byte or self.read_saved_per_token)
        if not self.scorer.pending and not quant and plan.extra_s >= 0:
            return plan  # NOTE: nothing to score, dequantize or read short: plan as is
        recall_end = now_s
        dequant = 0.0
        q = 0
        pending = self.scorer.pending
        for item in plan.items:
            req = item.req
            if req.request_id in pending:
                recall_end = max(recall_end, self.scorer.admit(req, now_s))
            if quant and req.slot_id >= 0:
                if self.dequant_s_per_byte:
                    dequant += self._dequant_s(req)
                q += self._qcount(self.slots[req.slot_id])
        extra = max(0.0, recall_end - (now_s + plan.extra_s)) + dequant
        saved = self._read_saved(q) if q else 0.0
        if saved:
            batch = dataclasses.replace(plan.batch, kv_read_saved_bytes=saved)
            return StepPlan(plan.items, batch, plan.extra_s + extra)
        return dataclasses.replace(plan, extra_s=plan.extra_s + extra) if extra > 0 else plan

    def _read_saved(self, q: int) -> float:
        """KV bytes ``q`` quantized tokens read less than at f16 (exact, then a float)."""
        if self._saved_memo[0] != q:
            self._saved_memo = (q, float(q * self.read_saved_per_token))
        return self._saved_memo[1]

    def restore_time_s(self, nbytes: int, now_s: float) -> float:
        """Stall for restoring a saved slot: the h2d copy, or recompute when cheaper.

        NOTE: without a link (unified memory: the saved state sits in the GPU's own
        memory) the bytes still come back and are counted, as ``on_host_save`` counts
        the save; there is no PCIe copy to wait for, and nothing cheaper to recompute.
        """
        if nbytes <= 0:
            return 0.0
        h2d = self.link.h2d if self.link is not None else None
        if h2d is None:
            self.c["restore_bytes"] += nbytes
            return 0.0
        t0 = max(now_s, self._stall_end)  # NOTE: after this step's save (same thread)
        if self.offload is not None and self.offload.restore == "auto" and self.recompute_s:
            start = max(t0, h2d.busy_until_s)
            xfer_end = start + h2d.duration_s(nbytes, start)
            rec_end = t0 + self.recompute_s(self._restored_tokens(nbytes))
            if rec_end < xfer_end:
                self.c["restore_recomputes"] += 1
                return self._incremental(rec_end)
        _, end = h2d.reserve(nbytes, t0)
        self.c["restore_bytes"] += nbytes
        return self._incremental(end)

    def _restored_tokens(self, nbytes: int) -> int:
        """Tokens of the entry being restored (its bytes are quantized under KIVI)."""
        ram = self._slot_sched.ram
        e = ram.last_taken if isinstance(ram, QuantAwarePromptCache) else None
        return e.n_tokens if e is not None and e.bytes == nbytes else nbytes // self.bpt

    def state_bytes(self, seq: Any) -> int:
        """Host bytes of a slot state ``seq`` (the RAM cache's per-token size): its
        quantized tokens at ``quant_ratio`` of it, the rest at full precision."""
        per = self._slot_sched.ram.bytes_per_token
        n = seq_len(seq)
        slot = next((s for s in self.slots if s.n_tokens == n and tuple(s.cache) == seq),
                    None)
        q = self._qcount(slot) if slot is not None else 0
        return (n - q) * per + int(q * per * self.ratio)

    def memory(self, m: MemoryState) -> MemoryState:
        # NOTE: no quantized tokens without a ratio (_qcount); unchanged → m itself
        q = sum(self._qcount(s) for s in self.slots) if self.ratio != 1 else 0
        quant = int(self._quant_bytes(q)) if q else 0
        alloc = m.kv_allocated_bytes - q * self.bpt + quant
        if self.engine_bits < 16:
            quant = alloc
        host = m.host_kv_bytes + self.host_backed_bytes
        if alloc == m.kv_allocated_bytes and quant == m.kv_quant_bytes \
                and host == m.host_kv_bytes:
            return m
        return dataclasses.replace(m, kv_allocated_bytes=alloc, kv_quant_bytes=quant,
                                   host_kv_bytes=host)

    # -- StepHook (kvsim.core.step) ----------------------------------------------------------
    def after_step(self, scheduler: Any, plan: Any, now_s: float) -> float:
        self._time_policies(now_s)
        if self.evictor is not None:
            self.evictor.after_step(now_s)
        return 0.0

    def next_trigger_s(self, now_s: float) -> float:
        """The next idle-offload time; per-step eviction is bounded by :meth:`quiet_steps`."""
        t = math.inf
        if self.offload is not None:
            for s in self.slots:
                if s.req is None and s.n_tokens and s.last_used_s >= 0:
                    t = min(t, max(now_s, s.last_used_s + self.offload.idle_after_s))
        return t

    def quiet_steps(self, plan: StepPlan) -> float:
        """Steps of ``plan`` (and the decode steps that continue it) after each of which
        :meth:`after_step` changes nothing but what :meth:`next_trigger_s` bounds in time.

        NOTE: a step that is not a plain decode may grow a slot by a whole chunk: 0.
        """
        if self.evictor is None:
            return math.inf
        if not plan.is_decode_only:
            return 0
        return self.evictor.quiet_steps()

    def steady_extra_s(self, plan: StepPlan) -> float:
        """The extra seconds :meth:`after_schedule` gives every decode step of ``plan``'s
        batch while no turn is admitted and no token changes precision: the
        dequantization of the quantized tokens (each item's, in batch order)."""
        if not (self.dequant_s_per_byte and self.slots):
            return 0.0
        dequant = 0.0
        for item in plan.items:
            if item.req.slot_id >= 0:
                dequant += self._dequant_s(item.req)
        return dequant

    def _dequant_s(self, req: Any) -> float:
        """Seconds a step spends dequantizing the quantized tokens of ``req``'s slot."""
        q = self._qcount(self.slots[req.slot_id])
        return self.dequant_s_per_byte * float(self._quant_bytes(q))

    # -- time policies, capacity ------------------------------------------------------------
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
                saved = self._slot_sched.ram.save(tuple(slot.cache), t0)
                if self.link is not None:
                    self.link.d2h.reserve(saved, t0)
                self.c["offload_bytes"] += saved
            self.c["offloaded_slots"] += 1
            if not saved:  # NOTE: mode drop, or a state the host budget cannot hold
                self.c["evicted_tokens"] += slot.n_tokens
            self.emit(t0, "offload" if saved else "evict", "",
                      f"idle slot {slot.slot_id}: {slot.n_tokens} tokens "
                      + ("to host" if saved else "dropped"), saved)
            slot.clear()
            self.wm[slot.slot_id] = 0

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

    def _quant_bytes(self, q: int) -> Fraction:
        """Bytes of ``q`` quantized tokens, exact (memoized by ``q``)."""
        v = self._qbytes.get(q)
        if v is None:
            if len(self._qbytes) > 4096:
                self._qbytes.clear()
            v = self._qbytes[q] = q * self.bpt * self.ratio
        return v

    def refresh_credits(self) -> None:
        """Unified pool: bytes saved by quantized tokens become free cells.

        NOTE: cells, not positions: the slot's context (``-c``, llama.cpp's
        ``n_ctx_seq``) is a setting, so a prompt or a generation longer than it fails or
        stops as without the policy; only the pool's room for all slots grows."""
        if self.ratio == 1 or not self.unified:
            return
        q = sum(self._qcount(s) for s in self.slots)
        if q == self._credited_q:
            return  # NOTE: the pool already holds this credit (0 at start: none)
        self._credited_q = q
        saved = q * (1 - self.ratio)
        self._slot_sched.pool.pool_cells = self.base_cells + int(saved)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = recall_summary(self.scorer.scored)
        out.update(self.c)
        out.update({f"recall_via_{k}_events": v for k, v in self.scorer.via.items()})
        stats = self.sched.stats if isinstance(self.sched, PagedScheduler) else {}
        out.update(stats)
        # NOTE: offload_/restore_bytes are all policy KV traffic to / from host RAM, so
        # policies compare across engines; host_store/load_bytes are the paged host
        # tier's share of them (swap preemption stays in swap_out/in_bytes)
        out["offload_bytes"] += stats.get("host_store_bytes", 0)
        out["restore_bytes"] += stats.get("host_load_bytes", 0)
        if self.link is not None:
            out.update(self.link.summary())
        return out
