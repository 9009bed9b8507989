"""Engine presets resolve to docs/reference/engines.md defaults; overrides are validated."""

import pytest

from kvsim.engines.config import pool_tokens_hint, slot_tokens
from kvsim.engines.resolve import resolve_engine
from kvsim.errors import InputError


def test_preset_defaults_from_reference():
    ll = resolve_engine("llama.cpp")
    assert (ll.allocator, ll.parallel, ll.context_shift, ll.cache_ram_bytes, ll.n_batch,
            ll.n_ubatch) == ("unified", 4, False, 8192 * 2**20, 2048, 512)
    ol = resolve_engine("ollama")
    assert (ol.allocator, ol.parallel, ol.context_tokens, ol.context_shift, ol.n_keep,
            ol.minimum_reserve_bytes) == ("slots", 1, 4096, True, 4, 457 * 2**20)
    vl = resolve_engine("vllm")  # the newest release: 0.92 with CUDA graphs in the share
    assert (vl.version, vl.block_tokens, vl.gpu_memory_utilization, vl.max_num_batched_tokens,
            vl.max_num_seqs, vl.cuda_graphs_in_budget) == ("0.24.0", 16, 0.92, 2048, 256, True)
    v1 = resolve_engine({"preset": "vllm", "version": "0.10.1"})
    assert (v1.gpu_memory_utilization, v1.cuda_graphs_in_budget) == (0.9, False)
    sg = resolve_engine("sglang")
    assert sg.block_tokens == 1


def test_overrides_and_slot_tokens():
    # llama.cpp -c 4096 over 4 per-slot streams: 1024 cells each, 1024 per session
    e = resolve_engine({"preset": "llama.cpp", "allocator": "slots", "ctx_size": 4096,
                        "parallel": 4})
    assert slot_tokens(e) == 1024 and pool_tokens_hint(e) == 4096 and e.context_tokens == 1024
    o = resolve_engine({"preset": "ollama", "context_tokens": 8192, "parallel": 2})
    assert slot_tokens(o) == 8192 and pool_tokens_hint(o) == 16384


@pytest.mark.parametrize("spec,match", [
    ({"preset": "llama.cpp", "cache_type_v": "q8_0", "flash_attn": False}, "flash"),
    ({"preset": "llama.cpp", "block_tokens": 16}, "not a knob of the llama.cpp preset"),
    ({"preset": "vllm", "cache_type_k": "q4_0"}, "not supported"),
    ({"preset": "llama.cpp", "allocator": "slots", "ctx_size": 2, "parallel": 4},
     "exceeds ctx_size"),
    ({"preset": "nope"}, "unknown; one of: llama.cpp, ollama, sglang, vllm")])
def test_bad_engine_configs(spec, match):
    with pytest.raises(InputError, match=match):
        resolve_engine(spec)


def test_a_null_knob_keeps_the_presets_value():
    # ollama's preset sets num_ctx 4096 (docs/reference/engines.md §4.1); without a model, vLLM's
    # preset has 32768 where it cannot know the model's maximum
    assert resolve_engine({"preset": "ollama", "context_tokens": None}).context_tokens == 4096
    assert resolve_engine({"preset": "vllm", "context_tokens": None}).context_tokens == 32768
    with pytest.raises(InputError, match="engine.parallel: None — not a knob of the vllm"):
        resolve_engine({"preset": "vllm", "parallel": None})


def test_set_null_leaves_a_scenario_knob_unset():
    from kvsim.scenario import load_scenario

    # llama.cpp with no -c: the training context (llama-3.1-8b: 131072) that --fit
    # shrinks toward what fits; the same as leaving the key out of the YAML
    unset = load_scenario("quickstart", ["engine.context_tokens=null"]).engine
    left_out = load_scenario("quickstart", ["engine={preset: llama.cpp, parallel: 4}"]).engine
    assert unset == left_out and unset.fit_context
    assert unset.context_tokens not in (4096, 16384)
    vllm = load_scenario("quickstart", ["engine={preset: vllm, context_tokens: null}"]).engine
    assert vllm.context_tokens == 131072  # the model's maximum (§1.1)
    with pytest.raises(InputError, match="engine.parallel: None — not a knob of the vllm"):
        load_scenario("quickstart", ["engine={preset: vllm, parallel: null}"])


def test_switching_presets_by_key_says_to_set_the_engine_alone():
    # quickstart's engine is {preset: llama.cpp, ctx_size: 16384, parallel: 4}:
    # changing only the preset keeps llama.cpp's -c and parallel, which vLLM does not have
    from kvsim.scenario import load_scenario

    with pytest.raises(InputError) as exc:
        load_scenario("quickstart", ["engine.preset=vllm"])
    assert exc.value.field == "engine.ctx_size"
    assert exc.value.allowed.endswith(
        "(ctx_size belongs to the other engines: to switch presets, set the engine alone, "
        "e.g. engine=vllm)")
    with pytest.raises(InputError) as exc:  # a knob no engine has: no such hint
        load_scenario("quickstart", ["engine.bogus=1"])
    assert "belongs" not in exc.value.allowed
