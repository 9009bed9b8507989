"""The llama.cpp / Ollama server loop over slots, docs/reference/engines.md §3.4–§3.5 and §4.5.

Each iteration: deferred tasks take idle slots (FCFS, slot choice and prompt-cache
reuse in :mod:`kvsim.core.kv.slots`); every generating slot contributes its next
token, then pending prompts are packed until ``n_batch`` tokens (continuous
batching).  There is no preemption: a task waits for a free slot.  The engine's
``ubatch_split`` (llama.cpp's ubatches, kvsim.engines.llama_cpp.llama_ubatches) says which
graphs that batch runs as; a step of several carries them (``BatchShape.ubatches``), and
its decode steps are not fast-forwarded (a stretch prices one graph a step).

Failures, worded as the real server reports them, and cuts of the context (each marks
the request ``truncated``, as llama-server's response flag does: a truncated prompt, a
context shift, a stop at the slot's end; a truncated prompt also counts the tokens it
lost, ``Request.truncated_prompt_tokens``):

- prompt ≥ the slot's context → HTTP 400 ``exceed_context_size_error``; Ollama
  truncates it on its side instead (old messages first, then the oldest tokens after
  ``num_keep``);
- generation reaching the slot's end → stop, or with context shift keep ``n_keep``
  tokens and discard half of the rest;
- unified pool: a batch that finds no free KV cells first purges idle slots' caches;
  if that is not enough the batch is halved down to one token, and then every active
  slot fails with "Context size has been exceeded." (llama.cpp #23652).

NOTE: the step that exhausts the pool is charged the full batch time (the halving
retries process what fits, then fail), and its tokens are discarded.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from kvsim.core.kv.slots import SAVE_BELOW_KEEP, PromptCache, Slot, SlotPool, append_computed
from kvsim.core.policy import NullPolicy, PolicyFactory, SchedulerPolicy
from kvsim.core.requests import (
    Request,
    Status,
    common_prefix,
    fit_chat_prompt,
    seq_drop,
    seq_len,
)
from kvsim.core.step import EngineEvent, MemoryState, ScheduledItem, StepPlan, make_plan
from kvsim.core.stretch import Advanced, slot_advance, slot_stretch_limit
from kvsim.engines.base import UbatchSplit
from kvsim.latency.base import BatchShape
from kvsim.metrics.failures import FAIL_POOL_EXHAUSTED, FAIL_PROMPT_TOO_LONG, FAIL_QUEUE_FULL


class SlotScheduler:
    """Slots (per-slot or unified KV) with prompt caching and the RAM prompt cache."""

    def __init__(self, *, parallel: int, slot_tokens: int, pool_cells: int, unified: bool,
                 bytes_per_token: int, reserved_bytes: int, n_batch: int,
                 similarity: float | None = 0.10, cache_prompt: bool = True,
                 cache_ram_bytes: int | None = 0, cache_idle_slots: bool = False,
                 context_shift: bool = False,
                 n_keep: int = 0, truncate_prompt: bool = False, n_discard: int = 0,
                 restore_time_s: Callable[[int], float] = lambda b: 0.0,
                 state_bytes_per_token: int | None = None,
                 max_queue: int | None = None, policy: PolicyFactory | None = None,
                 ubatch_split: UbatchSplit | None = None,
                 fresh_slots_from_last: bool = False) -> None:
        self.pool = SlotPool(parallel=parallel, slot_tokens=slot_tokens, pool_cells=pool_cells,
                             unified=unified, similarity=similarity,
                             fresh_from_last=fresh_slots_from_last)
        # NOTE: bytes_per_token is the GPU's KV (its offloaded layers); the RAM cache
        # serializes a slot's whole state, every layer's KV (docs/reference/engines.md §3.4)
        self.ram = PromptCache(cache_ram_bytes, state_bytes_per_token or bytes_per_token,
                               limit_tokens=pool_cells)
        self.cache_idle_slots = cache_idle_slots
        self.bytes_per_token = bytes_per_token
        self.reserved_bytes = reserved_bytes
        self.n_batch = n_batch
        self.cache_prompt = cache_prompt
        self.context_shift = context_shift
        self.n_keep = n_keep
        self.n_discard = n_discard  # 0 = half of the tokens after n_keep
        # NOTE: llama-server rejects a prompt longer than the slot even with context
        # shift on (docs/reference/engines.md §3.4, current builds); Ollama truncates it (§4.5)
        self.truncate_prompt = truncate_prompt
        self.max_queue = max_queue  # Ollama: OLLAMA_MAX_QUEUE, then HTTP 503 (§4.1)
        self.ubatch_split = ubatch_split
        self._since_prompt = -1  # decode-only steps run since the last prompt step (-1: none)
        self.waiting: deque[Request] = deque()
        self.events: list[EngineEvent] = []
        self.preemptions = 0  # slots never preempt; kept for a uniform interface
        self._exhausted: StepPlan | None = None
        # NOTE: last, so the policy sees a complete scheduler (kvsim.core.policy); the RAM
        # cache is priced by it before any state is saved
        self.policy: SchedulerPolicy = policy(self) if policy is not None \
            else NullPolicy(restore_time_s)
        self.ram = self.policy.ram_cache(self.ram)

    @property
    def cap(self) -> int:
        """Tokens one slot may hold (the whole pool when unified)."""
        return self.pool.slot_tokens

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or any(not s.idle for s in self.pool.slots)

    @property
    def evictions(self) -> int:
        """NOTE: 0: slots have no block pool; a slot's cache is overwritten, not evicted."""
        return 0

    @property
    def running(self) -> list[Request]:
        return [s.req for s in self.pool.slots if s.req is not None]

    # -- queue entry ---------------------------------------------------------
    def add_request(self, req: Request, now_s: float) -> bool:
        self.policy.on_admit(req, now_s)
        if self.max_queue is not None and len(self.waiting) >= self.max_queue:
            req.fail(now_s, FAIL_QUEUE_FULL)
            self.events.append(EngineEvent(now_s, "fail", req.request_id,
                                           f"{len(self.waiting)} requests already queued"))
            return False
        if req.prompt_tokens >= self.cap:
            if not self.truncate_prompt:
                req.fail(now_s, FAIL_PROMPT_TOO_LONG)
                self.events.append(EngineEvent(
                    now_s, "fail", req.request_id,
                    f"request ({req.prompt_tokens} tokens) exceeds the available context "
                    f"size ({self.cap} tokens)"))
                return False
            self._truncate(req, now_s)
        self.waiting.append(req)
        return True

    def _truncate(self, req: Request, now_s: float) -> None:
        """Ollama's fit of a prompt too long for the slot (docs/reference/engines.md §4.5), silent
        on the server's side: the request is marked ``truncated`` and keeps the count of
        tokens dropped (its record shows the prompt as sent and that count)."""
        # NOTE: fitted to cap - 1 so the slot holds the first sampled token (Ollama
        # fits num_ctx and shifts at once: one token apart)
        keep = self._keep_tokens(req.prompt_tokens)
        sent_tokens = req.prompt_tokens
        req.prompt, dropped, cut = fit_chat_prompt(req.prompt, self.cap - 1, keep)
        req.prompt_tokens = seq_len(req.prompt)
        req.truncated_prompt_tokens += sent_tokens - req.prompt_tokens
        req.truncated = True
        self.events.append(EngineEvent(
            now_s, "truncate_prompt", req.request_id,
            f"dropped {dropped} tokens of old messages, truncated {cut} after {keep}"))

    # -- schedule --------------------------------------------------------------
    def _assign(self, req: Request, slot: Slot, lcp: int, takeover: bool,
                now_s: float) -> float:
        """Put ``req`` in ``slot``; return the stall in seconds.

        A takeover (``takeover``: the LRU choice, or a similar slot that would keep
        < 50 % of its tokens) goes through the RAM cache, synchronously on the
        server's loop: the slot's state is saved, then the best entry restored.
        """
        stall = 0.0
        if self.cache_prompt and self.ram.enabled and (
                takeover or (slot.n_tokens and lcp / slot.n_tokens < SAVE_BELOW_KEEP)):
            stall += self._save(slot, req.request_id, "cache_save", now_s)
            room = slot.n_tokens + self.pool.free_cells if self.pool.unified else self.cap
            entry = self.ram.take_best(req.prompt, lcp, slot.n_tokens, max_tokens=room)
            if entry is not None:
                slot.cache, slot.n_tokens = list(entry.seq), entry.n_tokens
                lcp = common_prefix(entry.seq, req.prompt)
                stall += self.policy.restore_time_s(entry.bytes, now_s)
                self.events.append(EngineEvent(now_s, "restore", req.request_id,
                                               f"slot {slot.slot_id}", entry.bytes))
            self.ram.trim()
        n_past = min(lcp, req.prompt_tokens - 1) if self.cache_prompt else 0
        slot.keep(n_past)
        slot.req, req.slot_id = req, slot.slot_id
        req.cached_tokens = n_past
        req.num_computed_tokens = req.high_water = n_past
        req.first_scheduled_s = now_s
        req.status = Status.RUNNING
        return stall

    def _save(self, slot: Slot, request_id: str, kind: str, now_s: float) -> float:
        """Save ``slot``'s state to the RAM cache; return the stall (0 when skipped)."""
        saved = self.ram.save(tuple(slot.cache), now_s)
        if not saved:
            return 0.0
        self.events.append(EngineEvent(now_s, kind, request_id, f"slot {slot.slot_id}", saved))
        return self.policy.on_host_save(saved, now_s)

    def _save_idle_slots(self, request_id: str, now_s: float) -> float:
        """``--cache-idle-slots``: after a task starts, every idle slot's state is
        saved to the RAM cache (skipped when already held) and, with a unified pool,
        the slot is cleared; return the stall."""
        if not (self.cache_idle_slots and self.cache_prompt and self.ram.enabled):
            return 0.0
        stall = 0.0
        for slot in self.pool.slots:
            if slot.req is None:
                stall += self._save(slot, request_id, "idle_save", now_s)
                if self.pool.unified:
                    slot.clear()
        return stall

    def _make_room(self, needed: int, now_s: float) -> bool:
        """Unified pool: purge idle slots (LRU first) until ``needed`` cells are free.

        NOTE: llama-server clears a purged slot without saving it to the RAM cache.
        """
        pool = self.pool
        while pool.free_cells < needed:
            victim = pool.lru_idle_with_cache()
            if victim is None:
                return False
            self.events.append(EngineEvent(now_s, "purge_idle_slot", "",
                                           f"slot {victim.slot_id}",
                                           victim.n_tokens * self.bytes_per_token))
            victim.clear()
        return True

    def schedule(self, now_s: float) -> StepPlan | None:
        self.policy.before_schedule(now_s)
        return self.policy.after_schedule(self._schedule(now_s), now_s)

    def _schedule(self, now_s: float) -> StepPlan | None:
        stall = 0.0
        while self.waiting:
            sel = self.pool.select(self.waiting[0].prompt)
            if sel is None:
                break  # deferred: no idle slot
            req = self.waiting.popleft()
            stall += self._assign(req, *sel, now_s)
            stall += self._save_idle_slots(req.request_id, now_s)
        items: list[ScheduledItem] = []
        busy = [s for s in self.pool.slots if s.req is not None]
        for s in busy:
            if s.req.is_decode:
                items.append(ScheduledItem(s.req, 1, s.n_tokens, True))
        room = self.n_batch - len(items)
        for s in busy:
            if room <= 0:
                break
            if not s.req.is_decode and s.req.remaining_tokens:
                n = min(s.req.remaining_tokens, room, self.cap - s.n_tokens)
                items.append(ScheduledItem(s.req, n, s.n_tokens, False))
                room -= n
        if not items:
            return None
        plan = make_plan(items, stall)
        if self.ubatch_split is not None:
            plan = self._graphs(plan)
        if plan.is_decode_only and self._since_prompt >= 0:
            plan = replace(plan, batch=replace(plan.batch, after_prompt=self._since_prompt))
        needed = sum(i.num_new_tokens for i in items)
        if self.pool.unified and not self._make_room(needed, now_s):
            self.events.append(EngineEvent(
                now_s, "batch_halving", "",
                f"batch of {needed} tokens, {self.pool.free_cells} free cells"))
            self._exhausted = plan
        return plan

    def _graphs(self, plan: StepPlan) -> StepPlan:
        """``plan`` with the graphs its batch runs as, when the split gives several."""
        items = plan.items
        parts = self.ubatch_split([(i.req.slot_id, i.num_new_tokens) for i in items])
        if len(parts) < 2:
            return plan
        done = [0] * len(items)
        shapes = []
        for part in parts:
            pre_n: list[int] = []
            pre_c: list[int] = []
            dec: list[int] = []
            for k, n in part:
                item = items[k]
                if item.is_decode:
                    dec.append(item.context_tokens)
                else:
                    pre_n.append(n)
                    pre_c.append(item.context_tokens + done[k])
                done[k] += n
            shapes.append(BatchShape(tuple(pre_n), tuple(pre_c), tuple(dec)))
        return replace(plan, batch=replace(plan.batch, ubatches=tuple(shapes)))

    # -- postprocess -------------------------------------------------------------
    def _release(self, slot: Slot, now_s: float) -> None:
        slot.req = None
        slot.last_used_s = now_s
        if not self.cache_prompt:
            slot.clear()

    def complete(self, plan: StepPlan, now_s: float, dt_s: float = math.nan) -> list[Request]:
        self._since_prompt = self._since_prompt + 1 if plan.is_decode_only else 0
        if self._exhausted is plan:
            self._exhausted = None
            return self._fail_all(now_s)
        done: list[Request] = []
        for item in plan.items:
            req = item.req
            slot = self.pool.slots[req.slot_id]
            append_computed(slot, req, item.num_new_tokens)
            slot.n_tokens += item.num_new_tokens
            req.record_compute(item.num_new_tokens)
            if req.remaining_tokens:
                continue
            req.sample(now_s, dt_s)
            if self.finish_if_done(req, slot, now_s):
                done.append(req)
        return done

    def finish_if_done(self, req: Request, slot: Slot, now_s: float) -> bool:
        """A request that just sampled a token at ``now_s`` finishes at its output limit,
        or at the slot's end (stop_type limit) unless the context shifts, and leaves its
        slot."""
        if req.num_output >= req.max_output_tokens:
            req.finish(now_s)
        elif slot.n_tokens + 1 >= self.cap:
            if self.context_shift:
                self._shift(slot, now_s)
                return False
            req.finish(now_s, truncated=True)  # stop_type limit
        else:
            return False
        self._release(slot, now_s)
        return True

    def _keep_tokens(self, prompt_tokens: int) -> int:
        """llama.cpp's n_keep: -1 keeps the whole prompt; capped at n_ctx - 4."""
        keep = prompt_tokens if self.n_keep < 0 else self.n_keep
        return max(0, min(keep, self.cap - 4))

    def _shift(self, slot: Slot, now_s: float) -> None:
        keep = self._keep_tokens(slot.req.prompt_tokens)
        left = slot.n_tokens - keep
        discard = min(self.n_discard, left) if self.n_discard > 0 else left // 2
        slot.cache = list(seq_drop(tuple(slot.cache), keep, keep + discard))
        slot.n_tokens -= discard
        slot.req.truncated = True  # llama-server sets truncated on a shift (§3.4)
        self.events.append(EngineEvent(now_s, "context_shift", slot.req.request_id,
                                       f"kept {keep}, discarded {discard}"))

    def _fail_all(self, now_s: float) -> list[Request]:
        done = []
        for slot in self.pool.slots:
            if slot.req is None:
                continue
            req = slot.req
            req.fail(now_s, FAIL_POOL_EXHAUSTED)
            self.events.append(EngineEvent(now_s, "fail", req.request_id,
                                           f"slot {slot.slot_id}: unified KV pool exhausted"))
            slot.clear()
            self._release(slot, now_s)
            done.append(req)
        return done

    def memory(self) -> MemoryState:
        bpt = self.bytes_per_token
        used = idle = running = 0  # NOTE: SlotPool.used_cells / idle_cached_cells in one pass
        for s in self.pool.slots:
            used += s.n_tokens
            if s.req is None:
                idle += s.n_tokens
            else:
                running += 1
        return self.policy.memory(MemoryState(
            kv_reserved_bytes=self.reserved_bytes, kv_allocated_bytes=used * bpt,
            kv_cached_bytes=idle * bpt, running=running, waiting=len(self.waiting),
            host_kv_bytes=self.ram.total_bytes))

    # -- fast-forward (kvsim.core.stretch) -------------------------------------------
    def decode_stretch_limit(self, plan: StepPlan) -> int:
        if plan.batch.ubatches:
            return 0  # NOTE: a stretch prices one graph a step (module doc)
        return slot_stretch_limit(self, plan)

    def advance_decode(self, plan: StepPlan, times, dts, finish: bool = False) -> Advanced:
        self._since_prompt += len(times) - 1  # NOTE: only grows: stretches start settled
        return slot_advance(self, plan, times, dts, finish)
