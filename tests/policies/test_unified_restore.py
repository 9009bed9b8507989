"""On a unified-memory GPU the prompt cache restore is counted like the save (audit:
``restore_bytes`` was 0 beside 4.34 GB of ``restore`` events, with no PCIe link)."""

import pytest

from kvsim.api import simulate
from kvsim.scenario import load_scenario
from kvsim.workload.schema import Session, Turn

# llama-3.1-8b, f16 KV: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes
BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2  # 131,072


@pytest.mark.parametrize("gpu", ["apple-m2-ultra", "rtx-4090"])
def test_a_slot_restored_from_the_ram_cache_counts_its_bytes(gpu) -> None:
    """One slot: a (3,000-token prompt, 50 out) finishes; b arrives at 10 s and takes
    the slot over, saving a's 3,049 tokens (prompt + output - 1) to the RAM cache; a's
    next turn takes it back, saving b's 2,029 and restoring a's 3,049."""
    sessions = [Session(session_id="a", turns=(
        Turn(start_s=0.0, input_tokens=3000, output_tokens=50),
        Turn(think_s=60.0, input_tokens=20, output_tokens=10))),
        Session(session_id="b", turns=(Turn(start_s=10.0, input_tokens=2000,
                                            output_tokens=30),))]
    sc = load_scenario("quickstart", ["engine.parallel=1", "engine.context_tokens=16384",
                                      f"gpu={gpu}"])
    res = simulate(sc, sessions=sessions)
    s = res.summary
    restores = res.events[res.events["kind"] == "restore"]
    assert list(restores["bytes"]) == [3049 * BYTES_PER_TOKEN]  # 399,638,528
    assert s["restore_bytes"] == 3049 * BYTES_PER_TOKEN and s["restore_recomputes"] == 0
    assert s["offload_bytes"] == (3049 + 2029) * BYTES_PER_TOKEN  # 665,583,616
