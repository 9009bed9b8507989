"""Capacity search on real static layouts with a closed-form runner."""

import pytest
from plan_fake_runners import plan_run, spiky_oom_run, spiky_run

from kvsim.errors import InputError
from kvsim.plan.flags import configure, engine_flags
from kvsim.plan.search import PlanGrid, search
from kvsim.plan.slo import build_constraints
from kvsim.scenario import resolve_scenario

CONTEXTS = (4096, 8192, 16384, 24576, 32768, 49152, 65536, 98304, 131072)
PARALLELS = (1, 2, 4, 8)
C = build_constraints(["ttft_p95=0.9s"], max_device_fraction=0.85, max_oom_risk=0.0)


def scen(gpu: str, engine=None):
    return resolve_scenario({"gpu": gpu, "model": "llama-3.1-8b",
                             "engine": engine or {"preset": "llama.cpp", "allocator": "slots"},
                             "workload": {"preset": "family-4", "days": 0.1}})


# The feasible region by hand, from reference facts only (no kvsim function is called).
# Scenario: llama-3.1-8b, q4_k_m weights, llama-server with --parallel p and no -kvu
# (per-slot streams), f16 KV, -fa on, n_ubatch 512, 400 MiB CUDA context, no display.
# A plan point (context c, parallel p) is `-c c*p --parallel p`: p slots of c cells.
#
#   KV per token   2 (K,V) x 32 layers x 8 kv heads x 128 dim x 2 B  =     131,072 B
#                  (docs/reference/models.csv kv_bytes_per_token_fp16)
#   weights        8.03e9 params x 4.84 bpw / 8 (q4_k_m, llama.cpp quantize README)
#                  embedding = output head = 128256 x 4096 = 525,336,576 params; the
#                  embedding stays on the CPU (llama.cpp input layer), the head and
#                  32 layers of (8.03e9 - 2 x 525,336,576) / 32 = 218,103,964 go up:
#                  32 x int(218,103,964 x 0.605) + int(525,336,576 x 0.605)
#                  = 32 x 131,952,898 + 317,828,628                  = 4,540,321,364 B
#   compute buf    512 x 128256 x 4 (f32 logits) + 512 x 4096 x 16   =   296,222,720 B
#   CUDA context   400 MiB (scenario default; h-and-m.md §4 ~0.4 GiB) =   419,430,400 B
#   fixed rows                                                        = 5,255,974,484 B
#
# Rule: all layers on the GPU (--fit keeps 1 GiB free; 0.85 x VRAM is stricter on every
# card here) and fixed + 131,072 x c x p <= 0.85 x VRAM; plus the fake runner's
# c >= 8192 (shorter sessions fail requests) and 0.2 s x p <= 0.9 s (p <= 4).
#
#   GPU            VRAM (bytes)     0.85 x VRAM - fixed   / 131,072 = max c x p
#   4060 Ti 16GB   17,179,869,184    9,346,914,322         71,311  (65,536 ok, 98,304 no)
#   4090 24GB      25,769,803,776   16,648,358,725        127,016  (98,304 ok, 131,072 no)
#   5090 32GB      34,359,738,368   23,949,803,128        182,722  (131,072 ok, 196,608 no)
EXPECTED_FEASIBLE = {
    # c x p <= 71,311: p=1 up to 65536, p=2 up to 32768, p=4 up to 16384
    "rtx-4060-ti-16gb": {(c, 1) for c in (8192, 16384, 24576, 32768, 49152, 65536)}
    | {(c, 2) for c in (8192, 16384, 24576, 32768)}
    | {(c, 4) for c in (8192, 16384)},
    # c x p <= 127,016: p=1 up to 98304, p=2 up to 49152, p=4 up to 24576
    "rtx-4090": {(c, 1) for c in (8192, 16384, 24576, 32768, 49152, 65536, 98304)}
    | {(c, 2) for c in (8192, 16384, 24576, 32768, 49152)}
    | {(c, 4) for c in (8192, 16384, 24576)},
    # c x p <= 182,722: p=1 up to 131072, p=2 up to 65536, p=4 up to 32768
    "rtx-5090": {(c, 1) for c in (8192, 16384, 24576, 32768, 49152, 65536, 98304, 131072)}
    | {(c, 2) for c in (8192, 16384, 24576, 32768, 49152, 65536)}
    | {(c, 4) for c in (8192, 16384, 24576, 32768)},
}


def feasible(res) -> set:
    t = res.table
    return {(int(r.context_tokens), int(r.parallel)) for r in t[t.feasible].itertuples()}


@pytest.fixture(scope="module")
def plans():
    return {g: search(scen(g), C, PlanGrid(CONTEXTS, PARALLELS), replications=2,
                      runner=plan_run)
            for g in ("rtx-4060-ti-16gb", "rtx-4090", "rtx-5090")}


def test_feasible_region_matches_hand_derivation(plans):
    for g, res in plans.items():
        assert feasible(res) == EXPECTED_FEASIBLE[g], g
        assert len(res.table) == len(CONTEXTS) * len(PARALLELS)


def test_region_grows_with_memory(plans):
    a, b, c = (feasible(plans[g]) for g in ("rtx-4060-ti-16gb", "rtx-4090", "rtx-5090"))
    assert a < b < c


def test_binding_constraints(plans):
    t = plans["rtx-4090"].table.set_index(["context_tokens", "parallel"])
    assert t.loc[(4096, 1), "binding"] == "oom_risk"   # 4096 tokens per session: requests fail
    assert t.loc[(8192, 8), "binding"] == "ttft_p95"   # 0.2 s × 8 = 1.6 s > 0.9 s
    assert t.loc[(16384, 8), "binding"] == "device_fraction"  # 0.871 of 24 GiB at load
    assert t.loc[(65536, 4), "binding"] == "offload"   # --fit spills layers to the CPU
    assert t.loc[(65536, 1), "binding"] == ""


def test_pruned_points_are_verified(plans):
    t = plans["rtx-4090"].table
    pruned = t[t.evaluated.str.startswith("pruned")]
    assert len(pruned) > 0 and not pruned.feasible.any()
    assert set(pruned.verified) == {True}
    assert "pruned by memory monotonicity" in plans["rtx-4090"].notes[0]


def test_front_and_recommendation(plans):
    res = plans["rtx-4090"]
    front = {(int(r.context_tokens), int(r.parallel)) for r in res.front.itertuples()}
    # the largest feasible context for p = 1, 2, 4 (the layouts' fractions by hand:
    # 24 GiB holds 98304 f16 tokens of 128 KiB each beside the weights, not 131072)
    assert front == {(98304, 1), (49152, 2), (24576, 4)}
    rec = res.recommendation
    # 98304 session-tokens beat 98304 = 2 × 49152 = 4 × 24576 only on TTFT (0.2 s × p)
    assert (rec["context_tokens"], rec["parallel"]) == (98304, 1)
    assert rec["flags"] == ("llama-server -m llama-3.1-8b-q4_k_m.gguf -c 98304 --parallel 1 "
                            "-ctk f16 -ctv f16 -fa on")


def test_broken_monotonicity_is_detected_and_repaired():
    res = search(scen("rtx-5090"), C, PlanGrid((8192, 16384), (2, 4)), replications=2,
                 runner=spiky_run)
    t = res.table.set_index(["context_tokens", "parallel"])
    assert t.loc[(8192, 2), "binding"] == "device_fraction"   # the spike
    # its dominating neighbours were pruned, the boundary simulation found them feasible
    assert bool(t.loc[(16384, 2), "feasible"]) and bool(t.loc[(8192, 4), "feasible"])
    assert "monotonicity did not hold" in res.notes[0]


def test_a_boundary_point_that_fits_in_memory_is_judged_on_every_run():
    # 8192 x 2 spikes over the line, so 16384 x 2 (which it dominates) is pruned; the
    # boundary check (two seeds) finds no OOM there, so the group is redone with all
    # eight seeds, the boundary too: six of eight OOM -> risk 0.75, not recommended
    C1 = build_constraints([], max_oom_risk=0.01)
    res = search(scen("rtx-4090"), C1, PlanGrid((8192, 16384), (1, 2)), replications=8,
                 runner=spiky_oom_run)
    t = res.table.set_index(["context_tokens", "parallel"])
    assert (t.loc[(16384, 2), "replications"], t.loc[(16384, 2), "oom_risk"]) == (8, 0.75)
    assert not bool(t.loc[(16384, 2), "feasible"])
    rec = res.recommendation
    assert (rec["context_tokens"], rec["parallel"], rec["replications"]) == (16384, 1, 8)


def test_conservative_checks_the_boundary_on_memory_not_on_two_runs_bound():
    # no OOM anywhere: with 8 runs the Wilson upper bound of 0/8 is 0.32 < 0.5, so
    # 16384 x 2 is feasible; its two-run check (bound 0.66) must not count as a wall
    C5 = build_constraints([], max_oom_risk=0.5)
    res = search(scen("rtx-4090"), C5, PlanGrid((8192, 16384), (1, 2)), replications=8,
                 runner=spiky_run, conservative=True)
    t = res.table.set_index(["context_tokens", "parallel"])
    assert bool(t.loc[(16384, 2), "feasible"])
    assert (res.recommendation["context_tokens"], res.recommendation["parallel"]) == (16384, 2)


def test_conservative_refuses_an_oom_limit_no_point_can_pass():
    # Wilson 95 %, 0 of n: upper bound z^2 / (n + z^2) = 3.8415 / 11.8415 = 0.324 at n = 8;
    # below 0.01 needs n > 3.8415 x 99 = 380.3
    with pytest.raises(InputError, match="0.324; use at least 381 replications"):
        search(scen("rtx-4090"), build_constraints([], max_oom_risk=0.01),
               PlanGrid((8192,), (1,)), replications=8, runner=plan_run, conservative=True)


def test_engine_flags_per_engine():
    s = configure(scen("rtx-4090", {"preset": "ollama"}), 16384, 2, "q8_0", None, 0.85)
    assert engine_flags(s) == ("OLLAMA_NUM_PARALLEL=2 OLLAMA_CONTEXT_LENGTH=16384 "
                               "OLLAMA_KV_CACHE_TYPE=q8_0 OLLAMA_FLASH_ATTENTION=1 ollama serve")
    v = configure(scen("rtx-4090", {"preset": "vllm"}), 32768, 8, "fp8", None, 0.85)
    # the share is what is left of 85 % of the 24080 MiB the driver reports after the 400 MiB
    # driver reserve less the 0.35 GiB of non-torch memory inside the share that holds it
    # (the newest release also keeps its CUDA graphs inside): floor((0.85 x 24080 MiB -
    # (400 MiB - 0.35 GiB)) / 24080 MiB, 3 decimals) = 0.848
    # (the scenario's weights are q4_k_m: a GGUF file, served with the repo's tokenizer)
    assert engine_flags(v) == ("vllm serve <Q4_K_M GGUF file of meta-llama/Llama-3.1-8B> "
                               "--tokenizer meta-llama/Llama-3.1-8B --max-model-len 32768 "
                               "--max-num-seqs 8 --gpu-memory-utilization 0.848 "
                               "--kv-cache-dtype fp8")
    off = configure(scen("rtx-4090", {"preset": "vllm",
                                      "disable_hybrid_kv_cache_manager": True}),
                    32768, 8, "fp8", None, 0.85)
    assert engine_flags(off).endswith("--kv-cache-dtype fp8 --disable-hybrid-kv-cache-manager")
    u = configure(scen("rtx-4090", {"preset": "llama.cpp"}), 8192, 4, "q4_0", None, 0.85)
    assert engine_flags(u).endswith("-c 32768 --parallel 4 -ctk q4_0 -ctv q4_0 -fa on -kvu")


def test_empty_grid_is_an_input_error():
    with pytest.raises(InputError, match="empty grid"):
        PlanGrid((), (1, 2))


def test_points_the_engine_refuses_stay_in_their_kv_group():
    # a point whose configuration is refused gets the scenario's KV type, so the plan
    # report draws one grid, not a separate one for the refused cells
    from kvsim.errors import InputError as Refused
    from kvsim.plan.replicate import RunOutput
    from kvsim.report.data_plan import plan_grids

    def run(s):
        if s.engine.context_tokens == 8192:  # per session
            raise Refused("policies.0.window_tokens", 9000, "larger than the context")
        return RunOutput({"ttft_p95_s": 0.1, "peak_device_fraction": 0.5}, "")

    res = search(scen("rtx-4090"), build_constraints([]), PlanGrid((8192, 16384), (1, 2)),
                 replications=2, runner=run)
    assert set(res.table["kv_dtype"]) == {"f16"}
    assert [g["label"] for g in plan_grids(res.table)] == ["kv_dtype=f16 · policy=scenario"]


def test_plan_points_keep_the_whole_device_within_the_limit() -> None:
    from kvsim.engines.budget import memory_budget
    for preset in ("vllm", "sglang"):
        s = configure(scen("rtx-4090", {"preset": preset}), 8192, 2, None, None, 0.85)
        b = memory_budget(s.gpu, s.model, s.weights, s.engine,
                          driver_reserve_bytes=s.driver_reserve_bytes,
                          display_reserve_bytes=s.display_reserve_bytes)
        assert b.device_fraction <= 0.85, preset
        # and the share is not lowered further than that: 0.001 more goes over
        more = s.engine.model_copy(update={"gpu_memory_utilization":
                                           s.engine.gpu_memory_utilization + 0.001})
        assert memory_budget(s.gpu, s.model, s.weights, more,
                             driver_reserve_bytes=s.driver_reserve_bytes).device_fraction > 0.85
