"""Policies on paged engines (vLLM / SGLang) and recall that persists (promote, pins).

Paged reference scoring: vLLM always sends the full history, so a referenced span is
never lost — its KV is a GPU prefix hit, a host-tier load, or recomputed (INTACT
each time; the cost shows in TTFT, not in the recall score).
"""

import pytest

from kvsim.api import simulate
from kvsim.model.geometry import kv_geometry
from kvsim.scenario import load_scenario
from kvsim.workload.schema import ReferenceEvent, Session, Turn
from tests.policies.helpers import SPAN, doc_session, references, run

# 1 GiB pool of 16-token f16 blocks of Llama-3.1-8B (128 KiB/token): 512 blocks, 511 that
# hold KV (vLLM keeps block 0 as its null block).
SMALL = ["engine.kv_cache_memory_bytes=1GiB", "engine.context_tokens=8192", "policies=[]"]


def _vllm(*sets: str, sessions):
    sc = load_scenario("family-4-vllm", [*SMALL, *sets])
    return sc, simulate(sc, sessions=sessions)


def _intruder() -> Session:
    # 8000 tokens = 500 blocks at t=100 s, between the doc session's turns 1 and 2
    return Session(session_id="x", turns=(Turn(start_s=100.0, input_tokens=8000,
                                                output_tokens=1),))


def _detail(res) -> str:
    [d] = res.events[res.events["kind"] == "reference"]["detail"].tolist()
    return d


# Turn 2 = 5490 tokens, GPU hit 11 blocks (176 tokens; see the test below).  LMCache
# (default) stored whole 256-token chunks of each prompt: turn 1's 5450-token prompt
# -> 21 chunks = 5376 tokens = 336 blocks, so 325 blocks (5200 tokens) load.  Native
# offloading stored turn 1's whole chain up to block 341 -> 330 blocks (5280 tokens).
@pytest.mark.parametrize("backend, loaded", [("lmcache", 5200), ("native", 5280)])
def test_paged_reference_is_intact_and_names_where_its_kv_came_from(backend, loaded) -> None:
    doc = doc_session(think_s=60.0)
    _, alone = _vllm(sessions=[doc])
    assert "via=gpu" in _detail(alone) and references(alone) == [("INTACT", 1.0, 0.0, 0)]
    # Turn 1 leaves 5470 tokens cached (341 full blocks, 342 held) and 511 - 342 = 169
    # never-used blocks; the intruder's 500 blocks take those 169 and 331 of the
    # session's, last blocks first: 11 prefix blocks (176 tokens < the span at 400 + 96)
    # survive.
    _, evicted = _vllm(sessions=[doc, _intruder()])
    assert "via=recompute" in _detail(evicted)
    assert references(evicted) == [("INTACT", 1.0, 0.0, 0)]
    sc, host = _vllm(f"policies=[{{kind: host_kv_cache, backend: {backend}}}]",
                     sessions=[doc, _intruder()])
    assert "via=host" in _detail(host) and references(host) == [("INTACT", 1.0, 0.0, 0)]
    bpt = kv_geometry(sc.model).kv_bytes_per_token
    assert host.summary["host_load_bytes"] == loaded * bpt
    # offload_/restore_bytes count every policy's host traffic: the host tier's here
    assert host.summary["restore_bytes"] == loaded * bpt
    assert host.summary["offload_bytes"] == host.summary["host_store_bytes"] > 0
    t = {r: (e.set_index("request_id").loc["s#2"]) for r, e in
         (("evicted", evicted.requests), ("host", host.requests))}
    assert t["evicted"].cached_tokens == 176 and t["host"].cached_tokens == 176 + loaded
    copy_s = sc.link.latency_s + loaded * bpt / sc.link.h2d_bytes_per_s
    assert copy_s <= t["host"].ttft_s < t["evicted"].ttft_s


def test_family4_vllm_side_by_side() -> None:
    """f16 / fp8 / host tier on family-4-vllm-offload (2.5 GiB pool):

    - fp8: same reserved bytes, blocks of half the bytes → peak allocated about half;
      8-bit reads are INTACT (§6.4) → recall 1.0;
    - host tier: prefix blocks written back (d2h) and loaded on GPU misses (h2d) →
      PCIe bytes > 0 and p95 TTFT below f16's, recall unchanged.

    (Swap preemption only acts on a full pool, which this household day never reaches:
    it is tested on a pool that does fill, test_swap_preemption_on_a_full_pool below.)
    """
    rows = {"f16": ["policies=[]"], "fp8": ["policies=[]", "engine.cache_type_k=fp8",
                                            "engine.cache_type_v=fp8"],
            "host": []}
    s = {k: simulate(load_scenario("family-4-vllm-offload", v)).summary for k, v in rows.items()}
    f16, fp8, host = s["f16"], s["fp8"], s["host"]
    # Llama-3.1-8B KV (docs/reference/models.csv / docs/reference/engines.md §0): f16 2·32·8·128·2 =
    # 131,072 B/token, fp8 1 B/element = 65,536 B/token, plus per-tensor fp32 scales (32 layers ×
    # K,V × 4 B = 256 B, docs/reference/engines.md §0).  16-token blocks: f16 2 MiB, fp8 1 MiB.
    # f16: 2.5 GiB / 2 MiB = 1280 blocks exactly, 2,097,152 B each.
    gib = 2**30
    f16_block = 16 * 131072
    assert f16["peak_kv_reserved_bytes"] == 1280 * f16_block == 5 * gib // 2
    # fp8: (2.5 GiB − 256) / 1 MiB = 2559.99… → 2559 whole blocks (vLLM's num_gpu_blocks =
    # available // page size, docs/reference/engines.md §1.1); the reserved KV is those blocks, 1
    # MiB each: 2559 × 1,048,576 = 2,683,305,984 B (the 256 B of scales are not a block's).
    fp8_block = 16 * 65536
    assert fp8["peak_kv_reserved_bytes"] == 2559 * fp8_block == 2_683_305_984
    # allocated = whole blocks of each pool's block size
    f16_blocks, r16 = divmod(f16["peak_kv_allocated_bytes"], f16_block)
    fp8_blocks, r8 = divmod(fp8["peak_kv_allocated_bytes"], fp8_block)
    assert r16 == r8 == 0 and f16_blocks > 0 and fp8_blocks > 0
    # Half the bytes per block.  The peak block counts are not identical: fp8 halves the
    # KV read per decode step, so steps are shorter and requests overlap differently
    # (the same peak appears with fp8 on a 1280-block pool, so it is not the pool size);
    # within 2 % of each other, so the byte ratio is 0.5 ± 0.01.
    assert abs(fp8_blocks - f16_blocks) <= 0.02 * f16_blocks
    assert abs(fp8["peak_kv_allocated_bytes"] / f16["peak_kv_allocated_bytes"] - 0.5) <= 0.01
    assert f16["recall_mean"] == fp8["recall_mean"] == host["recall_mean"] == 1.0
    assert host["pcie_d2h_bytes"] > 0 and host["pcie_h2d_bytes"] == host["host_load_bytes"] > 0
    assert host["ttft_p95_s"] < f16["ttft_p95_s"]
    assert f16["pcie_h2d_bytes"] == f16["pcie_d2h_bytes"] == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_swap_preemption_on_a_full_pool(mode) -> None:
    """Two 400-token prompts with 300 outputs each at t=0 on a 128 MiB pool.

    128 MiB / 2 MiB (16 tokens × 131,072 B) = 64 blocks.  The prefill step admits both
    (800 tokens < the 2048-token budget): 25 blocks each.  Decode step k computes token
    400 + k of each request, which needs ceil((400 + k)/16) blocks: both fit while
    2·ceil((400 + k)/16) ≤ 64, i.e. k ≤ 112.  At k = 113 the first request (s0) needs
    its 33rd block with none free, so the last admitted (s1) is preempted with
    400 + 112 = 512 computed tokens = 32 blocks = 67,108,864 B.  s1 then needs 33
    blocks back, and only 64 − 33 = 31 are free until s0 finishes.
    """
    sc = load_scenario("family-4-vllm", [
        "engine.kv_cache_memory_bytes=128MiB", "engine.context_tokens=1024", "policies=[]",
        f"engine.preemption_mode={mode}", "engine.swap_space_bytes=4GiB"])
    sessions = [Session(session_id=f"s{i}", turns=(
        Turn(start_s=0.0, input_tokens=400, output_tokens=300),)) for i in range(2)]
    res = simulate(sc, sessions=sessions)
    s = res.summary
    assert (s["preemptions"], s["failed_requests"]) == (1, 0)
    victim = res.requests.set_index("request_id").loc["s1#0"]
    assert victim.preemptions == 1 and victim.output_tokens == 300
    if mode == "recompute":
        # blocks freed, no copy: the victim computes (part of) its 512 tokens again
        assert s["swap_outs"] == s["swap_out_bytes"] == s["swap_in_bytes"] == 0
        assert s["pcie_d2h_bytes"] == s["pcie_h2d_bytes"] == 0
        assert victim.recomputed_tokens > 0 and s["computed_prompt_tokens"] > 800
        return
    swapped = 32 * 16 * 131_072
    assert swapped == 67_108_864
    assert s["swap_outs"] == 1
    assert s["swap_out_bytes"] == s["swap_in_bytes"] == swapped
    # no host tier: the link carried the swap and nothing else, one copy each way
    assert s["pcie_d2h_bytes"] == s["pcie_h2d_bytes"] == swapped
    assert s["pcie_transfers"] == 2
    # PCIe 4.0 x16 (rtx-4090's link): 7.5 µs + 64 MiB / 25 GB/s per copy
    assert s["pcie_d2h_busy_s"] == pytest.approx(7.5e-6 + swapped / 25e9, rel=1e-9)
    ev = res.events[res.events["kind"].isin(["swap_out", "swap_in"])]
    assert ev[["kind", "request_id", "detail", "bytes"]].values.tolist() == [
        ["swap_out", "s1#0", "512 tokens", swapped], ["swap_in", "s1#0", "512 tokens", swapped]]
    # progress kept: nothing recomputed, and the copy back waits for s0's blocks
    assert victim.recomputed_tokens == 0 and s["computed_prompt_tokens"] == 800
    first = res.requests.set_index("request_id").loc["s0#0"]
    assert ev["time_s"].iloc[1] == pytest.approx(first.finish_s, abs=1e-9)


RECOVER = "policies=[{kind: recoverable_eviction, window_tokens: 1024, cache_type: q4_0}]"


def test_recalled_span_is_promoted_and_a_second_reference_is_intact_for_free() -> None:
    ref = ReferenceEvent(turn=0, part="input", offset_tokens=SPAN[0],
                         length_tokens=SPAN[1] - SPAN[0], content="exact")
    base = doc_session()
    again = Turn(think_s=5.0, input_tokens=20, output_tokens=10, references=(ref,))
    sess = base.model_copy(update={"turns": (*base.turns, again)})
    sc, res = run(RECOVER, sessions=[sess])
    first, second = references(res)
    bpt = kv_geometry(sc.model).kv_bytes_per_token
    assert first[0] == "RECOVERED" and first[3] == 16 * bpt
    assert second == ("INTACT", 1.0, 0.0, 0)  # PROMOTE: FULL_BACKED, no second transfer
    assert res.summary["promoted_tokens"] == 16
    assert res.summary["recall_bytes"] == 16 * bpt


def test_turn_boundaries_are_pinned_and_dropping_them_collapses() -> None:
    _, res = run("policies=[{kind: sliding_window, window_tokens: 1024, "
                 "pin_turn_boundaries: false}]")
    assert references(res) == [("COLLAPSE", 0.05, 0.0, 0)]  # kv-policies §1.8 / §6.4
    _, kept = run("policies=[{kind: sliding_window, window_tokens: 1024}]")
    assert references(kept) == [("LOST", 0.10, 0.0, 0)]
    # The last eviction runs after turn 1's 2001-token prompt (one n_batch 2048 step):
    # n = 3478 > 400 + 1024 + 256, and everything unpinned before the last 1024 tokens
    # (all inside turn 1's 2000-token input) goes.  The messages whose start lies in
    # the dropped range keep their first 4 tokens (boundary_tokens): turn 0's input,
    # turn 0's answer and turn 1's input → 3 × 4 = 12.  Turn 1's answer and turn 2's
    # input come after the window, so turn 2's prompt is 400 + 12 + 1024 + 20 + 20 =
    # 1476 with the pins and 400 + 1024 + 20 + 20 = 1464 without.
    turn2 = kept.requests.set_index("turn").loc[2]
    _, nopin = run("policies=[{kind: sliding_window, window_tokens: 1024, "
                   "pin_turn_boundaries: false}]")
    no_turn2 = nopin.requests.set_index("turn").loc[2]
    assert (turn2.prompt_tokens, no_turn2.prompt_tokens) == (1476, 1464)
    assert turn2.prompt_tokens - no_turn2.prompt_tokens == 3 * 4


VLLM_16K, SGLANG_16K = ("engine={preset: vllm, context_tokens: 16384}",
                        "engine={preset: sglang, context_tokens: 16384}")


@pytest.mark.parametrize("sets, field", [
    ([VLLM_16K, "policies=[{kind: sliding_window, window_tokens: 512}]"], "slot engines"),
    (["policies=[{kind: host_kv_cache}]"], "host_kv_cache"),
    ([VLLM_16K, "engine.preemption_mode=swap"], "swap_space_bytes"),
    ([SGLANG_16K, "gpu=strix-halo", "policies=[{kind: host_kv_cache}]"],
     "no host tier"),
])
def test_policy_engine_family_errors_are_one_line(sets, field) -> None:
    from kvsim.errors import InputError

    with pytest.raises(InputError) as exc:
        simulate(load_scenario("quickstart", ["workload.max_sessions=1", *sets]))
    assert field in str(exc.value) and "\n" not in str(exc.value)


def test_fast_forward_and_per_step_agree_with_a_host_tier() -> None:
    runs = [simulate(load_scenario("family-4-vllm-offload", [
        "workload.max_sessions=12", f"sim.fidelity={f}"])) for f in ("fast", "step")]
    fast, step = (r.requests.set_index("request_id").sort_index() for r in runs)
    assert (fast["ttft_s"] - step["ttft_s"]).abs().max() <= 1e-9
    assert runs[0].summary["host_load_bytes"] > 0
    for key in ("host_load_bytes", "host_store_bytes", "pcie_h2d_bytes", "recall_mean"):
        assert runs[0].summary[key] == runs[1].summary[key], key
