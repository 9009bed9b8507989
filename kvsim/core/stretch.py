"""Multi-step decode application for the schedulers (fast-forward).

``*_stretch_limit(sched, plan)``: how many decode steps after ``plan`` may be applied at once
without reaching a boundary the scheduler owns (a finish or context limit, an allocation that
would fail or purge, an admissible waiting request). ``*_advance(sched, plan, times)`` applies
``J = len(times) − 1`` steps exactly as ``J`` rounds of ``complete`` + ``schedule`` would, and
returns the KV bytes during steps ``0..J−1``, the memory state after, and the finished
requests; ``finish=True`` only *completes* the last step.

NOTE: tokens, block pops and registrations follow the same (step, request) order as stepping;
pops are batched only when no hash to register is still indexed (then they commute).
NOTE: paged: a waiting request not admissible at step 0 stays so through the stretch; with
hybrid KV cache groups that does not hold, so a stretch with a waiting head ends before its
first free or pop.
Design: docs/design/fast-forward.md.
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

from kvsim.core.itl import emit_tokens
from kvsim.core.kv.slots import append_computed
from kvsim.core.requests import Request
from kvsim.core.step import MemoryState, ScheduledItem, StepPlan

if TYPE_CHECKING:  # NOTE: the schedulers import this module
    from kvsim.core.scheduler import PagedScheduler
    from kvsim.core.slot_scheduler import SlotScheduler

Items = tuple[ScheduledItem, ...]
Blocks = tuple[list[int], list[int], MemoryState]  # KV bytes allocated / cached per step, after
Advanced = tuple[list[int], list[int], MemoryState, list[Request]]  # ... and the finished


def _all_decode(plan: StepPlan, running: list[Request]) -> bool:
    # NOTE: make_plan puts exactly the decode items in batch.decode_context
    n = len(plan.items)
    return n == len(running) and len(plan.batch.decode_context) == n


def _new_blocks(ctx: tuple[int, ...], steps: int, block: int) -> int:
    """Blocks first needed by steps ``1..steps`` (step j holds ``ctx + j + 1`` tokens)."""
    return sum([(c + steps) // block - c // block for c in ctx])


def _first_free_step(ctx: tuple[int, ...], block: int, window: int) -> int:
    """The first step whose schedule frees a block that left the window (hybrid)."""
    first = 1 << 62
    for c in ctx:
        x = c - window + 1  # step j skips the first x + j tokens
        j = -x % block or block
        if x + j < block:
            j += (block - x - j + block - 1) // block * block
        first = min(first, j)
    return first


def paged_stretch_limit(sched: PagedScheduler, plan: StepPlan) -> int:
    if not _all_decode(plan, sched.running):
        return 0
    mgr, pool = sched.manager, sched.pool
    head_waits = False
    if sched.waiting and len(sched.running) < sched.max_num_seqs \
            and sched.budget_tokens > len(plan.items):
        head = sched.waiting[0]
        stats = mgr.query_tokens, mgr.hit_tokens
        hit = mgr.get_computed_blocks(head)
        mgr.query_tokens, mgr.hit_tokens = stats
        n = min(head.remaining_tokens - hit.num_tokens, sched.budget_tokens - len(plan.items))
        if mgr.blocks_needed(head, n, hit) <= pool.num_free:
            return 0
        head_waits = True
    reqs = [it[0] for it in plan.items]
    limit = min(min([r.max_output_tokens - r.num_output for r in reqs]),
                sched.max_model_len - max([r.prompt_tokens + r.num_output for r in reqs])) - 1
    if limit < 1:
        return 0
    ctx = plan.batch.decode_context
    free, block = pool.num_free, sched.block_tokens
    groups = 1
    if sched.hybrid:
        # NOTE: while a request waits, the stretch ends before the first free (it may
        # admit the head) and before the first pop: a pop may evict a block of the
        # head's hit, which cuts the hit in every group at once, and a budget-capped
        # head then needs fewer blocks.  Pops are counted without the frees (a bound).
        groups = len(mgr.kinds)
        if head_waits:
            first_pop = min([block - c % block for c in ctx])
            limit = min(limit, _first_free_step(ctx, block, mgr.window) - 1, first_pop - 1)
    if _new_blocks(ctx, limit, block) * groups <= free:
        return limit
    lo, hi = 0, limit  # largest J with new blocks ≤ free
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _new_blocks(ctx, mid, block) * groups <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _block_events(items: Items, steps: int, block: int, caching: bool
                  ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(step, item) pairs in (step, item) order: new blocks popped, full blocks registered.

    Step j holds c + j + 1 tokens: it needs a new block when (c + j) % block == 0 and
    fills one when (c + j + 1) % block == 0 (j = 1..steps).
    """
    pops: list[tuple[int, int]] = []
    regs: list[tuple[int, int]] = []
    # NOTE: only the items that reach a block boundary within ``steps`` (most do not
    # in a short stretch): context c + steps + 1 ends in another block than c
    hit = [(i, c) for i, (_, _, c, _) in enumerate(items)
           if (c + steps + 1) // block != c // block] if steps < block \
        else [(i, it[2]) for i, it in enumerate(items)]
    for i, c in hit:
        j = block - c % block
        while j <= steps:
            pops.append((j, i))
            j += block
        j = block - (c + 1) % block
        while caching and j <= steps:
            regs.append((j, i))
            j += block
    pops.sort()
    regs.sort()
    return pops, regs


def paged_advance(sched: PagedScheduler, plan: StepPlan, times: list[float], dts: list[float],
                  finish: bool = False) -> Advanced:
    steps = len(times) - 1
    items = plan.items
    reqs = [i.req for i in items]
    _decode_tokens(reqs, steps, times, dts)
    blocks = _hybrid_blocks if sched.hybrid else _paged_blocks
    alloc, cached, mem = blocks(sched, items, reqs, steps - finish, steps)
    return alloc, cached, mem, paged_finish(sched, reqs, times[-1]) if finish else []


def paged_finish(sched: PagedScheduler, reqs: list[Request], now_s: float) -> list[Request]:
    """The end of ``PagedScheduler.complete`` for requests that just sampled a decode
    token at ``now_s``: those at their output or context limit finish, in batch order.

    NOTE: ``finish_if_done``'s two limits tested first, so only the finishing
    requests make the call."""
    mml = sched.max_model_len
    return [r for r in reqs if (r.num_output >= r.max_output_tokens
                                or r.prompt_tokens + r.num_output >= mml)
            and sched.finish_if_done(r, now_s)]


def _decode_tokens(reqs: list[Request], steps: int, times: list[float], dts: list[float]
                   ) -> None:
    """Every request computes and samples one token per step (``times[1:]``)."""
    emit_tokens(reqs, times, dts, compute=True)


def _paged_blocks(sched: PagedScheduler, items: Items, reqs: list[Request], alloc_steps: int,
                  steps: int) -> Blocks:
    """Blocks of the schedules after steps ``0..alloc_steps−1``; KV bytes per step."""
    mgr, pool, block = sched.manager, sched.pool, sched.block_tokens
    pops, regs = _block_events(items, alloc_steps, block, pool.enable_caching)
    if not pops and not regs:  # NOTE: no block taken or filled: the bytes held throughout
        mem = sched.memory()
        return [mem.kv_allocated_bytes] * steps, [mem.kv_cached_bytes] * steps, mem
    req_blocks, req_hashed = mgr.req_blocks, mgr.req_num_hashed
    chains: dict[int, list[int]] = {}  # item → its hash chain through the stretch's end
    for i in {i for _, i in regs}:
        chains[i] = mgr._hashes(reqs[i], (items[i].context_tokens + alloc_steps + 1) // block)
    active = [0] * (steps + 1)
    cached = [0] * (steps + 1)
    # NOTE: pops and registrations commute unless a hash to register is still indexed
    # (a free cached block carrying it, which a pop would evict): then interleave them.
    cached_idx = pool.cached
    if any(h in cached_idx for i, ch in chains.items()
           for h in ch[req_hashed.get(reqs[i].request_id, 0):]):
        order = sorted([(j, i, 0) for j, i in pops] + [(j, i, 1) for j, i in regs])
    else:
        flags = pool.head_is_cached(len(pops))
        new = pool.get_new_blocks(len(pops))
        for (j, i), b, f in zip(pops, new, flags):
            req_blocks[reqs[i].request_id].append(b)
            active[j] += 1
            cached[j] += f
        order = [(j, i, 1) for j, i in regs]
    for j, i, kind in order:
        rid = reqs[i].request_id
        if kind == 0:
            before = pool.num_cached_free
            req_blocks[rid].extend(pool.get_new_blocks(1))
            active[j] += 1
            cached[j] += before - pool.num_cached_free
            continue
        n_full = (items[i].context_tokens + j + 1) // block
        done = req_hashed.get(rid, 0)
        if n_full > done:
            pool.cache_full_blocks(req_blocks[rid][done:n_full], chains[i][done:n_full])
            req_hashed[rid] = n_full
    return _stretch_memory(sched, steps, active, cached)


def _hybrid_points(items: Items, steps: int, block: int, window: int, caching: bool
                   ) -> list[tuple[int, int]]:
    """(step, item) points, in order, where an item's schedule takes a new block, fills
    one (:func:`_block_events`) or frees a skipped one (step j computes token ``c + j``)."""
    pops, regs = _block_events(items, steps, block, caching)
    pts = set(pops).union(regs)
    for i, (_, _, c, _) in enumerate(items):
        pts.update((j, i) for j in range(_first_free_step((c,), block, window), steps + 1,
                                         block))
    return sorted(pts)


def _hybrid_blocks(sched: PagedScheduler, items: Items, reqs: list[Request], alloc_steps: int,
                   steps: int) -> Blocks:
    """:func:`_paged_blocks` for hybrid KV cache groups: each point's schedule done by
    the manager, in (step, item) order; KV bytes read off the pool after each step.

    NOTE: raw pool counts, as ``PagedScheduler.memory`` reports them before its policy's
    ``memory``: no paged policy changes KV bytes, and the host tier (the one paged
    policy) turns the hybrid manager off."""
    mgr, pool, bb = sched.manager, sched.pool, sched.block_bytes
    pts = _hybrid_points(items, alloc_steps, sched.block_tokens, mgr.window,
                         pool.enable_caching)
    alloc, cached = [0] * steps, [0] * steps
    j0 = 0  # NOTE: the bytes change only at points: each run between them filled at once
    for j, i in pts:
        if j > j0 and j0 < steps:
            n = min(j, steps) - j0
            alloc[j0:j0 + n] = [bb * pool.num_active] * n
            cached[j0:j0 + n] = [bb * pool.num_cached_free] * n
            j0 = j
        mgr.advance(reqs[i], items[i].context_tokens + j)
    if j0 < steps:
        alloc[j0:] = [bb * pool.num_active] * (steps - j0)
        cached[j0:] = [bb * pool.num_cached_free] * (steps - j0)
    return alloc, cached, sched.memory()


def _stretch_memory(sched: PagedScheduler, steps: int, active: list[int], cached: list[int]
                    ) -> Blocks:
    """KV bytes during each step: the final state minus what steps j+1..J allocated."""
    bb = sched.block_bytes
    mem = sched.memory()
    act = list(accumulate(active))
    cac = list(accumulate(cached))
    a_end, c_end = mem.kv_allocated_bytes - bb * act[-1], mem.kv_cached_bytes + bb * cac[-1]
    return [a_end + bb * a for a in act[:steps]], [c_end - bb * c for c in cac[:steps]], mem


def slot_stretch_limit(sched: SlotScheduler, plan: StepPlan) -> int:
    if sched._exhausted is plan or not _all_decode(plan, sched.running):
        return 0
    slots = sched.pool.slots
    limit = min(min(i.req.max_output_tokens - i.req.num_output,
                    sched.cap - slots[i.req.slot_id].n_tokens - 1) for i in plan.items) - 1
    if sched.pool.unified:
        n = len(plan.items)
        # schedule j needs n free cells without purging: free_0 − n·j ≥ n
        limit = min(limit, (sched.pool.free_cells - n) // n)
    return max(limit, 0)


def slot_advance(sched: SlotScheduler, plan: StepPlan, times: list[float], dts: list[float],
                 finish: bool = False) -> Advanced:
    steps = len(times) - 1
    reqs = [i.req for i in plan.items]
    slots = sched.pool.slots
    for req in reqs:
        slot = slots[req.slot_id]
        append_computed(slot, req, steps)  # NOTE: from the tokens computed before
        slot.n_tokens += steps
    emit_tokens(reqs, times, dts, compute=True)
    mem = sched.memory()
    per_step = sched.bytes_per_token * len(plan.items)
    end = mem.kv_allocated_bytes - per_step * steps
    # NOTE: end + per_step * j for j = 0..steps-1, built in C
    alloc = list(range(end, end + per_step * steps, per_step)) if per_step else [end] * steps
    cache = [mem.kv_cached_bytes] * steps
    return alloc, cache, mem, slot_finish(sched, reqs, times[-1]) if finish else []


def slot_finish(sched: SlotScheduler, reqs: list[Request], now_s: float) -> list[Request]:
    """The end of ``SlotScheduler.complete`` for requests that just sampled a decode
    token at ``now_s``: finish at the output limit, at the slot's end stop or shift
    the context, in batch order."""
    slots = sched.pool.slots
    return [r for r in reqs if sched.finish_if_done(r, slots[r.slot_id], now_s)]
