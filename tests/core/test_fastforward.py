"""Fast-forward (``sim.fidelity=fast``) against the per-step reference
(docs/design/fast-forward.md).

Property: over random small workloads on every engine family (paged with and
without prefix caching, with V0 swap or with vLLM's hybrid sliding-window groups,
llama.cpp per-slot and unified, Ollama), with constant and roofline step times, half
of them crowded into tight pools (preemption, swaps, context failures, Ollama's
truncation and shifts; a fixed crowded workload per engine checks that each engine's
own way of running out happens, halved unified batches included), starting at zero
or after a simulated week or month, both fidelities give
the same per-request TTFT / E2E / inter-token distribution (relative difference
≤ 1e-9) stored in as many rows, the same token and cache counts, the same events
and the same memory samples and peaks.  Plus direct checks that the
fast mode really skips steps, and of the memory-bound guard.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.api import simulate
from kvsim.config.catalog import load_gpu, load_host, load_model
from kvsim.core.build import PoolSizing, make_scheduler
from kvsim.core.engine import Engine
from kvsim.core.fastforward import FastForward
from kvsim.errors import InputError
from kvsim.latency.constant import ConstantLatency
from kvsim.latency.roofline import RooflineLatency
from kvsim.metrics.gaps import expand
from kvsim.metrics.records import Recorder
from kvsim.model.geometry import kv_geometry
from kvsim.model.weights import model_weights
from kvsim.scenario import resolve_scenario
from kvsim.workload.schema import Session, Turn

ENGINES = {
    "vllm": {"preset": "vllm", "context_tokens": 2048},
    "vllm-nocache": {"preset": "vllm", "context_tokens": 2048, "enable_prefix_caching": False},
    # vLLM V0 swap: a victim's blocks copied to host memory and back over PCIe
    "vllm-swap": {"preset": "vllm", "context_tokens": 2048, "preemption_mode": "swap",
                  "swap_space_bytes": 10**9},
    "sglang": {"preset": "sglang", "context_tokens": 2048},  # retracts, freeing decoded KV
    # vLLM's hybrid manager: two 64-token sliding-window groups and a full group; a
    # small token budget caps admissions (a pop that cuts a hit must end a stretch)
    "vllm-swa": {"preset": "vllm", "context_tokens": 2048, "max_num_batched_tokens": 64},
    "llama-slots": {"preset": "llama.cpp", "context_tokens": 2048, "parallel": 2,
                    "allocator": "slots"},
    "llama-unified": {"preset": "llama.cpp", "context_tokens": 2048, "parallel": 3,
                      "allocator": "unified"},
    "ollama": {"preset": "ollama", "context_tokens": 1024, "parallel": 2},
    "llama-q8": {"preset": "llama.cpp", "context_tokens": 2048, "parallel": 2,
                 "allocator": "unified", "cache_type_k": "q8_0", "cache_type_v": "q8_0",
                 "flash_attn": True},
}
LATENCIES = [{"kind": "constant", "step_s": 0.02}, {"kind": "constant", "step_s": 0.013,
                                                     "decode_token_s": 0.001},
             {"kind": "roofline"}]
POLICIES = [(), ({"kind": "idle_offload", "idle_after_s": 1.0, "host_budget_bytes": 10**9},),
            ({"kind": "sliding_window", "window_tokens": 300},),  # slot engines only
            ({"kind": "recoverable_eviction", "window_tokens": 200, "chunk_tokens": 64},),
            ({"kind": "kivi", "residual_tokens": 64, "group_tokens": 32},),
            ({"kind": "score_eviction", "budget_tokens": 250, "chunk_tokens": 32},
             {"kind": "idle_offload", "idle_after_s": 0.5, "host_budget_bytes": 10**9})]
PAGED_HOST = ({"kind": "host_kv_cache"},)
SWA_GROUPS = (("sliding", 64), ("sliding", 64), ("full", 0))
INT_COLUMNS = ["turn", "prompt_tokens", "cached_tokens", "computed_prompt_tokens",
               "recomputed_tokens", "output_tokens", "preemptions"]
TIME_COLUMNS = ["arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s",
                "e2e_s", "itl_mean_s", "itl_p50_s", "itl_p95_s", "itl_max_s"]


@st.composite
def sessions(draw) -> list[Session]:
    # NOTE: late starts too: a week's clock resolves 1.2e-10 s, 5e-9 of a 25 ms gap
    t0 = draw(st.sampled_from([0.0, 0.0, 604_800.0, 2_592_000.0]))
    # crowded: 4-6 sessions inside 0.3 s with long prompts — 2,048- and 4,096-token pools
    # fill (preemption, swaps, halved batches, context failures, Ollama's truncation)
    crowded = draw(st.booleans())
    spread_s, tokens_in, max_out = (0.3, (300, 1900), 400) if crowded else (4.0, (1, 400), 250)
    out = []
    for k in range(draw(st.integers(4 if crowded else 1, 6 if crowded else 4))):
        n = draw(st.integers(1, 3))
        turns = [Turn(start_s=t0 + draw(st.floats(0, spread_s)),
                      input_tokens=draw(st.integers(*tokens_in)),
                      output_tokens=draw(st.integers(1, max_out)))]
        turns += [Turn(think_s=draw(st.sampled_from([0.0, 0.5, 2.0])),
                       input_tokens=draw(st.integers(1, 300)),
                       output_tokens=draw(st.integers(1, max_out))) for _ in range(n - 1)]
        out.append(Session(session_id=f"s{k}", turns=tuple(turns)))
    return sorted(out, key=lambda s: s.turns[0].start_s)


def crowded_sessions() -> list[Session]:
    """Five two-turn sessions arriving within 0.2 s (prompts 500–1,100 tokens, 300–460
    output tokens, then 120 in / 200 out) and one 2,100-token prompt: more than a
    2,048-token pool holds at once, and one prompt past a 2,048-token context."""
    out = [Session(session_id=f"p{k}", turns=(
        Turn(start_s=0.05 * k, input_tokens=500 + 150 * k, output_tokens=300 + 40 * k),
        Turn(think_s=0.0, input_tokens=120, output_tokens=200))) for k in range(5)]
    out.append(Session(session_id="long", turns=(Turn(start_s=0.2, input_tokens=2100,
                                                      output_tokens=10),)))
    return sorted(out, key=lambda s: s.turns[0].start_s)


def _run(engine: str, latency: dict, sess: list[Session], pool_tokens: int, interval: float,
         fidelity: str, policies: tuple = (), stop_s: float | None = None):
    sc = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b", "weights": "q4_k_m",
                           "engine": ENGINES[engine], "latency": latency, "workload": {},
                           "policies": list(policies),
                           "sim": {"fidelity": fidelity, "sample_interval_s": interval,
                                   "max_sim_time_s": stop_s}})
    slot = ENGINES[engine].get("parallel")
    swa = engine == "vllm-swa"
    sizing = PoolSizing(kv_pool_tokens=pool_tokens,
                        slot_tokens=pool_tokens // slot if engine != "llama-unified" and slot
                        else pool_tokens,
                        kv_reserved_bytes=pool_tokens * 1000,
                        # NOTE: vLLM starts only when one max-length request fits: 146
                        # blocks over SWA_GROUPS at 2048 tokens (kvsim.model.hybrid)
                        num_gpu_blocks=pool_tokens // 16 + 20 * swa,
                        block_tokens=16, static_device_bytes=10**9, device_bytes=2 * 10**9,
                        kv_groups=SWA_GROUPS if swa else ())
    return simulate(sc, sessions=sess, sizing=sizing)


def _gaps(res) -> dict[str, np.ndarray]:
    return {rid: np.sort(expand(g.gap_s, g.gap_delta_s, g["count"]))
            for rid, g in res.itl.groupby("request_id")}


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(((np.isnan(a) == np.isnan(b)) &
                 (np.isnan(a) | (np.abs(a - b) <= 1e-9 * np.maximum(np.abs(b), 1e-9)))).all())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine=st.sampled_from(sorted(ENGINES)), latency=st.sampled_from(LATENCIES),
       sess=sessions(), pool_tokens=st.sampled_from([2048, 4096, 16384]),
       interval=st.sampled_from([0.05, 0.3, 1.0]), policy=st.sampled_from(POLICIES),
       cut=st.sampled_from([None, None, 0.37, 1.3, 3.1]))
def test_fast_equals_step(engine, latency, sess, pool_tokens, interval, policy, cut) -> None:
    """... also when the clock stops the run (``cut`` seconds after the first arrival)
    with requests still running or waiting: the same unfinished rows."""
    if not engine.startswith(("llama", "ollama")):  # paged: the host tier (LMCache chunks
        policy = PAGED_HOST if policy and engine in ("vllm", "sglang") else ()  # on vLLM)
    if engine == "llama-q8" and policy and policy[0]["kind"] in ("kivi", "recoverable_eviction"):
        policy = ()  # NOTE: demotion needs an f16 cache
    stop = None if cut is None else sess[0].turns[0].start_s + cut
    fast = _run(engine, latency, sess, pool_tokens, interval, "fast", policy, stop)
    step = _run(engine, latency, sess, pool_tokens, interval, "step", policy, stop)
    _assert_same(fast, step)


# what a full 2,048-token pool does to crowded_sessions() on each engine (step mode, roofline)
PRESSURE = {
    "vllm": ({"preempt", "fail"}, "maximum context length exceeded"),
    "vllm-nocache": ({"preempt", "fail"}, "maximum context length exceeded"),
    "vllm-swap": ({"swap_out", "swap_in", "fail"}, "maximum context length exceeded"),
    "vllm-swa": ({"preempt", "fail"}, "maximum context length exceeded"),
    "sglang": ({"preempt", "fail"}, "maximum context length exceeded"),
    "llama-slots": ({"fail"}, "exceed_context_size_error"),
    "llama-q8": ({"fail"}, "exceed_context_size_error"),
    "llama-unified": ({"batch_halving", "fail"}, "Context size has been exceeded."),
    "ollama": ({"truncate_prompt", "context_shift"}, ""),
}


@pytest.mark.parametrize("latency", LATENCIES, ids=["const", "const+ctx", "roofline"])
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_fast_equals_step_when_the_pool_is_full(engine, latency, monkeypatch) -> None:
    """The property test's crowded draws, fixed: every engine's own way of running out
    (preemption, swap, halved batches, context failures, Ollama's shifts) happens,
    the fast mode skips steps, and both fidelities still agree."""
    made: list[FastForward] = []
    init = FastForward.__init__

    def keep(self, *a, **k) -> None:
        init(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(FastForward, "__init__", keep)
    fast = _run(engine, latency, crowded_sessions(), 2048, 0.3, "fast")
    step = _run(engine, latency, crowded_sessions(), 2048, 0.3, "step")
    kinds, reason = PRESSURE[engine]
    assert kinds <= set(step.events.kind), set(step.events.kind)
    assert reason in set(step.requests.failure_reason)
    assert len(made) == 1 and made[0].steps_skipped > 0
    _assert_same(fast, step)


def _assert_same(fast, step) -> None:
    """Per-request rows, gaps, memory samples, events and summary counts agree."""
    a, b = fast.requests, step.requests
    assert list(a.request_id) == list(b.request_id)
    assert list(a.status) == list(b.status)
    assert a[INT_COLUMNS].equals(b[INT_COLUMNS])
    for res in (fast, step):  # every request's counters add up to the summary's
        assert res.summary["preemptions"] == res.requests["preemptions"].sum()
        assert res.summary["output_tokens"] == res.requests["output_tokens"].sum()
        assert res.summary["unfinished_requests"] == (res.requests.status == "unfinished").sum()
    assert list(a.failure_reason) == list(b.failure_reason)
    for col in TIME_COLUMNS:
        assert _close(a[col].to_numpy(float), b[col].to_numpy(float)), col
    ga, gb = _gaps(fast), _gaps(step)
    assert ga.keys() == gb.keys()
    assert len(fast.itl) == len(step.itl)  # the same runs stored, not only the same gaps
    for rid in ga:
        assert len(ga[rid]) == len(gb[rid]) and _close(ga[rid], gb[rid]), rid
    ma, mb = fast.memory, step.memory
    assert ma.drop(columns="time_s").equals(mb.drop(columns="time_s"))
    assert _close(ma.time_s.to_numpy(), mb.time_s.to_numpy())
    assert fast.events.drop(columns="time_s").equals(step.events.drop(columns="time_s"))
    for key in ("peak_kv_allocated_bytes", "peak_kv_cached_bytes", "peak_kv_reserved_bytes",
                "output_tokens", "cached_tokens", "preemptions", "evictions", "steps",
                "failed_requests", "unfinished_requests", "requests"):
        assert fast.summary[key] == step.summary[key], key


def test_fast_mode_jumps_and_agrees_on_a_long_decode() -> None:
    """One request, 1,000 output tokens at 20 ms: 999 gaps of exactly one step each."""
    sess = [Session(session_id="s", turns=(Turn(start_s=0.0, input_tokens=100,
                                                output_tokens=1000),))]
    for fidelity in ("fast", "step"):
        sched = make_scheduler(resolve_scenario({
            "gpu": "rtx-4090", "model": "llama-3.1-8b", "engine": ENGINES["vllm"],
            "workload": {}}).engine, PoolSizing(
                kv_pool_tokens=4096, slot_tokens=4096, kv_reserved_bytes=256 * 100,
                num_gpu_blocks=256, block_tokens=16))
        eng = Engine(sched, ConstantLatency(0.02), sample_interval_s=1.0, fidelity=fidelity)
        end = eng.run(sess).end_s
        assert end == pytest.approx(1000 * 0.02)
        rec = eng.recorder
        assert sum(rec.itl_count) == 999
        # 1 prefill step + 999 decode steps merged into one steps row
        assert [r.steps for r in rec.steps] == [1, 999]
        if fidelity == "fast":
            # the 1 s sampler ticks do not cut stretches: a handful of jumps suffice
            assert eng.fastforward.stretches <= 3 and eng.fastforward.steps_skipped >= 990
        else:
            assert eng.fastforward is None
        # decode step s (from 0.02·s) holds 100 + s tokens; the tick at t sees step t/0.02
        # (or the one before if the summed step times land a hair above t — the same
        # block count at these t): ceil(tokens / 16) blocks of 100 bytes
        alloc = {round(r[0], 6): r[2] for r in rec.memory}
        for t, blocks in ((1.0, 10), (5.0, 22), (13.0, 47)):
            assert -(-(100 + round(t / 0.02)) // 16) == blocks
            assert alloc[t] == blocks * 100, (fidelity, t)


def test_too_many_requests_stop_with_a_clear_message() -> None:
    rec = Recorder(max_requests=3)
    rec.check_capacity(3)
    with pytest.raises(InputError, match="at most 3 requests per run"):
        rec.check_capacity(4)


def test_arrival_inside_a_decode_step_is_folded_and_exact() -> None:
    """A request decoding at 20 ms/step; a second one arrives at 1.005 s, inside step
    50 (1.00–1.02 s).  Fast mode runs steps 0..50 as one stretch (the arrival only
    joins the waiting queue, admitted at 1.02 s as in step mode) and agrees exactly."""
    sess = [Session(session_id="a", turns=(Turn(start_s=0.0, input_tokens=100,
                                                output_tokens=300),)),
            Session(session_id="b", turns=(Turn(start_s=1.005, input_tokens=50,
                                                output_tokens=20),))]
    fast, step = _run_both_vllm(sess, sample_interval_s=0.25)
    assert fast.fastforward.folded >= 1
    ra, rb = fast.recorder.requests, step.recorder.requests
    assert [r[0] for r in ra] == [r[0] for r in rb] == ["b#0", "a#0"]
    for x, y in zip(ra, rb):
        assert _close(np.array(x[5:12], dtype=float), np.array(y[5:12], dtype=float))
        assert x[12:19] == y[12:19]  # token counts
    # a's prefill is step 0 (0–0.02 s), its decode steps end at 0.02·k: b is admitted
    # at the end of the step it arrived in, 1.02 s
    assert ra[0][6] == pytest.approx(1.02, abs=1e-9)
    ma, mb = fast.recorder.memory, step.recorder.memory
    assert [m[1:] for m in ma] == [m[1:] for m in mb]
    assert _close(np.array([m[0] for m in ma]), np.array([m[0] for m in mb]))


def test_stretch_runs_through_completions_and_agrees() -> None:
    """Three requests arrive together (20 ms/step, constant latency): they finish after
    20, 45 and 80 output tokens.  Nothing else happens, so fast mode applies the whole
    decode phase in one jump through both early completions (each at its exact step
    end: the first token at 0.02 s after a 0.02 s prefill, then one every 0.02 s), and
    a third session's closed-loop turn that follows the first answer after 0.5 s think
    time cuts the stretch there and is admitted at the next step end, as in step mode."""
    def turn(out: int, **kw) -> Turn:
        return Turn(input_tokens=40, output_tokens=out, **kw)
    sess = [Session(session_id="a", turns=(turn(20, start_s=0.0), turn(10, think_s=0.5))),
            Session(session_id="b", turns=(turn(45, start_s=0.0),)),
            Session(session_id="c", turns=(turn(80, start_s=0.0),))]
    fast, step = _run_both_vllm(sess, sample_interval_s=0.1)
    ra, rb = fast.recorder.requests, step.recorder.requests
    assert [r[0] for r in ra] == [r[0] for r in rb] == ["a#0", "b#0", "a#1", "c#0"]
    finish = {r[0]: r[8] for r in ra}
    # one shared prefill step (0–0.02 s), then token k of every request at 0.02·(k+1)
    assert finish["a#0"] == pytest.approx(0.02 * 20, abs=1e-9)
    assert finish["b#0"] == pytest.approx(0.02 * 45, abs=1e-9)
    # a#1 arrives at 0.4 + 0.5 = 0.9 s — the instant b finishes — and is admitted then
    assert {r[0]: r[6] for r in ra}["a#1"] == pytest.approx(0.9, abs=1e-9)
    for x, y in zip(ra, rb):
        assert _close(np.array(x[5:12], dtype=float), np.array(y[5:12], dtype=float))
        assert x[12:19] == y[12:19]
    ma, mb = fast.recorder.memory, step.recorder.memory
    assert [m[1:] for m in ma] == [m[1:] for m in mb]
    assert _close(np.array([m[0] for m in ma]), np.array([m[0] for m in mb]))
    # two jumps: 0.02–0.88 s through a#0's completion (b's last step, 0.88–0.90 s, ends
    # at the follow-up's arrival and runs as a driver step), then from a#1's prefill
    # to the end through a#1's completion (stopping at every completion would take 4)
    assert fast.fastforward.stretches == 2


def _run_both_vllm(sess: list, sample_interval_s: float) -> tuple[Engine, Engine]:
    """The same sessions on a small vLLM pool (20 ms constant steps), fast and step."""
    out = {}
    for fidelity in ("fast", "step"):
        sched = make_scheduler(resolve_scenario({
            "gpu": "rtx-4090", "model": "llama-3.1-8b", "engine": ENGINES["vllm"],
            "workload": {}}).engine, PoolSizing(
                kv_pool_tokens=4096, slot_tokens=4096, kv_reserved_bytes=256 * 100,
                num_gpu_blocks=256, block_tokens=16))
        eng = Engine(sched, ConstantLatency(0.02), sample_interval_s=sample_interval_s,
                     fidelity=fidelity)
        eng.run(sess)
        out[fidelity] = eng
    return out["fast"], out["step"]


@pytest.mark.parametrize("gpu_layers", [None, 20])
@pytest.mark.parametrize("contexts", [(), (5,), (100, 2000, 31), tuple(range(1, 40))])
def test_short_stretch_step_times_equal_the_numpy_path(contexts, gpu_layers) -> None:
    """Short stretches take their roofline step times in scalar Python: bit-for-bit the
    numpy path's floats (both fidelities then see the same step ends), GPU-only and
    with layers offloaded to the CPU, with a dequantization cost (q8_0 KV)."""
    m = load_model("llama-3.1-8b")
    lat = RooflineLatency(gpu=load_gpu("rtx-4090"), host=load_host("desktop-64gb"), model=m,
                          geometry=kv_geometry(m, "q8_0", "q8_0"),
                          weights=model_weights(m, "q4_k_m"), gpu_layers=gpu_layers,
                          kv_quantized=True)
    for steps in (1, 7, 32):
        quick = lat.decode_steps_list(contexts, steps)
        assert quick == lat.decode_steps_s(np.array(contexts, dtype=np.int64), steps).tolist()


def test_fast_mode_jumps_between_demotions_and_agrees(monkeypatch) -> None:
    """One llama.cpp slot, 1,000 output tokens, recoverable eviction (window 200, chunk
    64, 4 sinks): a demotion is due each time the slot reaches watermark + 264 tokens —
    at 268, 332, ... (the prompt is 100 tokens, a decode step adds one).  Fast mode
    jumps from one to the next (the policy's quiet steps), every step carrying the
    dequantization stall of the tokens demoted so far, and agrees with step mode."""
    seen = []
    ended = FastForward._ended

    def spy(self, *args):
        seen.append(self)
        return ended(self, *args)
    monkeypatch.setattr(FastForward, "_ended", spy)
    sess = [Session(session_id="s", turns=(Turn(start_s=0.0, input_tokens=100,
                                                output_tokens=1000),))]
    pol = ({"kind": "recoverable_eviction", "window_tokens": 200, "chunk_tokens": 64},)
    fast, step = (_run("llama-slots", {"kind": "roofline"}, sess, 4096, 0.5, f, pol)
                  for f in ("fast", "step"))
    a, b = fast.events, step.events
    demoted = a[a.kind == "quantize"]
    # watermark 4 (the sinks), then +64 per demotion while the slot grows to 1,099 tokens
    assert len(demoted) == len(range(268, 1100, 64)) == 13
    assert a.drop(columns="time_s").equals(b.drop(columns="time_s"))
    assert _close(a.time_s.to_numpy(), b.time_s.to_numpy())
    for col in TIME_COLUMNS:
        assert _close(fast.requests[col].to_numpy(float), step.requests[col].to_numpy(float))
    assert fast.memory.drop(columns="time_s").equals(step.memory.drop(columns="time_s"))
    assert fast.summary["steps"] == step.summary["steps"] == 1000
    ff = seen[0]
    assert ff.steps_skipped >= 900 and ff.stretches <= 2 * 13 + 5


def test_sampler_ticks_stay_on_the_per_step_grid() -> None:
    # A tick 0.35 s + d cannot land on 1.5000000000000007 (the per-step grid's 1.50):
    # fast mode puts the instants it computed on the heap as they are, so the ticks,
    # and the one that meets the last completion at 4.499999999999992, match exactly.
    sess = [Session(session_id="s1", turns=(Turn(start_s=0.0, input_tokens=1, output_tokens=73),
                                            Turn(input_tokens=1, output_tokens=1))),
            Session(session_id="s0", turns=(Turn(start_s=0.015625, input_tokens=1,
                                                 output_tokens=48),
                                            Turn(think_s=0.5, input_tokens=1,
                                                 output_tokens=151))),
            Session(session_id="s2", turns=(Turn(start_s=0.3125, input_tokens=1,
                                                 output_tokens=1),))]
    lat = {"kind": "constant", "step_s": 0.02}
    fast = _run("vllm", lat, sess, 2048, 0.05, "fast")
    step = _run("vllm", lat, sess, 2048, 0.05, "step")
    assert len(fast.memory) == len(step.memory) == 93
    assert fast.memory.time_s.tolist() == step.memory.time_s.tolist()
    assert fast.memory.drop(columns="time_s").equals(step.memory.drop(columns="time_s"))


def _stopped(engine: str, latency: dict, fidelity: str, sess: list[Session]):
    from kvsim.errors import RunStopped
    res = _run(engine, latency, sess, 2048, 0.3, fidelity)
    assert isinstance(res.stopped, RunStopped)
    return res


@pytest.mark.parametrize("latency", LATENCIES, ids=["const", "const+ctx", "roofline"])
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_fast_equals_step_when_the_request_cap_stops_the_run(engine, latency,
                                                             monkeypatch) -> None:
    """Twelve one-turn sessions, one every 0.13 s (400-token prompts, 300 output tokens)
    against a cap of 8 requests: the 9th arrival (1.04 s) stops the run while others
    decode — possibly inside a step a fast stretch folded.  Both fidelities end after
    that step and keep the same rows: 8, those not done as unfinished."""
    monkeypatch.setattr("kvsim.metrics.records.MAX_REQUESTS", 8)
    sess = [Session(session_id=f"q{k:02d}", turns=(
        Turn(start_s=0.13 * k, input_tokens=400, output_tokens=300),)) for k in range(12)]
    fast = _stopped(engine, latency, "fast", sess)
    step = _stopped(engine, latency, "step", sess)
    _assert_same(fast, step)
    assert len(step.requests) == 8 and (step.requests.status == "unfinished").any()
    assert fast.summary["stopped_at_s"] == pytest.approx(step.summary["stopped_at_s"],
                                                         rel=1e-12)
    assert step.summary["stopped_at_s"] >= 8 * 0.13  # the 9th arrival, or its step's end
