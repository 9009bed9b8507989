"""Token-budget scheduler for paged engines (vLLM v1 / SGLang), engines.md §1.4.

Each step shares ``max_num_batched_tokens`` across requests: first the *running*
queue (decodes and unfinished prefill chunks, oldest first), then the *waiting*
queue FCFS while the budget, ``max_num_seqs`` and free blocks allow.  Chunked
prefill is always on: a long prompt is computed in budget-sized chunks.

Preemption is recompute (vLLM v1): when a running request cannot get its blocks,
the *last* running request (the most recently admitted) is preempted — its blocks
are freed (they keep their hashes, so on resumption it re-hits whatever was not
evicted meanwhile), ``num_computed_tokens`` returns to 0 and it goes to the front
of the waiting queue — repeated until the allocation succeeds or the request
itself was the victim.  No waiting request is admitted in a step that preempted.
"""

from __future__ import annotations

import math
from collections import deque

from kvsim.core.kv.block_pool import BlockPool
from kvsim.core.kv.manager import KVCacheManager
from kvsim.core.requests import Request, Status
from kvsim.core.step import EngineEvent, MemoryState, ScheduledItem, StepPlan, make_plan
from kvsim.core.stretch import paged_advance, paged_stretch_limit

FAIL_MAX_LEN = "maximum context length exceeded"


class PagedScheduler:
    """Waiting/running queues over a :class:`KVCacheManager`."""

    def __init__(self, *, num_blocks: int, block_tokens: int, block_bytes: int,
                 max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 enable_prefix_caching: bool = True) -> None:
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self.manager = KVCacheManager(self.pool, block_tokens)
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.max_num_seqs = max_num_seqs
        self.budget_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.events: list[EngineEvent] = []
        self.preemptions = 0

    # -- queue entry ---------------------------------------------------------
    def add_request(self, req: Request, now_s: float) -> bool:
        """Queue ``req``; a prompt that cannot fit ``max_model_len`` fails at once."""
        if req.prompt_tokens >= self.max_model_len:
            req.fail(now_s, FAIL_MAX_LEN)
            self.events.append(EngineEvent(
                now_s, "fail", req.request_id,
                f"prompt {req.prompt_tokens} tokens >= max_model_len {self.max_model_len}"))
            return False
        self.waiting.append(req)
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # -- schedule --------------------------------------------------------------
    def _preempt_last(self, now_s: float) -> Request:
        victim = self.running.pop()
        self.manager.free(victim)
        self.events.append(EngineEvent(now_s, "preempt", victim.request_id,
                                       f"recompute {victim.num_computed_tokens} tokens"))
        victim.preempt()
        self.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def schedule(self, now_s: float) -> StepPlan | None:
        budget = self.budget_tokens
        items: list[ScheduledItem] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.remaining_tokens, budget)
            while not self.manager.allocate_slots(req, n):
                preempted = True
                if self._preempt_last(now_s) is req:
                    break
            else:
                items.append(ScheduledItem(req, n, req.num_computed_tokens, req.is_decode))
                budget -= n
                i += 1
                continue
            break  # the request itself was preempted: it was the last one
        while not preempted and self.waiting and budget > 0 \
                and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            hit = self.manager.get_computed_blocks(req)
            n = min(req.remaining_tokens - hit.num_tokens, budget)
            if not self.manager.allocate_slots(req, n, hit):
                break
            self.waiting.popleft()
            if req.preemptions == 0 and req.num_output == 0:
                req.cached_tokens = hit.num_tokens
            if math.isnan(req.first_scheduled_s):  # first admission
                req.first_scheduled_s = now_s
            req.num_computed_tokens = hit.num_tokens
            req.high_water = max(req.high_water, hit.num_tokens)
            req.status = Status.RUNNING
            self.running.append(req)
            items.append(ScheduledItem(req, n, req.num_computed_tokens, False))
            budget -= n
        return make_plan(items) if items else None

    # -- postprocess -------------------------------------------------------------
    def complete(self, plan: StepPlan, now_s: float) -> list[Request]:
        """Apply a finished step; return the requests that finished in it."""
        done: list[Request] = []
        for item in plan.items:
            req = item.req
            if req.status is not Status.RUNNING:
                continue
            req.record_compute(item.num_new_tokens)
            if req.remaining_tokens:
                continue  # prefill chunk, no token yet
            req.sample(now_s)
            if req.num_output >= req.max_output_tokens:
                req.finish(now_s)
            elif req.num_tokens >= self.max_model_len:
                req.finish(now_s, truncated=True)  # finish_reason "length"
            else:
                continue
            self.manager.free(req)
            self.running.remove(req)
            done.append(req)
        return done

    def memory(self) -> MemoryState:
        pool = self.pool
        return MemoryState(
            kv_reserved_bytes=pool.num_blocks * self.block_bytes,
            kv_allocated_bytes=pool.num_active * self.block_bytes,
            kv_cached_bytes=pool.num_cached_free * self.block_bytes,
            running=len(self.running), waiting=len(self.waiting))

    # -- fast-forward (issue 6, kvsim.core.stretch) --------------------------------
    def decode_stretch_limit(self, plan: StepPlan) -> int:
        return paged_stretch_limit(self, plan)

    def advance_decode(self, plan: StepPlan, times):
        return paged_advance(self, plan, times)
