"""The paged host tier records its stores as events, as it records its loads: the
events table accounts for host_store_bytes (and the report's PCIe figure reads it)."""

from kvsim.api import simulate
from kvsim.scenario import load_scenario


def test_host_store_events_sum_to_the_counter():
    res = simulate(load_scenario("family-4-vllm-offload", []))
    ev = res.events
    store, load = ev[ev["kind"] == "host_store"], ev[ev["kind"] == "host_load"]
    assert len(store) > 0 and len(load) > 0
    assert int(store["bytes"].sum()) == res.summary["host_store_bytes"]
    assert int(load["bytes"].sum()) == res.summary["host_load_bytes"]
    # each store is whole blocks: 16 tokens x 131,072 B (llama-3.1-8b f16) = 2 MiB
    assert (store["bytes"] % (16 * 131072) == 0).all()
