"""`kvsim fit` takes values the way a scenario does: the same reserve rule (refused
with exit 2) and the same llama.cpp allocator for a given parallel, which it names."""

import json

import pytest
from click.testing import CliRunner

from kvsim.cli import cli, main
from kvsim.engines.budget import memory_budget
from kvsim.errors import InputError
from kvsim.scenario import load_scenario, resolve_scenario

# RTX 4090: 24 GiB = 25,769,803,776 B; driver reserve default 400 MiB = 419,430,400 B;
# the largest display reserve a scenario accepts: the 4090 as CUDA reports it (24,080 MiB,
# kvsim.config.device_memory) less the driver reserve, less 1: 25,249,710,080 - 419,430,400 - 1
USABLE, DRIVER = 25_249_710_080, 419_430_400
LAST_OK = USABLE - DRIVER - 1  # 24,830,279,679


def run(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(["fit", *argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_display_reserve_over_the_card_is_refused_like_a_scenario(capsys):
    code, out, err = run(capsys, "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                         "--display-reserve", "30GiB")
    assert (code, out) == (2, "")
    assert err == ("error: --display-reserve: '30GiB' — plus --driver-reserve (419430400) "
                   "must be less than the GPU's 25249710080 bytes (rtx-4090)\n")


@pytest.mark.parametrize("display,refused", [(LAST_OK, False), (LAST_OK + 1, True)])
def test_reserve_boundary_is_the_scenarios(capsys, display, refused):
    doc = {"gpu": "rtx-4090", "model": "llama-3.1-8b", "display_reserve_bytes": display,
           "workload": {"preset": "family-4", "days": 0.1}}
    try:
        resolve_scenario(doc)
        scenario_refused = False
    except InputError:
        scenario_refused = True
    code, _, _ = run(capsys, "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                     "--display-reserve", str(display), "--json")
    assert scenario_refused is refused and (code == 2) is refused


def _fit_json(capsys, *extra):
    code, out, _ = run(capsys, "--gpu", "rtx-4060-ti-16gb", "--model", "llama-3.1-8b",
                       "--ctx-size", "16384", "--parallel", "4", "--json", *extra)
    assert code == 0
    return json.loads(out)


@pytest.mark.parametrize("extra,sets,slot", [
    # the quickstart: engine.parallel 4 keeps the preset's unified pool: one session may
    # hold all 16,384 cells
    ((), [], 16384),
    # --no-kv-unified = engine.allocator: slots: 4 streams of 16,384 / 4 = 4,096 cells
    (("--no-kv-unified",), ["engine.allocator=slots"], 4096),
])
def test_parallel_gives_the_scenarios_allocator(capsys, extra, sets, slot):
    d = _fit_json(capsys, *extra)
    s = load_scenario("quickstart", sets)
    b = memory_budget(s.gpu, s.model, s.weights, s.engine,
                      driver_reserve_bytes=s.driver_reserve_bytes,
                      display_reserve_bytes=s.display_reserve_bytes)
    assert (d["allocator"], d["slot_tokens"]) == (b.allocator, b.slot_tokens)
    assert d["slot_tokens"] == slot and d["kv_pool_tokens"] == b.kv_pool_tokens == 16384
    # 16,384 cells x 131,072 B (f16, docs/reference/engines.md §0) = 2 GiB either way
    assert d["kv_reserved_bytes"] == b.kv_reserved_bytes == 16384 * 131072
    assert d["total_bytes"] == b.total_bytes


def test_fit_names_the_allocator_it_assumed():
    res = CliRunner().invoke(cli, ["fit", "--gpu", "rtx-4060-ti-16gb", "--model",
                                   "llama-3.1-8b", "--ctx-size", "16384", "--parallel", "4"])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert ("allocator: unified (-kvu) — one pool of 16,384 cells for 4 slots; one session "
            "may grow to 16,384, all together hold 16,384 (the preset's and a scenario's "
            "default; --no-kv-unified: -c split into per-slot streams, what llama-server "
            "does for an explicit -np without -kvu)") in flat
    res = CliRunner().invoke(cli, ["fit", "--gpu", "rtx-4060-ti-16gb", "--model",
                                   "llama-3.1-8b", "--ctx-size", "16384", "--parallel", "4",
                                   "--no-kv-unified"])
    flat = " ".join(res.output.split())
    assert ("allocator: slots (per-slot streams) — 4 streams of 4,096 cells, a hard limit "
            "per session (llama-server -np 4 without -kvu; in a scenario: "
            "engine.allocator: slots)") in flat


def test_vllm_parallel_is_max_num_seqs_and_the_pool_must_hold_it(capsys):
    # 24 GiB card (24080 MiB reported) at 0.806, vLLM's newest release: share
    # int(0.806 x 25,249,710,080) = 20,351,266,324; AWQ weights 5,727,324,704
    # (kvsim.model.weights: 32 layers x 113,311,825 + embedding and head bf16
    # 2 x 525,336,576 x 2 B); activation 2048 x 2 x (3 x 14,336 + 3 x 4,096) = 226,492,416;
    # pool 20,351,266,324 - 5,727,324,704 - 226,492,416 - non-torch 375,809,638 - CUDA graphs
    # 697,932,186 = 13,323,707,380 // 2,097,152 = 6,353 blocks = 101,648 tokens; // 65,536
    # = 1 held
    code, out, _ = run(capsys, "--gpu", "rtx-4090", "--model", "llama-3.1-8b", "--weights",
                       "awq", "--engine", "vllm", "--context", "65536", "--parallel", "4",
                       "--gpu-util", "0.806", "--json")
    d = json.loads(out)
    assert code == 0 and d["fits"] is True
    assert (d["max_num_seqs"], d["kv_pool_tokens"], d["full_length_held"]) == (4, 101_648, 1)
    assert d["max_parallel_at_85"] == 1 and d["gpu_memory_utilization_at_max_parallel"] == 0.806
    assert d["allocator_note"] == (
        "allocator: paged — one block pool of 101,648 tokens; vllm admits up to 4 sequences "
        "(--max-num-seqs 4) and the pool holds 1 at 65,536 tokens")
