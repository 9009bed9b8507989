"""Engine.run's garbage-collector setting: raised for the run, the process's own after it."""

import gc
import threading

import pytest

from kvsim.core.build import PoolSizing, make_scheduler
from kvsim.core.engine import GC_YOUNG_THRESHOLD, Engine
from kvsim.errors import InputError
from kvsim.latency.constant import ConstantLatency
from kvsim.scenario import resolve_scenario
from kvsim.workload.schema import Session, Turn


class _Probe:
    """A hook that records the GC thresholds it sees after each step (optionally failing)."""

    def __init__(self, fail: bool = False) -> None:
        self.seen: set[tuple[int, int, int]] = set()
        self.fail = fail

    def after_step(self, scheduler, plan, now_s: float) -> float:
        self.seen.add(gc.get_threshold())
        if self.fail:
            raise InputError("probe", "x", "a probe that fails")
        return 0.0

    def next_trigger_s(self, now_s: float) -> float:
        return now_s  # NOTE: acts after every step, so no stretch is jumped past it

    def quiet_steps(self, plan) -> float:
        return 0


def _engine(hook: _Probe) -> Engine:
    sched = make_scheduler(resolve_scenario({
        "gpu": "rtx-4090", "model": "llama-3.1-8b",
        "engine": {"preset": "vllm", "context_tokens": 2048}, "workload": {}}).engine,
        PoolSizing(kv_pool_tokens=4096, slot_tokens=4096, kv_reserved_bytes=256 * 100,
                   num_gpu_blocks=256, block_tokens=16))
    return Engine(sched, ConstantLatency(0.02), hooks=[hook])


SESSIONS = [Session(session_id="s", turns=(Turn(start_s=0.0, input_tokens=100,
                                                output_tokens=5),))]


@pytest.mark.parametrize("fail", [False, True])
def test_run_raises_the_young_threshold_and_restores_it(fail: bool) -> None:
    """Every step (1 prompt + 4 decode steps) runs at the raised young-generation
    threshold, the older generations' untouched; after the run — also one that raises —
    the process has its own thresholds back."""
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        hook = _Probe(fail)
        eng = _engine(hook)
        if fail:
            with pytest.raises(InputError):
                eng.run(SESSIONS)
        else:
            eng.run(SESSIONS)
        assert hook.seen == {(GC_YOUNG_THRESHOLD, 11, 12)}
        assert gc.get_threshold() == (700, 11, 12)
    finally:
        gc.set_threshold(*before)


def test_a_run_on_another_thread_leaves_the_collector_alone() -> None:
    """Runs overlapping in threads (a Dask worker's) would restore each other's
    settings: off the main thread a run keeps the process's thresholds."""
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        hook = _Probe()
        worker = threading.Thread(target=lambda: _engine(hook).run(SESSIONS))
        worker.start()
        worker.join()
        assert hook.seen == {(700, 11, 12)} and gc.get_threshold() == (700, 11, 12)
    finally:
        gc.set_threshold(*before)
