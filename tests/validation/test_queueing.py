"""Queueing theory: M/D/1 waiting time (Pollaczek–Khinchine) and Little's law."""

import numpy as np
import pytest

from kvsim.api import simulate
from kvsim.config.catalog import list_bundled
from kvsim.core.build import PoolSizing
from kvsim.scenario import load_scenario, resolve_scenario
from kvsim.workload.schema import Session, Turn

STEP_S = 0.1


def _md1_scenario():
    return resolve_scenario({
        "gpu": "rtx-4090", "model": "llama-3.1-8b",
        "engine": {"preset": "vllm", "context_tokens": 4096, "max_num_seqs": 1},
        "latency": {"kind": "constant", "step_s": STEP_S}, "workload": {},
        "sim": {"sample_interval_s": 1000.0}})


def _poisson_sessions(rate: float, n: int, seed: int) -> list[Session]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    return [Session(session_id=f"r{i}", kind="imported", history="none",
                    turns=(Turn(start_s=float(s), input_tokens=16, output_tokens=1),))
            for i, s in enumerate(t)]


def test_md1_mean_wait_matches_pollaczek_khinchine() -> None:
    """One request at a time (max_num_seqs 1), each exactly one step of D = 0.1 s
    (prompt in one chunk, one output token): an M/D/1 queue.  P-K: Wq = ρD / (2(1 − ρ)).
    At ρ = 0.6 that is 0.075 s; 3 seeds × 4,000 requests give a standard error of
    about 3 %, so the tolerance is 8 %."""
    sizing = PoolSizing(kv_pool_tokens=4096 * 4, slot_tokens=4096, kv_reserved_bytes=2**30,
                        num_gpu_blocks=1024, block_tokens=16, device_bytes=2**34)
    rho = 0.6
    waits = []
    for seed in range(3):
        res = simulate(_md1_scenario(), sessions=_poisson_sessions(rho / STEP_S, 4000, seed),
                       sizing=sizing)
        assert res.summary["failed_requests"] == 0
        # service is exactly one step: E2E - queue == D for every request
        assert np.allclose(res.requests.e2e_s - res.requests.queue_s, STEP_S)
        waits.append(res.requests.queue_s.mean())
    expected = rho * STEP_S / (2 * (1 - rho))
    assert np.mean(waits) == pytest.approx(expected, rel=0.08)


@pytest.mark.parametrize("name", list_bundled("scenarios"))
def test_littles_law_on_bundled_scenarios(name: str) -> None:
    """L = λW: the time-average number of requests in the server (running + waiting,
    from the memory samples as a step function) equals arrival rate × mean time in
    the server.  Fifteen whole sessions of the day keep the test short; 0.25 s sampling bounds the
    discretisation error to a few per cent."""
    sc = load_scenario(name, ["workload.max_sessions=15", "sim.sample_interval_s=0.25"])
    res = simulate(sc)
    req = res.requests
    assert len(req) > 10
    t0, t1 = 0.0, float(res.summary["sim_time_s"])
    sojourn = (req.finish_s - req.arrival_s).to_numpy()
    lam_w = sojourn.sum() / (t1 - t0)
    mem = res.memory
    times = np.append(mem.time_s.to_numpy(), t1)
    n_in = (mem.running + mem.waiting).to_numpy()
    area = float(np.sum(n_in * np.diff(times)))
    assert area / (t1 - t0) == pytest.approx(lam_w, rel=0.05)
