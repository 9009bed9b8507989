"""Token-budget scheduler for paged engines (vLLM v1 / SGLang).

Each step shares ``max_num_batched_tokens`` across the running queue, then the waiting
queue FCFS; chunked prefill is always on; on exhaustion a running request is preempted
(recompute, or swap over the link) in the engine's retract order.

NOTE: no waiting request is admitted in a step that preempted.
Design: docs/design/paged-scheduler.md (after docs/reference/engines.md §1.4, §2.3).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from kvsim.core.kv.block_pool import BlockPool
from kvsim.core.kv.host_pool import HostBlockPool, HostTier
from kvsim.core.kv.hybrid import HybridKVCacheManager
from kvsim.core.kv.manager import KVCacheManager, PrefixHit
from kvsim.core.link import Link
from kvsim.core.policy import NullPolicy, PolicyFactory, SchedulerPolicy
from kvsim.core.requests import Request, Status
from kvsim.core.step import EngineEvent, MemoryState, ScheduledItem, StepPlan, make_plan
from kvsim.core.stretch import Advanced, paged_advance, paged_stretch_limit
from kvsim.latency.base import BatchShape
from kvsim.metrics.failures import FAIL_MAX_LEN, FAIL_MAX_TOKENS, FAIL_NO_ROOM


class PagedScheduler:
    """Waiting/running queues over a :class:`KVCacheManager`."""

    def __init__(self, *, num_blocks: int, block_tokens: int, block_bytes: int,
                 max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 enable_prefix_caching: bool = True, preemption_mode: str = "recompute",
                 retract_order: str = "newest", swap_space_bytes: int = 0,
                 link: Link | None = None, kv_groups: tuple[tuple[str, int], ...] = (),
                 null_block: bool = False, host_tier: HostTier | None = None,
                 policy: PolicyFactory | None = None,
                 max_tokens_margin: int | None = None) -> None:
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching,
                              null_block=null_block)
        # NOTE: a sliding-window group means vLLM's hybrid manager (kvsim.core.kv.hybrid)
        self.hybrid = any(kind != "full" for kind, _ in kv_groups)
        self.manager = HybridKVCacheManager(self.pool, block_tokens, kv_groups) \
            if self.hybrid else KVCacheManager(self.pool, block_tokens)
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.max_num_seqs = max_num_seqs
        self.budget_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        # NOTE: None = the output stops at max_model_len; else prompt + max_tokens above
        # max_model_len - margin is refused at once (kvsim.engines.base.Engine)
        self.max_tokens_margin = max_tokens_margin
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.events: list[EngineEvent] = []
        self.preemptions = 0
        self.preemption_mode = preemption_mode
        self.retract_order = retract_order
        self.swap_space_bytes = swap_space_bytes
        self.link = link  # swap, host tier
        tier = host_tier or HostTier(0)
        self.host: HostBlockPool | None = HostBlockPool(tier.num_blocks, block_bytes) \
            if host_tier is not None else None
        self.host_load = tier.load
        self.host_chunk_blocks = tier.chunk_blocks  # kvsim.core.kv.host_pool.HostTier
        self.host_store_decode = tier.store_decode
        self.recompute_s: Callable[[int, int], float] | None = tier.recompute_s
        self.swapped: dict[str, int] = {}  # request id → bytes in swap space
        self.loaded_tokens: dict[str, int] = {}  # request id → tokens loaded from host
        self.stats = dict.fromkeys(("swap_outs", "swap_out_bytes", "swap_in_bytes",
                                    "host_store_bytes", "host_load_bytes", "host_hit_tokens"), 0)
        self._stall_end = 0.0
        # NOTE: last, so the policy sees a complete scheduler (kvsim.core.policy)
        self.policy: SchedulerPolicy = policy(self) if policy is not None else NullPolicy()

    # -- queue entry ---------------------------------------------------------
    def add_request(self, req: Request, now_s: float) -> bool:
        """Queue ``req``; a prompt that cannot fit ``max_model_len`` (with its max_tokens,
        where the engine refuses that), or a request that would need more blocks than hold
        KV, fails at once."""
        self.policy.on_admit(req, now_s)
        # NOTE: vLLM starts when max_model_len fits all its blocks, the null block too
        # (kvsim.core.kv.block_pool): a request needing them all would wait forever
        need = self.manager.least_peak_blocks(min(req.prompt_tokens + req.max_output_tokens,
                                                  self.max_model_len) - 1, req, self.budget_tokens)
        total = req.prompt_tokens + req.max_output_tokens
        if req.prompt_tokens >= self.max_model_len:
            why = FAIL_MAX_LEN, (f"prompt {req.prompt_tokens} tokens >= max_model_len "
                                 f"{self.max_model_len}")
        elif self.max_tokens_margin is not None and \
                total > self.max_model_len - self.max_tokens_margin:
            why = FAIL_MAX_TOKENS, (f"prompt {req.prompt_tokens} + max_tokens "
                                    f"{req.max_output_tokens} = {total} tokens, max_model_len "
                                    f"{self.max_model_len}")
        elif need > self.pool.num_usable:
            why = FAIL_NO_ROOM, f"needs {need} KV blocks, {self.pool.num_usable} hold KV"
        else:
            self.waiting.append(req)
            return True
        req.fail(now_s, why[0])
        self.events.append(EngineEvent(now_s, "fail", req.request_id, why[1]))
        return False

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def evictions(self) -> int:
        return self.pool.evictions

    @property
    def swap_used_bytes(self) -> int:
        return sum(self.swapped.values())

    def _copy(self, direction: str, nbytes: int, now_s: float) -> None:
        """A blocking copy in this step: the step waits until it ends."""
        _, end = self.link.channel(direction).reserve(nbytes, now_s)
        self._stall_end = max(self._stall_end, end)

    def _victim(self) -> Request:
        if self.retract_order == "sglang":  # fewest outputs, ties longest prompt, newest
            # NOTE: SGLang retracts from its decode batch; a request still in (chunked)
            # prefill is not in it (docs/reference/engines.md §2.3)
            batch = [r for r in self.running if r.num_output] or self.running
            return min(reversed(batch), key=lambda r: (r.num_output, -r.prompt_tokens))
        return self.running[-1]

    def _release(self, req: Request, now_s: float, keep_cached: int | None = None) -> None:
        """Free ``req``'s blocks, first writing its hashed blocks to the host tier
        (only the first ``keep_cached`` stay reusable when given)."""
        if self.host is not None:
            n = self.manager.req_num_hashed.get(req.request_id, 0)
            n = n if keep_cached is None else min(n, keep_cached)
            if not self.host_store_decode:
                n = min(n, req.prompt_tokens // self.block_tokens)
            n -= n % self.host_chunk_blocks
            new = self.host.store(req.block_hashes[:n])
            if new and self.link is not None:
                nbytes = new * self.block_bytes
                self.link.d2h.reserve(nbytes, now_s)  # asynchronous: no stall
                self.stats["host_store_bytes"] += nbytes
                self.events.append(EngineEvent(now_s, "host_store", req.request_id,
                                               f"{new * self.block_tokens} tokens", nbytes))
        self.manager.free(req, keep_cached)

    def _preempt(self, now_s: float) -> Request:
        victim = self._victim()
        self.running.remove(victim)
        nbytes = -(-victim.num_computed_tokens // self.block_tokens) * self.block_bytes
        if self.preemption_mode == "swap" and self.link is not None and 0 < nbytes \
                <= self.swap_space_bytes - self.swap_used_bytes:
            self.manager.free(victim)
            self._copy("d2h", nbytes, now_s)
            self.swapped[victim.request_id] = nbytes
            self.stats["swap_outs"] += 1
            self.stats["swap_out_bytes"] += nbytes
            self.events.append(EngineEvent(now_s, "swap_out", victim.request_id,
                                           f"{victim.num_computed_tokens} tokens", nbytes))
            victim.preemptions += 1
            victim.status = Status.WAITING
        else:
            # NOTE: SGLang frees a retracted request's decoded KV without inserting it
            # into the tree; its prompt was inserted when prefilled (docs/reference/engines.md
            # §2.2-§2.3)
            keep = victim.prompt_tokens // self.block_tokens \
                if self.retract_order == "sglang" else None
            self._release(victim, now_s, keep)
            self.events.append(EngineEvent(now_s, "preempt", victim.request_id,
                                           f"recompute {victim.num_computed_tokens} tokens"))
            victim.preempt()
        self.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def _host_tokens(self, req: Request, hit: PrefixHit, now_s: float) -> int:
        """Tokens after the GPU hit that the host tier holds and that load faster than
        they recompute (0 when nothing to load)."""
        if self.host is None or self.link is None:
            return 0
        k = len(hit.blocks)
        max_blocks = (req.num_tokens - 1) // self.block_tokens
        if max_blocks <= k:
            return 0
        m = self.host.match(self.manager.chain(req, max_blocks)[k:])
        m = max((k + m) // self.host_chunk_blocks * self.host_chunk_blocks - k, 0)
        tokens = m * self.block_tokens
        if m and self.host_load == "auto" and self.recompute_s is not None:
            h2d = self.link.h2d
            start = max(now_s, h2d.busy_until_s)
            copy_end = start + h2d.duration_s(m * self.block_bytes, start)
            if now_s + self.recompute_s(tokens, hit.num_tokens) <= copy_end:
                return 0
        return tokens

    def _admit(self, req: Request, budget: int, now_s: float) -> tuple[int, bool]:
        """Admit the waiting head if its blocks fit; return (tokens scheduled, is decode),
        0 tokens when it does not fit."""
        rid = req.request_id
        if rid in self.swapped:  # swap-in: progress kept, its blocks copied back
            n = min(req.remaining_tokens, budget)
            if not self.manager.allocate_slots(req, n):
                return 0, False
            nbytes = self.swapped.pop(rid)
            self._copy("h2d", nbytes, now_s)
            self.stats["swap_in_bytes"] += nbytes
            self.events.append(EngineEvent(now_s, "swap_in", rid,
                                           f"{req.num_computed_tokens} tokens", nbytes))
            return n, req.is_decode
        hit = self.manager.get_computed_blocks(req)
        host = self._host_tokens(req, hit, now_s)
        n = min(req.remaining_tokens - hit.num_tokens - host, budget)
        if not self.manager.allocate_slots(req, host + n, hit):
            if not host:
                return 0, False
            host, n = 0, min(req.remaining_tokens - hit.num_tokens, budget)
            if not self.manager.allocate_slots(req, n, hit):
                return 0, False
        if host:
            nbytes = host // self.block_tokens * self.block_bytes
            k = len(hit.blocks)
            self.host.touch(self.manager.chain(req, k + host // self.block_tokens)[k:])
            self._copy("h2d", nbytes, now_s)
            self.stats["host_load_bytes"] += nbytes
            self.stats["host_hit_tokens"] += host
            self.loaded_tokens[rid] = host
            self.events.append(EngineEvent(now_s, "host_load", rid, f"{host} tokens", nbytes))
        if req.preemptions == 0 and req.num_output == 0:
            req.cached_tokens = hit.num_tokens + host
        req.num_computed_tokens = hit.num_tokens + host
        req.high_water = max(req.high_water, req.num_computed_tokens)
        return n, False

    def schedule(self, now_s: float) -> StepPlan | None:
        self.policy.before_schedule(now_s)
        return self.policy.after_schedule(self._schedule(now_s), now_s)

    def _decode_pass(self) -> tuple[list[ScheduledItem], list[int]]:
        """The leading running requests that decode one token and get their blocks,
        as plan items and their contexts; it stops at the first that does not.

        NOTE: the same items and allocations, in the same order, as ``_schedule``'s
        general loop (an allocation that fails changes nothing: that loop retries it
        and preempts); ``allocate_slots``' no-op case is inlined.  At most one token
        each, so the budget (> the batch, checked by the caller) is not reached.
        """
        items: list[ScheduledItem] = []
        dec: list[int] = []
        mgr = self.manager
        req_blocks, req_hashed = mgr.req_blocks, mgr.req_num_hashed
        bt, caching = self.block_tokens, self.pool.enable_caching
        new_item = tuple.__new__  # NOTE: ScheduledItem's own constructor, minus its frame
        for req in self.running:
            nc = req.num_computed_tokens
            if req.prompt_tokens + req.num_output - nc != 1 or not req.num_output:
                break
            have = req_blocks.get(req.request_id)
            if (have is None or len(have) * bt <= nc or (
                    caching and (nc + 1) // bt > req_hashed.get(req.request_id, 0))) \
                    and not mgr.allocate_slots(req, 1):
                break
            items.append(new_item(ScheduledItem, (req, 1, nc, True)))
            dec.append(nc)
        return items, dec

    def _schedule(self, now_s: float) -> StepPlan | None:
        self._stall_end = now_s
        budget = self.budget_tokens
        running = self.running
        items: list[ScheduledItem] = []
        if budget > len(running):
            items, dec = self._decode_pass()
            if len(items) == len(running) and (not self.waiting or len(running)
                                               >= self.max_num_seqs) and items:
                # NOTE: make_plan of decode-only items (nothing to admit: no extra_s)
                return StepPlan(tuple(items), BatchShape(decode_context=tuple(dec)))
        budget -= len(items)
        preempted = False
        i = len(items)
        mgr = self.manager
        req_blocks, req_hashed = mgr.req_blocks, mgr.req_num_hashed
        bt, caching = self.block_tokens, self.pool.enable_caching
        new_item = tuple.__new__  # NOTE: ScheduledItem's own constructor, minus its frame
        while i < len(running) and budget > 0:
            req = running[i]
            nc = req.num_computed_tokens
            rem = req.prompt_tokens + req.num_output - nc
            n = rem if rem < budget else budget  # noqa: FURB136 (min() costs more here)
            # NOTE: allocate_slots' no-op hot path inlined (a decode token inside the
            # request's last block, nothing new to hash): same result, no call.
            total = nc + n
            have = req_blocks.get(req.request_id)
            if have is not None and len(have) * bt >= total and (
                    not caching or total // bt <= req_hashed.get(req.request_id, 0)):
                decode = rem == 1 and req.num_output > 0
                items.append(new_item(ScheduledItem, (req, n, nc, decode)))
                budget -= n
                i += 1
                continue
            while not self.manager.allocate_slots(req, n):
                preempted = True
                victim = self._preempt(now_s)
                if victim is req:
                    break
                for k, it in enumerate(items):  # SGLang order: a victim already planned
                    if it.req is victim:
                        budget += items.pop(k).num_new_tokens
                        i -= 1
                        break
            else:
                items.append(ScheduledItem(req, n, req.num_computed_tokens, req.is_decode))
                budget -= n
                i += 1
                continue
            if self.retract_order != "sglang":
                break  # the request itself was preempted: it was the last one
        if not preempted:  # NOTE: no waiting request is admitted in a step that preempted
            self._admit_waiting(items, budget, now_s)
        return make_plan(items, self._stall_end - now_s) if items else None

    def _admit_waiting(self, items: list[ScheduledItem], budget: int, now_s: float) -> None:
        """Admit waiting requests FCFS while the budget, ``max_num_seqs`` and blocks allow."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            n, decode = self._admit(req, budget, now_s)
            if not n:
                break
            self.waiting.popleft()
            if math.isnan(req.first_scheduled_s):  # first admission
                req.first_scheduled_s = now_s
            req.status = Status.RUNNING
            self.running.append(req)
            items.append(ScheduledItem(req, n, req.num_computed_tokens, decode))
            budget -= n

    # -- postprocess -------------------------------------------------------------
    def complete(self, plan: StepPlan, now_s: float, dt_s: float = math.nan) -> list[Request]:
        """Apply a step of ``dt_s`` seconds that ended at ``now_s``; return the requests
        that finished in it (a token's gap is the step's duration when it follows the
        previous step's token: :func:`kvsim.core.itl.token_gap`)."""
        done: list[Request] = []
        running = Status.RUNNING
        u = math.ulp(now_s)
        mml = self.max_model_len
        for req, n, _, _ in plan.items:
            if req.status is not running:
                continue
            a = req.num_computed_tokens  # NOTE: Request.record_compute's decode path inlined
            if a >= req.high_water and a >= req.prompt_tokens:
                req.num_computed_tokens = req.high_water = a + n
            else:
                req.record_compute(n)
            if req.prompt_tokens + req.num_output != req.num_computed_tokens:
                continue  # prefill chunk, no token yet
            if req.num_output:  # NOTE: Request.sample and token_gap inlined (hot path)
                g = now_s - req.last_token_s
                req.itl.add(dt_s if abs(g - dt_s) <= u else g)
            else:
                req.first_token_s = now_s
            req.last_token_s = now_s
            k = req.num_output = req.num_output + 1
            # NOTE: finish_if_done's limits tested first: only a finishing request calls it
            if (k >= req.max_output_tokens or req.prompt_tokens + k >= mml) \
                    and self.finish_if_done(req, now_s):
                done.append(req)
        return done

    def finish_if_done(self, req: Request, now_s: float) -> bool:
        """A request that just sampled a token at ``now_s`` finishes — at its output
        limit, or truncated at the context limit (finish_reason "length") — and leaves
        the batch, its blocks released."""
        if req.num_output >= req.max_output_tokens:
            req.finish(now_s)
        elif req.prompt_tokens + req.num_output >= self.max_model_len:
            req.finish(now_s, truncated=True)
        else:
            return False
        self._release(req, now_s)
        self.running.remove(req)
        return True

    def memory(self) -> MemoryState:
        pool = self.pool
        host = self.swap_used_bytes + (self.host.bytes if self.host is not None else 0)
        return self.policy.memory(MemoryState(
            kv_reserved_bytes=pool.num_blocks * self.block_bytes,
            kv_allocated_bytes=pool.num_active * self.block_bytes,
            kv_cached_bytes=pool.num_cached_free * self.block_bytes,
            running=len(self.running), waiting=len(self.waiting), host_kv_bytes=host))

    # -- fast-forward (kvsim.core.stretch) -------------------------------------------
    def decode_stretch_limit(self, plan: StepPlan) -> int:
        return paged_stretch_limit(self, plan)

    def advance_decode(self, plan: StepPlan, times, dts, finish: bool = False) -> Advanced:
        return paged_advance(self, plan, times, dts, finish)
