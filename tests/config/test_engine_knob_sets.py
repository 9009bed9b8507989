"""Each paged engine takes only its own knobs, and vLLM, SGLang and Ollama one KV cache
type for K and V (docs/reference/engines.md §1, §2, §4.1).

SGLang retracts and recomputes (§2.3); swap preemption and its swap space are vLLM V0's
(§1.4); ``--kv-cache-memory`` and ``--num-gpu-blocks-override`` are vLLM's (§1.1), the
hybrid KV cache manager too (§1.7); SGLang caps its pool with ``--max-total-tokens``
(§2.1), which vLLM does not have.
"""

from __future__ import annotations

import pytest

from kvsim.engines.resolve import resolve_engine
from kvsim.errors import InputError
from kvsim.scenario import load_scenario

NOT_SGLANG = "not a knob of the sglang preset: "
RETRACTS = ("SGLang retracts requests and recomputes them (docs/reference/engines.md §2.3); swap "
            "preemption is vLLM V0's (§1.4)")
CAPS = "caps it with --max-total-tokens (max_total_tokens, §2.1)"


def _sglang_error(*sets: str) -> str:
    # family-4-vllm: vllm, llama-3.1-8b bf16 on an RTX 4090, max_model_len 16384
    with pytest.raises(InputError) as exc:
        load_scenario("family-4-vllm", ["engine.preset=sglang", *sets])
    return exc.value.one_line()


@pytest.mark.parametrize("knob,value,line", [
    ("preemption_mode", "swap", f"engine.preemption_mode: 'swap' — {NOT_SGLANG}{RETRACTS}"),
    ("swap_space_bytes", "4GiB", (
        f"engine.swap_space_bytes: {4 * 2**30} — {NOT_SGLANG}vLLM V0's swap space "
        f"(docs/reference/engines.md "
        "§1.4); SGLang retracts and recomputes (§2.3), and keeps KV in host memory only with "
        "HiCache (a host_kv_cache policy, §2.4)")),
    ("kv_cache_memory_bytes", "2GiB", (
        f"engine.kv_cache_memory_bytes: {2 * 2**30} — {NOT_SGLANG}vLLM's --kv-cache-memory "
        "(docs/reference/engines.md §1.1); SGLang sizes its pool by mem_fraction_static "
        f"(gpu_memory_utilization) and {CAPS}")),
    ("num_gpu_blocks_override", "100", (
        f"engine.num_gpu_blocks_override: 100 — {NOT_SGLANG}vLLM's --num-gpu-blocks-override "
        "(docs/reference/engines.md §1.1); SGLang caps its pool with --max-total-tokens "
        "(max_total_tokens, "
        "§2.1)")),
    ("disable_hybrid_kv_cache_manager", "true", (
        f"engine.disable_hybrid_kv_cache_manager: True — {NOT_SGLANG}vLLM's hybrid KV cache "
        "manager (docs/reference/engines.md §1.7); SGLang has no such switch")),
    ("non_torch_bytes", "1GiB", (
        f"engine.non_torch_bytes: {2**30} — {NOT_SGLANG}vLLM's profiled non-torch memory "
        "inside its budget (docs/reference/engines.md §1.1); SGLang keeps what is not weights or "
        "KV outside "
        "mem_fraction_static (§2.1): activation_bytes, cuda_graph_bytes")),
])
def test_sglang_refuses_each_vllm_only_knob(knob, value, line):
    assert _sglang_error(f"engine.{knob}={value}") == line


def test_the_audit_command_exits_2_naming_the_first_vllm_knob(kvsim_cli, tmp_path):
    code, err, out = kvsim_cli(
        "simulate", "family-4-vllm", "--set", "engine.preset=sglang",
        "--set", "engine.preemption_mode=swap", "--set", "engine.swap_space_bytes=4GiB",
        "--set", "engine.kv_cache_memory_bytes=2.2GiB", "-o", tmp_path / "o")
    assert (code, err, out) == (
        2, f"error: engine.preemption_mode: 'swap' — {NOT_SGLANG}{RETRACTS}", "")


def test_sglang_keeps_the_values_that_leave_vllm_knobs_unused():
    # a resolved SGLang engine (its dump carries every field) re-validates, and setting a
    # vLLM knob to what SGLang does anyway is no error
    s = load_scenario("family-4-vllm", ["engine.preset=sglang",
                                        "engine.preemption_mode=recompute"])
    e = s.engine
    assert (e.preemption_mode, e.swap_space_bytes, e.kv_cache_memory_bytes,
            e.num_gpu_blocks_override, e.disable_hybrid_kv_cache_manager,
            e.non_torch_bytes, e.max_total_tokens) == ("recompute", 0, None, None, None, 0, None)
    assert type(e).model_validate(e.model_dump()) == e


def test_sglang_lists_only_its_own_knobs():
    line = _sglang_error("engine.swap_space=4GiB")
    knobs = line.split("its knobs: ")[1].split(", ")
    assert "max_total_tokens" in knobs and "block_tokens" in knobs
    assert not {"preemption_mode", "swap_space_bytes", "kv_cache_memory_bytes",
                "num_gpu_blocks_override", "disable_hybrid_kv_cache_manager",
                "non_torch_bytes"} & set(knobs)


def test_max_total_tokens_is_sglangs_and_not_vllms():
    assert resolve_engine({"preset": "sglang", "max_total_tokens": 20000}).max_total_tokens \
        == 20000
    with pytest.raises(InputError) as exc:
        resolve_engine({"preset": "vllm", "max_total_tokens": 20000})
    assert exc.value.one_line() == (
        "engine.max_total_tokens: 20000 — not a knob of the vllm preset: SGLang's "
        "--max-total-tokens (docs/reference/engines.md §2.1); vLLM has num_gpu_blocks_override "
        "(--num-gpu-blocks-override) and kv_cache_memory_bytes (--kv-cache-memory, §1.1)")
    with pytest.raises(InputError, match="engine.max_total_tokens: 0 — "):
        resolve_engine({"preset": "sglang", "max_total_tokens": 0})


def test_vllm_keeps_its_own_knobs():
    e = resolve_engine({"preset": "vllm", "preemption_mode": "swap",
                        "swap_space_bytes": 4 * 2**30, "kv_cache_memory_bytes": 2 * 2**30,
                        "num_gpu_blocks_override": 100, "non_torch_bytes": 2**30})
    assert (e.preemption_mode, e.swap_space_bytes, e.kv_cache_memory_bytes,
            e.num_gpu_blocks_override, e.non_torch_bytes) == (
        "swap", 4 * 2**30, 2 * 2**30, 100, 2**30)


def test_sglang_kv_cache_dtypes_are_its_own():
    # §2.1: --kv-cache-dtype auto, fp8_e4m3, fp8_e5m2 — "fp8" alone is vLLM's name (§1.5)
    assert resolve_engine({"preset": "sglang", "cache_type_k": "fp8_e4m3",
                           "cache_type_v": "fp8_e4m3"}).cache_type_v == "fp8_e4m3"
    with pytest.raises(InputError) as exc:
        resolve_engine({"preset": "sglang", "cache_type_k": "fp8", "cache_type_v": "fp8"})
    assert exc.value.one_line() == ("engine.cache_type_k: 'fp8' — not supported by sglang; "
                                    "allowed: f16, bf16, fp8_e4m3, fp8_e5m2")
    assert resolve_engine({"preset": "vllm", "cache_type_k": "fp8",
                           "cache_type_v": "fp8"}).cache_type_k == "fp8"


# ------------------------------------------------------------ one KV cache type for K and V

@pytest.mark.parametrize("preset,k,v,flag,ref", [
    ("vllm", "fp8", "f16", "--kv-cache-dtype", "§1.5"),
    ("sglang", "fp8_e5m2", "f16", "--kv-cache-dtype", "§2.1"),
    ("ollama", "q8_0", "f16", "OLLAMA_KV_CACHE_TYPE", "§4.1"),
])
def test_one_cache_type_engines_refuse_k_unlike_v(preset, k, v, flag, ref):
    with pytest.raises(InputError) as exc:
        resolve_engine({"preset": preset, "cache_type_k": k, "cache_type_v": v})
    assert exc.value.one_line() == (
        f"engine.cache_type_v: '{v}' — the same as cache_type_k ('{k}'): {preset} has one "
        f"{flag} for both K and V (docs/reference/engines.md {ref})")


def test_ollama_refuses_k_unlike_v_also_without_flash_attention():
    # without flash attention Ollama ignores its one type (§4.1); K != V is still no setting
    with pytest.raises(InputError, match="^engine.cache_type_v: 'f16' — the same as "):
        resolve_engine({"preset": "ollama", "flash_attn": False, "cache_type_k": "q8_0"})


def test_llama_cpp_keeps_separate_k_and_v_types():
    # §3.2: -ctk and -ctv may differ
    e = resolve_engine({"preset": "llama.cpp", "cache_type_k": "q8_0", "cache_type_v": "f16"})
    assert (e.cache_type_k, e.cache_type_v) == ("q8_0", "f16")


def test_the_audit_fit_exits_2(kvsim_cli):
    code, err, out = kvsim_cli("fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                               "--engine", "vllm", "--kv-k", "fp8", "--kv-v", "f16",
                               "--weights", "bf16", "--context", "8192")
    assert (code, out) == (2, "")
    # fit names the flags typed (the scenario path names engine.cache_type_v)
    assert err == ("error: --kv-v: 'f16' — the same as --kv-k (fp8): vllm has one "
                   "--kv-cache-dtype for K and V (use --kv)")
    code, err, out = kvsim_cli("fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                               "--engine", "vllm", "--kv", "fp8", "--weights", "bf16",
                               "--context", "8192", "--json")
    assert code == 0 and err == ""
