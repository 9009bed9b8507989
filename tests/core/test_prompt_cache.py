"""llama-server's RAM prompt cache and ``--cache-idle-slots``, as in the llama.cpp
vendored by llama-cpp-python 0.3.36 (tools/server: ``server_prompt_cache::alloc /
load / update``, ``get_available_slot``, the idle-slot loop after a task launch).

Expectations are worked by hand from those rules: bytes are tokens × 10 B here.
"""

from core_helpers import req, run_until_idle

from kvsim.core.kv.slots import PromptCache
from kvsim.core.requests import Request
from kvsim.core.slot_scheduler import SlotScheduler


def _sched(**kw) -> SlotScheduler:
    args = {"parallel": 2, "slot_tokens": 4096, "pool_cells": 8192, "unified": False,
            "bytes_per_token": 10, "reserved_bytes": 81920, "n_batch": 2048,
            "cache_ram_bytes": None, "cache_idle_slots": True}
    args.update(kw)
    return SlotScheduler(**args)


def _seq(*pieces: tuple[str, int]) -> tuple:
    return tuple((sid, 0, n) for sid, n in pieces)


def test_save_skips_a_state_one_entry_already_holds_whole() -> None:
    c = PromptCache(None, 10)
    assert c.save(_seq(("a", 100), ("b", 50)), 0.0) == 1500
    # a prefix of the entry is held whole: no copy, order unchanged
    assert c.save(_seq(("a", 100)), 1.0) == 0
    assert [e.n_tokens for e in c.entries] == [150]
    # an extension replaces the entry it contains
    assert c.save(_seq(("a", 100), ("b", 50), ("c", 10)), 2.0) == 1600
    assert [e.n_tokens for e in c.entries] == [160]


def test_save_skips_a_state_over_the_byte_limit_and_evicts_oldest_for_room() -> None:
    c = PromptCache(2000, 10)
    assert c.save(_seq(("big", 201)), 0.0) == 0 and c.entries == []
    assert c.save(_seq(("x", 80)), 0.0) == 800
    assert c.save(_seq(("y", 80)), 1.0) == 800
    # 800 + 800 + 600 > 2000: the oldest (x) leaves before z is stored
    assert c.save(_seq(("z", 60)), 2.0) == 600
    assert [e.seq[0][0] for e in c.entries] == ["y", "z"] and c.total_bytes == 1400


def test_restore_finds_entries_by_shared_tokens_through_every_change() -> None:
    """Entries that start differently never match; the one sharing the prompt's start
    is found again after saves that drop, evict and restore entries around it."""
    c = PromptCache(3000, 10)
    c.save(_seq(("sys", 50), ("a", 40)), 0.0)      # 900 B
    c.save(_seq(("other", 60)), 1.0)               # 600 B
    # shares nothing with either: nothing to restore
    assert c.take_best(_seq(("new", 30)), 0, 0) is None
    # contains the first entry: that one is dropped, the new state stored last
    c.save(_seq(("sys", 50), ("a", 40), ("b", 30)), 2.0)  # 1200 B
    assert [e.n_tokens for e in c.entries] == [60, 120] and c.total_bytes == 1800
    # 1800 + 1300 > 3000: the oldest ("other") leaves
    c.save(_seq(("x", 130)), 3.0)
    assert [e.seq[0][0] for e in c.entries] == ["sys", "x"] and c.total_bytes == 2500
    # a prompt continuing the "sys" state restores it (keeps 120/120, similarity 120/150)
    got = c.take_best(_seq(("sys", 50), ("a", 40), ("b", 30), ("c", 30)), 0, 0)
    assert got is not None and got.n_tokens == 120
    assert c.take_best(_seq(("sys", 50), ("a", 40)), 0, 0) is None  # it left the cache
    assert [e.seq[0][0] for e in c.entries] == ["x"] and c.total_bytes == 1300


def test_token_limit_is_n_ctx_when_bytes_are_unlimited() -> None:
    """--cache-ram -1: no byte limit, so update() caps the tokens at n_ctx (1000)."""
    c = PromptCache(None, 10, limit_tokens=1000)
    for i, n in enumerate((400, 400, 300)):
        c.save(_seq((f"s{i}", n)), float(i))
    assert [e.n_tokens for e in c.entries] == [400, 300]
    # with a byte limit the token cap rises to what the bytes hold (20000 B / 10 = 2000)
    d = PromptCache(20000, 10, limit_tokens=1000)
    for i, n in enumerate((400, 400, 300)):
        d.save(_seq((f"s{i}", n)), float(i))
    assert [e.n_tokens for e in d.entries] == [400, 400, 300]


def test_idle_slots_are_saved_when_a_task_starts() -> None:
    s = _sched()
    a = req("a#0", [("a", 100)], out=5)
    s.add_request(a, 0.0)
    now = run_until_idle(s)
    assert [e.kind for e in s.events] == []  # nothing was idle with tokens at a's start
    b = req("b#0", [("b", 50)], out=5)
    s.add_request(b, now)
    s.schedule(now)
    # b goes to the empty slot (LRU; the empty slot has no LCP); a's idle slot, 100 + 5 - 1
    # tokens, is copied to RAM and (per-slot KV) stays on the GPU
    saves = [e for e in s.events if e.kind == "idle_save"]
    assert [(e.request_id, e.bytes) for e in saves] == [("b#0", 1040)]
    assert s.pool.used_cells == 104 + 0
    now = run_until_idle(s, now)
    # a second start saves b's slot; a's state is already held whole: not copied again
    c = req("c#0", [("a", 100), ("a/t0/out", 4), ("c", 10)], out=2)
    s.add_request(c, now)
    s.schedule(now)
    saves = [e for e in s.events if e.kind == "idle_save"]
    assert [(e.request_id, e.bytes) for e in saves] == [("b#0", 1040), ("c#0", 540)]
    assert c.cached_tokens == 104


def _a_done_then_b_starts(s: SlotScheduler) -> tuple[Request, float]:
    """``a`` (100 tokens, 5 out) runs alone to the end; then ``b`` (50 tokens) starts."""
    a = req("a#0", [("a", 100)], out=5)
    s.add_request(a, 0.0)
    now = run_until_idle(s)
    b = req("b#0", [("b", 50)], out=5)
    s.add_request(b, now)
    s.schedule(now)
    return b, now


def test_unified_pool_clears_idle_slots_and_restores_from_ram() -> None:
    s = _sched(unified=True, slot_tokens=8192)
    b, now = _a_done_then_b_starts(s)
    # a's idle slot is saved and cleared: only b's prompt will occupy cells
    assert s.pool.used_cells == 0 and len(s.ram.entries) == 1
    now = run_until_idle(s, now)
    a1 = req("a#1", [("a", 100), ("a/t0/out", 4), ("a/t1", 20)], out=2)
    s.add_request(a1, now)
    s.schedule(now)
    kinds = [e.kind for e in s.events]
    # a1 takes the LRU slot (a's old, empty), saves nothing there, restores a's state
    assert kinds.count("restore") == 1 and a1.cached_tokens == 104
    # b's slot was idle when a1 started: saved and cleared too
    assert kinds.count("idle_save") == 2 and s.pool.slots[b.slot_id].n_tokens == 0


def test_no_cache_idle_slots_keeps_idle_slots_resident_and_unsaved() -> None:
    s = _sched(unified=True, slot_tokens=8192, cache_idle_slots=False)
    _a_done_then_b_starts(s)
    assert "idle_save" not in [e.kind for e in s.events]
    assert s.pool.used_cells == 104 and s.ram.entries == []


def test_similar_slot_keeping_half_its_tokens_bypasses_the_ram_cache() -> None:
    """A similarity choice that keeps ≥ 50 % of the slot's tokens neither saves the slot
    nor looks in the RAM cache (update_cache stays false)."""
    s = _sched(parallel=1, slot_tokens=4096, pool_cells=4096)
    a = req("a#0", [("a", 100)], out=5)
    s.add_request(a, 0.0)
    now = run_until_idle(s)
    a1 = req("a#1", [("a", 60), ("z", 60)], out=2)  # keeps 60 of 104 tokens (58 %)
    s.add_request(a1, now)
    s.schedule(now)
    assert [e.kind for e in s.events] == [] and a1.cached_tokens == 60
    now = run_until_idle(s, now)
    a2 = req("a#2", [("a", 30), ("y", 100)], out=2)  # keeps 30 of 121 (25 %): save first
    s.add_request(a2, now)
    s.schedule(now)
    assert [(e.kind, e.bytes) for e in s.events] == [("cache_save", 1210)]
