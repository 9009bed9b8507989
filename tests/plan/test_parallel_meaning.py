"""One meaning of *parallel* for plan, compare and fit (kvsim.plan.parallel), the
vLLM/SGLang checkpoint in plan's flags, and what plan's p95 figure is.

The vLLM layout by hand (Llama-3.1-8B AWQ on an RTX 4090, whose driver reports 24080 MiB =
25,249,710,080 B; vLLM's newest release: block 16 tokens, 2048 batched tokens, non-torch
0.35 GiB = 375,809,638 B and CUDA graphs 0.65 GiB = 697,932,186 B both inside the share;
400 MiB driver reserve, the CUDA context that the non-torch memory already counts):

  fraction  floor((0.85 x 25,249,710,080 - (419,430,400 - 375,809,638))
                  / 25,249,710,080 x 1000) / 1000 = floor(848.27) / 1000   = 0.848
  share     int(0.848 x 25,249,710,080)                           = 21,411,754,147 B
  activation (max_num_seqs s <= 128) the MLP's 2048 x 2 x (3 x 14,336 + 3 x 4,096)
            = 226,492,416 (the sampler's 2048 x 4096 x 2 + s x 128,256 x 8 is smaller)
  block     16 x 131,072 B (f16 KV per token, docs/reference/engines.md §0)      =  2,097,152 B
  pool      (share - W - activation - 375,809,638 - 697,932,186) // 2,097,152 blocks x 16
            tokens, W = the AWQ weights (5,727,324,704 B, kvsim.model.weights: embedding
            and head at 16 bits): 14,384,195,203 -> 6,858 blocks = 109,728 tokens
            held at 32768: 109,728 // 32,768 = 3 (concurrency 3.35x); at 65536: 1
So (32768, 1), (32768, 2) and (65536, 1) hold their sessions; (65536, 2), (32768, 4)
and (65536, 4) do not — the audit's recommendation 65536 x 4 was one of them.
"""

import functools
import json

import pytest
from click.testing import CliRunner
from plan_fake_runners import plan_run

from kvsim.cli import cli
from kvsim.plan.compare import compare_gpus
from kvsim.plan.flags import configure, engine_flags, flag_notes
from kvsim.plan.replicate import replicate, replication_seeds
from kvsim.plan.search import PlanGrid, search
from kvsim.plan.slo import build_constraints
from kvsim.scenario import load_scenario, resolve_scenario

C = build_constraints(["ttft_p95=2s"], max_oom_risk=0.0)
GRID = PlanGrid((32768, 65536), (1, 2, 4))


def awq_vllm():
    return load_scenario("family-4-vllm", ["weights=awq"])


def test_vllm_points_whose_pool_does_not_hold_parallel_are_infeasible():
    res = search(awq_vllm(), C, GRID, replications=1, runner=plan_run)
    t = res.table.set_index(["context_tokens", "parallel"])
    assert {k for k in t.index if t.loc[k, "feasible"]} == {(32768, 1), (32768, 2),
                                                             (65536, 1)}
    assert {k: t.loc[k, "binding"] for k in t.index if not t.loc[k, "feasible"]} == {
        (65536, 2): "kv_pool", (32768, 4): "kv_pool", (65536, 4): "kv_pool"}
    assert t.loc[(32768, 4), "notes"] == (
        "the KV pool holds 3 of the 4 requests at 32,768 tokens (concurrency 3.35x): vllm "
        "admits 4 (--max-num-seqs 4) but preempts and recomputes them when they outgrow "
        "the pool")
    # tie at 65,536 session-tokens: 65536 x 1 has the lower TTFT (plan_run: 0.2 s x par)
    rec = res.recommendation
    assert (rec["context_tokens"], rec["parallel"]) == (65536, 1)
    assert rec["flags"] == ("vllm serve <AWQ checkpoint of meta-llama/Llama-3.1-8B> "
                            "--max-model-len 65536 --max-num-seqs 1 "
                            "--gpu-memory-utilization 0.848 --kv-cache-dtype auto")


def test_compare_prices_sessions_the_pool_holds():
    # before: max par 4 (65536 x 4 "feasible") -> 1599 / 4 = 399.75 USD per session
    one = functools.partial(search, replications=1, runner=plan_run)
    res = compare_gpus(awq_vllm(), ["rtx-4090"], C, GRID, search_fn=one)
    row = res.table.iloc[0]
    assert (row["max_parallel"], row["price_usd"]) == (2, 1599)
    assert row["usd_per_session"] == 1599 / 2 == 799.5


def test_fit_with_plans_flags_agrees(capsys):
    """fit given what plan prints for a point: the same pool, and the same answer."""
    from kvsim.cli import main
    from kvsim.engines.budget import memory_budget

    for ctx, par, held in ((32768, 2, 3), (65536, 4, 1)):
        s = configure(awq_vllm(), ctx, par, None, None, 0.85)
        assert f"--max-num-seqs {par} --gpu-memory-utilization 0.848" in engine_flags(s)
        b = memory_budget(s.gpu, s.model, s.weights, s.engine, parallel=par)
        with pytest.raises(SystemExit):
            main(["fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b", "--weights", "awq",
                  "--engine", "vllm", "--context", str(ctx), "--parallel", str(par),
                  "--gpu-util", "0.848", "--json"])
        d = json.loads(capsys.readouterr().out)
        assert (d["kv_pool_tokens"], d["activation_bytes"]) == (b.kv_pool_tokens,
                                                                b.activation_bytes)
        assert d["max_num_seqs"] == par and d["full_length_held"] == held
        assert d["max_parallel_at_85"] == (3 if ctx == 32768 else 1)
    # AWQ: embedding + head at 16 bits, W = 5,727,324,704 B; 6,858 blocks x 16 = 109,728
    assert d["kv_pool_tokens"] == 109_728 and d["activation_bytes"] == 226_492_416
    assert d["verdict"].startswith("LOADS, BUT NOT PARALLEL 4 AT FULL LENGTH — the KV pool "
                                   "holds 1 of the 4 requests at 65,536 tokens")


@pytest.mark.parametrize("weights,preset,model_arg,notes", [
    ("bf16", "vllm", "vllm serve meta-llama/Llama-3.1-8B --max-model-len", []),
    ("awq", "sglang", ("python -m sglang.launch_server --model-path <AWQ checkpoint of "
                       "meta-llama/Llama-3.1-8B> --context-length"), ["AWQ checkpoint"]),
    ("gptq", "vllm", "vllm serve <GPTQ checkpoint of meta-llama/Llama-3.1-8B> --max-model-len",
     ["GPTQ format"]),
    ("fp8", "vllm", "vllm serve meta-llama/Llama-3.1-8B --quantization fp8 --max-model-len",
     ["quantizes meta-llama/Llama-3.1-8B to FP8 while loading"]),
    ("q4_k_m", "vllm", ("vllm serve <Q4_K_M GGUF file of meta-llama/Llama-3.1-8B> "
                        "--tokenizer meta-llama/Llama-3.1-8B --max-model-len"),
     ["single-file Q4_K_M GGUF"]),
])
def test_paged_flags_name_the_checkpoint_of_the_weights(weights, preset, model_arg, notes):
    s = resolve_scenario({"gpu": "rtx-4090", "model": "llama-3.1-8b", "weights": weights,
                          "engine": {"preset": preset},
                          "workload": {"preset": "family-4", "days": 0.1}})
    s = configure(s, 8192, 2, None, None, 0.85)
    assert engine_flags(s).startswith(model_arg)
    assert "--quantization awq" not in engine_flags(s)
    got = flag_notes(s)
    assert len(got) == len(notes) and all(n in g for n, g in zip(notes, got))


@pytest.mark.parametrize("model,repo", [("jamba-v0.1", "ai21labs/Jamba-v0.1"),
                                        ("qwen2.5-32b", "Qwen/Qwen2.5-32B")])
def test_the_checkpoint_is_the_models_own_repo_not_its_same_geometry_list(model, repo):
    # hf_repo lists other checkpoints of the same geometry after ';' (AI21-Jamba-1.5-Mini,
    # DeepSeek-R1-Distill-Qwen-32B): vllm serve takes the first
    s = resolve_scenario({"gpu": "h100-sxm5-80gb", "model": model, "weights": "bf16",
                          "engine": {"preset": "vllm", "context_tokens": 8192},
                          "workload": {"preset": "family-4", "days": 0.1}})
    assert engine_flags(s).startswith(f"vllm serve {repo} --max-model-len")


def test_awq_note_says_why_no_quantization_flag():
    s = configure(awq_vllm(), 8192, 2, None, None, 0.85)
    assert flag_notes(s) == [(
        "replace <AWQ checkpoint of meta-llama/Llama-3.1-8B> by a checkpoint of "
        "meta-llama/Llama-3.1-8B in AWQ format (a local folder or a Hugging Face id; "
        "meta-llama/Llama-3.1-8B itself only if it is published in AWQ): vllm reads the "
        "quantization from its config.json quantization_config (AWQ on the faster "
        "awq_marlin kernel; --quantization awq would force the slower awq one), so no "
        "--quantization flag is needed")]


def test_plan_replications_do_not_include_the_scenarios_own_seed():
    # SeedSequence([0, crc32("replications")]).spawn(8): none is 0, the seed that
    # `kvsim simulate quickstart` runs
    seeds = replication_seeds(0, 8)
    assert seeds == [603300820, 4092097016, 2533026501, 2097258871, 3161682774, 22001724,
                     2799461329, 1624464434]
    s = load_scenario("quickstart")
    reps = replicate(s, 3, runner=lambda sc: plan_run(sc))
    assert s.seed == 0 and 0 not in reps.seeds and list(reps.seeds) == seeds[:3]


def test_plan_output_heads_the_p95_columns_as_means_and_explains_them():
    res = CliRunner().invoke(cli, [
        "plan", "family-4-vllm", "--set", "weights=awq", "--slo", "ttft_p95=2s",
        "--max-oom-risk", "0", "--contexts", "32768,65536", "--parallel", "1,2,4",
        "--runner", "plan_fake_runners:plan_run", "-j", "1", "-n", "2", "--no-progress"])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    # a runner that gives summaries only: the runs' own p95s, averaged, and headed so
    assert "mean TTFT p95" in flat and "mean ITL p95" in flat
    assert ("note: mean TTFT/ITL p95: each of the 2 seeded runs' own p95, averaged (95 % "
            "Student-t CI of that mean, none from one run: *_low/*_high in plan.csv; the SLOs judge the mean, "
            "or the CI's upper end with --conservative). The runs' seeds are split from the "
            "scenario's seed and do not include it: 'kvsim simulate' runs that seed itself, "
            "one more draw that may fall outside the CI") in flat
    assert "note: kv_pool: the vllm/sglang block pool holds fewer than parallel" in flat
    assert ("recommended: context 65536 × parallel 1 (kv f16, policy scenario) vllm serve "
            "<AWQ checkpoint of meta-llama/Llama-3.1-8B> --max-model-len 65536 "
            "--max-num-seqs 1 --gpu-memory-utilization 0.848 --kv-cache-dtype auto "
            "note: replace <AWQ checkpoint") in flat
