"""The ollama preset follows one Ollama release (engine.ollama_version, docs/reference/engines.md
§4).

Hand derivations use the catalogue's numbers: rtx-4090 24 GiB = 25,769,803,776 B,
rtx-3060-12gb 12 GiB = 12,884,901,888 B, rtx-6000-ada 48 GiB = 51,539,607,552 B; the
§4.1 VRAM tiers are 23 GiB = 24,696,061,952 B and 47 GiB = 50,465,865,728 B.
"""

import json

import pytest

from kvsim.cli import main
from kvsim.config.catalog import load_gpu, load_model
from kvsim.engines.budget import memory_budget
from kvsim.engines.ollama_releases import (
    OLLAMA_LATEST,
    ollama_arch,
    ollama_memory_mode,
    parse_ollama_version,
)
from kvsim.engines.resolve import engine_for_gpu, resolve_engine
from kvsim.errors import InputError
from kvsim.scenario import load_scenario

MIB, GIB = 2**20, 2**30
RTX4090, RTX3060 = load_gpu("rtx-4090"), load_gpu("rtx-3060-12gb")
QWEN3_8B, LLAMA_8B, QWEN25_32B = (load_model("qwen3-8b"), load_model("llama-3.1-8b"),
                                  load_model("qwen2.5-32b"))


def ollama(version: str | None = None, **knobs) -> dict:
    return {"preset": "ollama", **({"ollama_version": version} if version else {}), **knobs}


@pytest.mark.parametrize("text, parsed", [
    ("0.15.5", (0, 15, 5)), ("v0.12.4", (0, 12, 4)), ("0.6", (0, 6, 0)), (" 1.2.3 ", (1, 2, 3))])
def test_versions_parse_to_comparable_tuples(text, parsed):
    assert parse_ollama_version(text) == parsed
    assert parse_ollama_version("0.15.5") > parse_ollama_version("0.15.4")
    assert parse_ollama_version("0.9.7") < parse_ollama_version("0.12.0")  # not as strings


@pytest.mark.parametrize("bad", ["latest", "0.15.5-rc1", "1.2.3.4", "x.y", "", 0.3, 15])
def test_a_malformed_version_is_one_line_naming_the_field(bad):
    with pytest.raises(InputError) as exc:
        resolve_engine({"preset": "ollama", "ollama_version": bad})
    line = str(exc.value)
    assert line.startswith("engine.ollama_version: ") and "\n" not in line
    assert "MAJOR.MINOR[.PATCH]" in line and OLLAMA_LATEST in line


def test_a_malformed_version_from_the_command_line():
    # YAML reads an unquoted 0.30 as the number 0.3: refused, not taken as v0.3
    with pytest.raises(InputError, match=r"^engine.ollama_version: 0.3 — an Ollama release"):
        load_scenario("family-4-ollama", ["engine.ollama_version=0.30"])
    with pytest.raises(InputError, match="not a knob of the llama.cpp preset"):
        load_scenario("quickstart", ["engine.ollama_version=0.12.3"])


@pytest.mark.parametrize("newer", ["0.33.1", "0.34.0", "1.0"])
def test_a_release_newer_than_kvsim_describes_is_refused(newer, capsys):
    # not silently taken as the newest (0.33.0): kvsim does not know what it changed
    with pytest.raises(InputError) as exc:
        resolve_engine({"preset": "ollama", "ollama_version": newer})
    line = str(exc.value)
    assert line.startswith(f"engine.ollama_version: '{newer}' — an Ollama release kvsim "
                           "describes: up to 0.33.0 (") and "\n" not in line
    assert "llama-server from v0.30.0" in line
    assert resolve_engine({"preset": "ollama", "ollama_version": "0.33.0"}).ollama_version \
        == "0.33.0"
    with pytest.raises(SystemExit) as code:
        main(["fit", "--gpu", "rtx-4090", "--model", "qwen3-8b", "--engine", "ollama",
              "--ollama-version", newer])
    err = capsys.readouterr().err.strip().splitlines()
    assert code.value.code == 2 and len(err) == 1
    assert err[0].startswith(f"error: --ollama-version: '{newer}' — an Ollama release kvsim")


def test_the_preset_follows_the_newest_release_described():
    e = resolve_engine("ollama")
    assert e.ollama_version == OLLAMA_LATEST == "0.33.0"
    assert resolve_engine("llama.cpp").ollama_version is None


@pytest.mark.parametrize("version, gpu, ctx", [
    ("0.6.6", "rtx-4090", 2048),            # §4.1: 2048 up to v0.6.6
    ("0.6.7", "rtx-4090", 4096),            # 4096 from v0.6.7 ...
    ("0.15.4", "rtx-6000-ada", 4096),       # ... to v0.15.4, whatever the card
    ("0.15.5", "rtx-4060-ti-16gb", 4096),   # 16 GiB < 23 GiB
    ("0.15.5", "rx-7900-xt", 4096),         # 20 GiB < 23 GiB
    ("0.15.5", "rtx-4090", 32_768),         # 23 GiB <= 24 GiB < 47 GiB
    ("0.15.5", "rtx-5090", 32_768),         # 32 GiB
    ("0.15.5", "rtx-6000-ada", 131_072),    # 48 GiB >= 47 GiB: 262144, clamped to 131,072
    ("0.15.5", "apple-m4-max", 131_072),    # the GPU's default share, 96,207,267,430 B
])
def test_unset_num_ctx_by_release_and_vram(version, gpu, ctx):
    e = engine_for_gpu(ollama(version), load_gpu(gpu), LLAMA_8B, weights="q4_k_m")
    assert e.context_tokens == ctx


def test_tiered_num_ctx_counts_ollama_gpu_overhead_and_the_models_maximum():
    # total VRAM (what CUDA reports: 24,080 MiB for a 4090) minus OLLAMA_GPU_OVERHEAD:
    # 24,080 - 528 MiB = 23 GiB, exactly the tier's floor
    assert engine_for_gpu(ollama(gpu_overhead_bytes="528 MiB"), RTX4090,
                          LLAMA_8B).context_tokens == 32_768
    assert engine_for_gpu(ollama(gpu_overhead_bytes="529 MiB"), RTX4090,
                          LLAMA_8B).context_tokens == 4096
    # 48 GiB: 262144 for a model that long (qwen3-next: 262,144), not clamped
    assert engine_for_gpu(ollama(), load_gpu("rtx-6000-ada"),
                          load_model("qwen3-next-80b-a3b")).context_tokens == 262_144
    # an explicit num_ctx is kept; no GPU known counts as none found (0 bytes: 4096)
    assert engine_for_gpu(ollama(context_tokens=8192), RTX4090, LLAMA_8B).context_tokens == 8192
    assert resolve_engine("ollama").context_tokens == 4096


def test_parallel_does_not_divide_the_tiered_num_ctx():
    # ollama #14116: 4 slots of the 24 GiB tier's 32768 = 131,072 cells of KV; llama-3.1-8b
    # f16 2 x 32 x 8 x 128 x 2 = 131,072 B/token -> 17,179,869,184 B
    e = engine_for_gpu(ollama(parallel=4), RTX4090, LLAMA_8B)
    b = memory_budget(RTX4090, LLAMA_8B, "q4_k_m", e)
    assert (e.context_tokens, b.slot_tokens, b.kv_pool_tokens) == (32_768, 32_768, 131_072)
    assert b.kv_reserved_bytes + b.kv_cpu_bytes == 131_072 * 131_072 == 17_179_869_184


@pytest.mark.parametrize("model, since", [
    ("qwen3-8b", "0.12.4"), ("qwen3-30b-a3b", "0.12.4"), ("gpt-oss-20b", "0.12.4"),
    ("gemma-3-12b", "0.12.7"), ("llama-3.1-8b", "0.30.0"), ("qwen2.5-7b", "0.30.0")])
def test_flash_attention_default_by_architecture_and_release(model, since):
    # §4.1: off; on for the listed architectures from their release; §4.4 + §3.2: from
    # v0.30 --flash-attn auto, on for every model
    m = load_model(model)
    major, minor, patch = parse_ollama_version(since)
    before = f"{major}.{minor}.{patch - 1}" if patch else f"{major}.{minor - 1}.99"
    assert not engine_for_gpu(ollama(before), RTX4090, m).flash_attn
    assert engine_for_gpu(ollama(since), RTX4090, m).flash_attn
    assert engine_for_gpu(ollama(), RTX4090, m).flash_attn
    assert not engine_for_gpu(ollama(flash_attn=False), RTX4090, m).flash_attn  # set: kept


def test_architectures_from_the_catalogue():
    names = {"qwen3-8b": "qwen3", "qwen3-30b-a3b": "qwen3moe", "qwen3-next-80b-a3b":
             "qwen3next", "gemma-3-27b": "gemma3", "gemma-2-9b": "gemma2",
             "gpt-oss-120b": "gptoss", "llama-4-scout-17b-16e": "llama4",
             "deepseek-v2-lite": "deepseek2", "llama-3.1-8b": "llama", "qwen2.5-32b": "qwen2",
             "deepseek-v3": "deepseek2", "qwen1.5-7b": "qwen2", "qwen2.5-vl-7b": "qwen25vl",
             "deepseek-r1-distill-qwen-7b": "qwen2",  # the distills are qwen2 / llama GGUFs
             "mistral-7b-v0.3": "llama", "mixtral-8x7b": "llama", "command-r-v01": "command-r",
             "voxtral-tts-4b": "", "phi-4-14b": "", "qwen3.6-27b": ""}
    assert {n: ollama_arch(load_model(n)) for n in names} == names


def test_the_audit_fit_on_the_newest_release():
    # qwen3-8b, num_ctx 32768 x 4 slots, OLLAMA_KV_CACHE_TYPE=q8_0: flash attention is on
    # (era D: --flash-attn auto), so q8_0 applies: 36 layers x 8 KV heads x (128 + 128) x
    # 34/32 B = 78,336 B/token; 131,072 cells = 10,267,656,192 B; llama-server --fit keeps
    # every layer on the 24 GiB card
    e = engine_for_gpu(ollama(context_tokens=32768, parallel=4, cache_type_k="q8_0",
                              cache_type_v="q8_0"), RTX4090, QWEN3_8B)
    assert (e.flash_attn, e.cache_type_v, e.ignored_cache_type) == (True, "q8_0", None)
    b = memory_budget(RTX4090, QWEN3_8B, "q4_k_m", e)
    assert (b.kv_bytes_per_token, b.kv_reserved_bytes) == (78_336, 10_267_656_192)
    assert (b.gpu_layers, b.kv_cpu_bytes, b.fits, b.estimate) == (36, 0, True, None)
    assert b.total_bytes <= 0.85 * RTX4090.memory_bytes
    # era D is llama-server -c num_ctx x parallel -np parallel (per-slot streams, §4.4)
    ls = resolve_engine({"preset": "llama.cpp", "allocator": "slots", "ctx_size":
                         131_072, "parallel": 4, "n_batch": 512, "cache_type_k": "q8_0",
                         "cache_type_v": "q8_0"})
    same = memory_budget(RTX4090, QWEN3_8B, "q4_k_m", ls)
    assert (b.total_bytes, b.gpu_layers, b.slot_tokens) == (
        same.total_bytes, same.gpu_layers, same.slot_tokens)


def test_the_audit_fit_on_an_old_release_ignores_q8_0():
    # v0.12.3: flash attention off for qwen3, so the cache is silently f16 (§4.1): 36 x 8 x
    # 256 x 2 = 147,456 B/token.  Eras B/C place qwen3 by measured sizes; era A (v0.11.4)
    # by the estimator (§4.2): KV 131,072 x 147,456 = 19,327,352,832 (536,870,912/layer),
    # graph (32/8) x KV / 6 = 12,884,901,888, reserve 457 MiB + graph = 13,364,101,120;
    # a q4_k_m layer (kvsim.model.gguf_mix): (8.19e9 - 2 x 151,936 x 4,096) / 36
    # = 192,926,119.1 params: Q, K, O 4096 x (32 + 8 + 32) x 128 = 37,748,736 at Q4_K
    # 4.5 bpw = 21,233,664 B; V 4,194,304 and ffn_down Q6_K 6.5625 in 18 of 36 layers
    # (use_more_bits), Q4_K in the rest = 5.53125 bpw: V 2,899,968 B; FFN 150,983,079.1
    # = 2/3 gate/up at 4.5 + 1/3 down at 5.53125 = 4.84375 bpw: 91,415,536.2 B
    # -> 115,549,168 B; with the layer llm/memory.go charges "as a buffer", layer k+1 goes
    # on while the 4090's reported 24,080 MiB (25,249,710,080) > reserve + (k + 2) x
    # (115,549,168 + 536,870,912 = 652,420,080): 17 layers (reserve + 18 layers =
    # 25,107,662,560; 18 would be 25,760,082,640)
    spec = ollama("0.11.4", context_tokens=32768, parallel=4, cache_type_k="q8_0",
                  cache_type_v="q8_0")
    e = engine_for_gpu(spec, RTX4090, QWEN3_8B)
    assert (e.flash_attn, e.cache_type_v, e.ignored_cache_type) == (False, "f16", "q8_0")
    b = memory_budget(RTX4090, QWEN3_8B, "q4_k_m", e)
    assert (b.estimate.graph_bytes, b.estimate.reserve_bytes) == (12 * GIB, 13_364_101_120)
    assert b.gpu_layers == 17 and b.weights_gpu_bytes == 17 * 115_549_168
    assert b.estimate.total_bytes == 13_364_101_120 + 18 * 652_420_080 == 25_107_662_560
    assert any("q8_0 ignored" in n for n in b.notes)


def test_memory_mode_by_era():
    # §4 table: A <= v0.11.4 estimator; B v0.11.5-v0.12.10 measured on the Go engine's
    # architectures only; C v0.12.11-v0.29.x measured; D v0.30+ llama-server --fit
    modes = {v: (ollama_memory_mode(resolve_engine(ollama(v)), QWEN3_8B),
                 ollama_memory_mode(resolve_engine(ollama(v)), LLAMA_8B))
             for v in ("0.11.4", "0.11.5", "0.12.10", "0.12.11", "0.29.9", "0.30.0")}
    assert modes == {"0.11.4": ("estimate", "estimate"), "0.11.5": ("measured", "estimate"),
                     "0.12.10": ("measured", "estimate"), "0.12.11": ("measured", "measured"),
                     "0.29.9": ("measured", "measured"),
                     "0.30.0": ("llama-server", "llama-server")}


def _q32(version: str, **reserves):
    e = resolve_engine(ollama(version, context_tokens=8192, flash_attn=True,
                              cache_type_k="q8_0", cache_type_v="q8_0"))
    return memory_budget(RTX3060, QWEN25_32B, "q4_k_m", e, **reserves)


def test_measured_layouts_place_by_true_sizes():
    # qwen2.5-32b q4_k_m (a layer 290,705,879 B; tests/model/test_budget.py), num_ctx 8192,
    # q8_0 with flash attention, a 12 GB card (CUDA reports 12 GiB less 2 %: 12,627,203,850).
    # Era A (§4.2) counts q8_0 as 1 B: KV/layer 8192 x 256 x 8 = 16,777,216; qwen2's partial
    # graph is its vocabulary term, 960,581,632 at any context up to ~11k
    # (tests/model/test_budget.py) -> 35 layers (and the one charged as a buffer), not
    # fully loaded: the partial graph charged.
    # Era C (§4.3): true q8_0 KV/layer 8192 x 2,176 = 17,825,792 and the real compute
    # buffer: reserve 457 MiB + compute 361,758,720 = 840,957,952, then as many layers as
    # fit (the output layer first; all do not, so again without it):
    # (12,627,203,850 - 840,957,952) / (290,705,879 + 17,825,792 = 308,531,671) = 38.2 -> 38
    a, c = _q32("0.11.4"), _q32("0.12.11")
    assert (a.gpu_layers, a.estimate.graph_bytes) == (35, 960_581_632)
    reserve = 457 * MIB + c.activation_bytes
    per_layer = 290_705_879 + 17_825_792
    assert c.estimate.reserve_bytes == reserve and c.estimate.graph_bytes == c.activation_bytes
    assert c.gpu_layers == (RTX3060.usable_memory_bytes - reserve) // per_layer == 38
    assert c.kv_reserved_bytes == 38 * 17_825_792
    assert c.estimate.kv_bytes == 64 * 17_825_792  # memory.required.kv: the whole model
    assert not any("under-counts" in n for n in c.notes)
    assert any("under-counts" in n for n in a.notes)


def test_measured_layouts_back_off_where_the_estimator_runs_out_of_memory():
    # a 1400 MiB driver reserve: era A's 35 layers need 1,468,006,400 + 35 x (290,705,879 +
    # 17,825,792) + the compute buffer 361,758,720 = 12,628,373,605 > the card's
    # 12,627,203,850 -> cudaMalloc fails; era C backs off (§4.3): 38 layers fail, 10 % of
    # free VRAM set aside: floor((12,627,203,850 x 0.9 - reserve) / 308,531,671) = 34
    # layers, which fit (1,468,006,400 + 34 x 308,531,671 + 361,758,720 = 12,319,841,934)
    driver = 1400 * MIB
    a, c = _q32("0.11.4", driver_reserve_bytes=driver), \
        _q32("0.12.11", driver_reserve_bytes=driver)
    assert c.activation_bytes == 361_758_720
    assert a.gpu_layers == 35 and not a.fits and "cudaMalloc failed" in a.failure
    reserve, per_layer = 457 * MIB + c.activation_bytes, 290_705_879 + 17_825_792
    cap = RTX3060.usable_memory_bytes
    assert c.gpu_layers == (cap * 9 // 10 - reserve) // per_layer == 34 and c.fits
    assert c.total_bytes == driver + 34 * per_layer + c.activation_bytes


def test_era_d_slots_are_llama_servers():
    # §4.4: Ollama passes no slot or cache flags, so llama-server's own (§3.4): similarity
    # 0.10, --cache-ram 8192 MiB, idle slots saved; the Go runners (§4.5) had none
    new, old = resolve_engine("ollama"), resolve_engine(ollama("0.29.9"))
    assert (new.slot_prompt_similarity, new.cache_ram_bytes, new.cache_idle_slots) == (
        0.10, 8192 * MIB, True)
    assert (old.slot_prompt_similarity, old.cache_ram_bytes, old.cache_idle_slots) == (
        None, 0, False)
    assert (new.context_shift, new.n_keep, new.max_queue) == (True, 4, 512)  # unchanged
    kept = resolve_engine(ollama(slot_prompt_similarity=0.5, cache_ram_bytes=0))
    assert (kept.slot_prompt_similarity, kept.cache_ram_bytes) == (0.5, 0)


@pytest.mark.parametrize("version, model, weights, gpu, parallel", [
    ("0.1.48", "llama-3.1-8b", "q4_k_m", "rtx-4090", 1),   # opt-in: 1
    # auto (v0.1.49-v0.9.6): 4 (2 from v0.6.7) if it fits whole by the §4.2 estimate:
    # llama-3.1-8b at 4 x 2048 = 2 x 4096 = 8192 cells: KV 8192 x 256 x 8 x 2 x 32 =
    # 1,073,741,824, graph 4 x KV / 6 = 715,827,882, + 457 MiB + all weights 4,911,836,096
    # (32 x 130,793,566 + embedding 295,501,824 + head 430,940,160: tests/model/test_budget.py)
    # = 7,180,605,034 B < 24 GiB
    ("0.6.6", "llama-3.1-8b", "q4_k_m", "rtx-4090", 4),
    ("0.6.7", "llama-3.1-8b", "q4_k_m", "rtx-4090", 2),
    # qwen2.5-32b's weights alone (64 x 290,705,879 + embedding 437,944,320 + head
    # 638,668,800 = 19,681,789,376) exceed 12 GiB
    ("0.6.7", "qwen2.5-32b", "q4_k_m", "rtx-3060-12gb", 1),
    ("0.9.7", "llama-3.1-8b", "q4_k_m", "rtx-4090", 1),    # default 1, no auto
    # gemma-3-12b at 4 x 2048 on 12 GB places its 48 layers but not the output layer (and
    # vision tower): PredictServerFit wants BlockCount + 1 layers, so 1 slot
    ("0.6.1", "gemma-3-12b", "q4_k_m", "rtx-3060-12gb", 1),
])
def test_parallel_default_by_release(version, model, weights, gpu, parallel):
    e = engine_for_gpu(ollama(version), load_gpu(gpu), load_model(model), weights=weights)
    assert e.parallel == parallel


def test_automatic_parallel_needs_the_weights_or_a_number():
    with pytest.raises(InputError, match=r"^engine.parallel: 'unset' — a number: Ollama 0.6.7"):
        engine_for_gpu(ollama("0.6.7"), RTX4090, LLAMA_8B)
    assert engine_for_gpu(ollama("0.6.7", parallel=3), RTX4090, LLAMA_8B).parallel == 3
    assert resolve_engine(ollama("0.6.7")).parallel == 1  # no GPU known: none found


def test_old_behaviour_is_one_version_away():
    # before this knob the preset was v0.9.7-v0.12.3: num_ctx 4096, 1 slot, flash attention
    # off, Go-runner slots, the era-A estimator
    for model in (QWEN3_8B, LLAMA_8B):
        e = engine_for_gpu(ollama("0.11.4"), RTX4090, model)
        assert (e.context_tokens, e.parallel, e.flash_attn, e.slot_prompt_similarity,
                e.cache_ram_bytes) == (4096, 1, False, None, 0)
        assert ollama_memory_mode(e, model) == "estimate"


def test_the_bundled_ollama_scenario_sets_its_own_num_ctx():
    # workloads/scenarios/family-4-ollama.yaml: num_ctx 8192, 4 slots, flash attention on:
    # no release changes those; the newest release changes the slots (llama-server's)
    new = load_scenario("family-4-ollama").engine
    old = load_scenario("family-4-ollama", ["engine.ollama_version=0.12.3"]).engine
    assert (new.context_tokens, new.parallel, new.flash_attn) == (8192, 4, True)
    assert (old.context_tokens, old.parallel, old.flash_attn) == (8192, 4, True)
    assert (new.ollama_version, old.ollama_version) == ("0.33.0", "0.12.3")
    assert (new.slot_prompt_similarity, old.slot_prompt_similarity) == (0.10, None)


def test_kvsim_fit_follows_the_newest_releases_defaults(capsys):
    # the audit's command, and the same without --context: the 24 GiB tier's 32768
    for ctx in (["--context", "32768"], []):
        with pytest.raises(SystemExit) as exc:
            main(["fit", "--gpu", "rtx-4090", "--model", "qwen3-8b", "--engine", "ollama",
                  *ctx, "--parallel", "4", "--kv", "q8_0", "--json"])
        d = json.loads(capsys.readouterr().out)
        assert exc.value.code == 0
        assert (d["cache_type_v"], d["gpu_layers"], d["slot_tokens"], d["kv_pool_tokens"],
                d["kv_reserved_bytes"], d["fits"]) == (
            "q8_0", 36, 32_768, 131_072, 10_267_656_192, True)
        assert not any("ignored" in n for n in d["notes"])
