"""llama.cpp's flash attention walks a sliding-window layer's whole SWA ring, not its
window (kvsim.engines.llama_cpp.swa_read_geometry): the ring's size, the geometry the
latency model reads through, and the KV bytes of one decode step counted by hand."""
from types import SimpleNamespace

import pytest

from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines import engine_for
from kvsim.engines._slot_layout import swa_ring_cells
from kvsim.latency.base import BatchShape
from kvsim.latency.factory import make_latency_model
from kvsim.latency.roofline import GpuRates
from kvsim.model.geometry import kv_geometry
from kvsim.scenario import load_scenario
from kvsim.validate.predict import Setup, latency_for

GEMMA = "gemma-3-4b"   # 5 full layers, 29 sliding (window 1024), 4 KV heads of 256


@pytest.mark.parametrize(("window", "ubatch", "seqs", "cap", "cells"), [
    (1024, 512, 1, None, 1536),     # Gemma 3, llama-server's default -ub
    (1024, 2048, 1, None, 3072),    # the DGX Spark's benches (-ub 2048)
    (128, 512, 1, None, 768),       # gpt-oss
    (128, 2048, 1, None, 2304),
    (1024, 512, 4, None, 4608),     # a -kvu pool of 4 slots: every slot's window
    (1024, 512, 1, 1000, 1024),     # a stream smaller than the ring: the stream, padded
])
def test_ring_is_window_plus_ubatch_padded_to_256(window, ubatch, seqs, cap, cells):
    assert swa_ring_cells(window, ubatch, seqs, cap) == cells


def test_only_sliding_groups_read_more_than_their_window():
    geo = kv_geometry(load_model(GEMMA))
    read = geo.windows_read_as(lambda w: w + 512)
    assert [(g.kind, g.window_tokens) for g in geo.groups] == \
        [("full", None), ("sliding", 1024)]
    assert [(g.kind, g.window_tokens) for g in read.groups] == \
        [("full", None), ("sliding", 1536)]
    assert [g.bytes_per_token for g in read.groups] == [g.bytes_per_token for g in geo.groups]


def test_per_slot_streams_read_the_ring_and_the_unified_pool_the_window():
    """llama-server on per-slot streams and Ollama from era D (which starts llama-server
    with -np): the ring; the -kvu pool and Ollama's own Go runners: the window."""
    geo = kv_geometry(load_model(GEMMA))
    eng = engine_for("llama.cpp")
    slots = eng.attention_geometry(SimpleNamespace(allocator="slots", n_ubatch=512), geo)
    pool = eng.attention_geometry(SimpleNamespace(allocator="unified", n_ubatch=512), geo)
    assert slots.groups[1].window_tokens == 1536 and pool is geo
    # Ollama's era D starts llama-server with an explicit -np: per-slot streams
    ollama = engine_for("ollama")
    era_d = ollama.attention_geometry(SimpleNamespace(ollama_version="0.33.0", n_ubatch=512),
                                      geo)
    go_runner = ollama.attention_geometry(
        SimpleNamespace(ollama_version="0.12.11", n_ubatch=512), geo)
    assert era_d.groups[1].window_tokens == 1536 and go_runner is geo


@pytest.mark.parametrize(("ubatch", "ring"), [(512, 1536), (2048, 3072)])
def test_a_deep_decode_step_reads_the_full_layers_and_the_ring(ubatch, ring):
    """Gemma 3 4B at 8,192 tokens: per token 5 × 4 × (256 + 256) × 2 = 20,480 bytes in
    the full layers, 29 × 4,096 = 118,784 in the sliding ones."""
    setup = Setup(load_gpu("rtx-4090"), load_model(GEMMA), "q4_0", "CUDA", True,
                  n_ubatch=ubatch)
    lat = latency_for(setup, rates=GpuRates(1.0, 1.0, 1.0, 1.0, 0.0))
    *_, kv_read = lat.gpu_parts(BatchShape(decode_context=(8192,)))
    assert kv_read == 20_480 * 8193 + 118_784 * ring
    *_, short = lat.gpu_parts(BatchShape(decode_context=(1000,)))
    assert short == (20_480 + 118_784) * 1001   # below the window: every cell its own


def test_a_scenario_on_per_slot_streams_prices_the_ring():
    base = ["model=gemma-3-4b", "weights=q4_0", "engine.preset=llama.cpp"]
    pool = make_latency_model(load_scenario("quickstart", base))
    slots = make_latency_model(load_scenario("quickstart", base + [
        "engine.allocator=slots"]))
    assert pool.geometry.groups[1].window_tokens == 1024
    assert slots.geometry.groups[1].window_tokens == 1536
    step = BatchShape(decode_context=(8192,))
    assert slots.step_time_s(step) > pool.step_time_s(step)
    ollama = ["engine=ollama", "model=gemma-3-4b", "weights=q4_0"]
    latest = make_latency_model(load_scenario("quickstart", ollama))
    era_c = make_latency_model(load_scenario("quickstart", ollama + [
        "engine.ollama_version=0.12.11"]))
    assert (latest.geometry.groups[1].window_tokens,
            era_c.geometry.groups[1].window_tokens) == (1536, 1024)
