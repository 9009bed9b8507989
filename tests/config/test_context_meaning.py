"""One meaning of context (issue 25): ``engine.context_tokens`` is what one session may
hold on every engine; llama.cpp's own ``-c`` is ``engine.ctx_size`` (all slots' cells).

Figures: Llama-3.1-8B f16 KV = 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131,072 B
per token (docs/reference/models.csv); llama-server pads -c and each slot's share to 256
(docs/reference/engines.md §3.1).
"""

from __future__ import annotations

import pytest

from kvsim.api import scenario_budget
from kvsim.engines.budget import engine_with
from kvsim.engines.resolve import resolve_engine
from kvsim.errors import InputError
from kvsim.plan.flags import configure, engine_flags
from kvsim.scenario import load_scenario, resolve_scenario

KV_PER_TOKEN = 131_072


def test_a_per_session_context_lays_out_as_its_ctx_size():
    # 8192 per session x 4 unified slots = -c 32768: one pool of 32,768 cells, 4 GiB of KV
    per_session = load_scenario("quickstart", ["engine.context_tokens=8192"])
    flag = load_scenario("quickstart", ["engine.ctx_size=32768"])
    assert (per_session.engine.context_tokens, per_session.engine.ctx_size) == (8192, 32768)
    assert per_session.engine == flag.engine
    a, b = scenario_budget(per_session), scenario_budget(flag)
    assert a == b
    assert (a.kv_pool_tokens, a.slot_tokens) == (32768, 32768)
    assert a.kv_reserved_bytes == 32768 * KV_PER_TOKEN == 4_294_967_296
    assert a.log_lines[0].startswith("llama_context: n_seq_max = 4, n_ctx = 32768, "
                                     "n_ctx_seq = 32768,")


def test_ctx_size_10000_over_3_slots_is_todays_minus_c_10000():
    # -c 10000 --parallel 3 without -kvu: each stream 10000 // 3 = 3333 -> padded 3584,
    # 3 x 3584 = 10,752 cells; each session is guaranteed 3333
    s = load_scenario("quickstart", ["engine.ctx_size=10000", "engine.parallel=3",
                                     "engine.allocator=slots"])
    assert (s.engine.context_tokens, s.engine.ctx_size) == (3333, 10000)
    b = scenario_budget(s)
    assert (b.kv_pool_tokens, b.slot_tokens) == (10752, 3584)
    assert b.kv_reserved_bytes == 10752 * KV_PER_TOKEN == 1_409_286_144
    assert engine_flags(s).startswith("llama-server -m llama-3.1-8b-q4_k_m.gguf -c 10000 "
                                      "--parallel 3 ")


def test_both_inconsistent_is_one_line_exit_2(tmp_path, kvsim_cli):
    p = tmp_path / "both.yaml"
    p.write_text("gpu: rtx-4060-ti-16gb\nmodel: llama-3.1-8b\nworkload: family-4\n"
                 "engine: {preset: llama.cpp, parallel: 4, context_tokens: 8192, "
                 "ctx_size: 16384}\n")
    rc, err, _ = kvsim_cli("simulate", p, "-o", tmp_path / "out")
    assert rc == 2
    assert err.strip() == (
        "error: engine.ctx_size: 16384 — context_tokens 8192 x parallel 4 = 32768 "
        "(ctx_size // parallel must equal context_tokens): give either context_tokens "
        "(per session) or ctx_size (llama-server -c, all slots), not both")


def test_a_set_of_one_replaces_the_scenario_files_other():
    # quickstart writes ctx_size: 16384 (4 slots); --set engine.context_tokens=8192 is the
    # user's per-session context and wins: -c 32768; the reverse, and parallel alone
    # keeps the file's -c (each slot's share shrinks or grows)
    s = load_scenario("quickstart").engine
    assert (s.ctx_size, s.context_tokens, s.parallel) == (16384, 4096, 4)
    up = load_scenario("quickstart", ["engine.context_tokens=8192"]).engine
    assert (up.ctx_size, up.context_tokens) == (32768, 8192)
    back = load_scenario("quickstart", ["engine.context_tokens=8192",
                                        "engine.ctx_size=20000"]).engine
    assert (back.ctx_size, back.context_tokens) == (20000, 5000)
    two = load_scenario("quickstart", ["engine.parallel=2"]).engine
    assert (two.ctx_size, two.context_tokens) == (16384, 8192)


def test_a_dumped_scenario_resolves_to_itself():
    for sets in ([], ["engine.ctx_size=null"], ["engine.ctx_size=10000", "engine.parallel=3",
                                                "engine.allocator=slots"],
                 ["engine=ollama"], ["engine=vllm", "engine.context_tokens=16384"]):
        s = load_scenario("quickstart", sets)
        assert resolve_scenario(s.model_dump(mode="json")) == s, sets
    # -c 0: the training context over 4 slots, --fit's to shrink
    fit = load_scenario("quickstart", ["engine.ctx_size=null"]).engine
    assert (fit.ctx_size, fit.context_tokens, fit.fit_context) == (131072, 32768, True)


def test_updates_keep_the_key_they_name():
    e = load_scenario("quickstart").engine  # -c 16384, 4 slots, 4096 each
    more = engine_with(e, parallel=8)
    assert (more.ctx_size, more.context_tokens) == (32768, 4096)
    wider = engine_with(e, ctx_size=20000)
    assert (wider.ctx_size, wider.context_tokens, wider.parallel) == (20000, 5000, 4)
    per = engine_with(e, context_tokens=2048)
    assert (per.ctx_size, per.context_tokens) == (8192, 2048)


def test_plan_points_give_the_same_minus_c_as_before():
    # a plan point (context c, parallel p) is -c c x p on llama.cpp
    base = load_scenario("quickstart")
    for ctx, par, kv, flags in ((8192, 4, None, "-c 32768 --parallel 4 -ctk f16"),
                                (4096, 3, "q8_0", "-c 12288 --parallel 3 -ctk q8_0"),
                                (16384, 2, None, "-c 32768 --parallel 2 -ctk f16")):
        s = configure(base, ctx, par, kv, None, 0.85)
        assert s.engine.context_tokens == ctx
        assert f"llama-q4_k_m.gguf {flags}" in engine_flags(s).replace(
            "llama-3.1-8b-q4_k_m", "llama-q4_k_m")


def test_ollama_has_no_ctx_size():
    with pytest.raises(InputError) as exc:
        resolve_engine({"preset": "ollama", "ctx_size": 8192})
    assert exc.value.one_line() == (
        "engine.ctx_size: 8192 — not a knob of the ollama preset: Ollama has no -c; "
        "context_tokens is num_ctx, per slot (the runner gets num_ctx x parallel); a "
        "llama.cpp scenario switched to Ollama: set the engine alone (engine=ollama) or "
        "engine.ctx_size=null and engine.context_tokens")


def test_fit_context_prints_minus_c_as_before(kvsim_cli):
    rc, _, out = kvsim_cli("fit", "--gpu", "rtx-4060-ti-16gb", "--model", "llama-3.1-8b",
                           "--engine", "llama.cpp", "--context", "32768", "--parallel", "4")
    assert rc == 0
    assert "context 32768 per session (-c 131072 = 32768 x 4 slots)" in " ".join(out.split())
    rc, _, out = kvsim_cli("fit", "--gpu", "rtx-4060-ti-16gb", "--model", "llama-3.1-8b",
                           "--engine", "llama.cpp", "--ctx-size", "10000", "--parallel", "3")
    assert rc == 0
    assert "context 3333 per session (-c 10000 over 3 slots)" in " ".join(out.split())


@pytest.mark.parametrize("sets,line", [
    (["engine.ctx_size=x"], "engine.ctx_size: 'x' — Input should be a valid integer"),
    (["engine.context_tokens=0"], "engine.context_tokens: 0 — Input should be greater than 0"),
    (["engine.allocator=slots", "engine.parallel=20000"],
     "engine.parallel: 20000 — exceeds ctx_size (16384); must be at most that")])
def test_a_bad_context_names_its_own_key(sets, line):
    # never "context_tokens: 'missing'" for a bad value of the other key
    with pytest.raises(InputError) as exc:
        load_scenario("quickstart", sets)
    assert exc.value.one_line().startswith(line)
