"""Plan axes → engine settings, and the exact command line a user should type.

The plan's axes are engine-neutral: **context** = tokens one session may hold,
**parallel** = sessions served at once, plus a KV cache dtype.  Each engine spells
them differently (``docs/reference/engines.md``):

- llama.cpp: ``-c`` is the whole KV pool over all slots (§3.1), so
  ``-c = context × parallel``; an explicit ``--parallel`` without ``-kvu`` means
  per-slot streams, so the unified allocator adds ``-kvu``; quantized V needs
  ``-fa on`` (§3.2); ``-m`` names ``<model>-<weights>.gguf``, or for the experts-only
  formats (``mxfp4``: experts MXFP4, rest BF16; ``mxfp4_moe``: rest Q8_0) a
  placeholder naming that layout;
- Ollama: ``OLLAMA_CONTEXT_LENGTH`` is per slot (the runner gets ``num_ctx ×
  parallel``, §4); ``OLLAMA_KV_CACHE_TYPE`` only applies with flash attention;
- vLLM / SGLang: ``--max-model-len`` / ``--context-length`` per request and
  ``--max-num-seqs`` / ``--max-running-requests`` = parallel; the memory fraction is
  lowered until the whole device total (driver, display and what the engine takes
  outside its share: vLLM's CUDA graphs, SGLang's activations) stays within the plan's
  device-fraction limit, since the share *is* the reservation.  The search then asks
  the pool to hold ``parallel`` full-length requests (:mod:`kvsim.plan.parallel`).
  The model argument is the checkpoint in the scenario's weight format: the catalogue
  repo for bf16/f16, that repo quantized at load (``--quantization fp8``) for fp8, and
  a placeholder naming the format for AWQ, GPTQ, GGUF and the rest — vLLM and SGLang
  read the quantization from the checkpoint's ``quantization_config`` (AWQ runs on the
  faster ``awq_marlin`` kernel; ``--quantization awq`` would force the slow one), so
  no flag is added, and :func:`flag_notes` says which checkpoint to use.  It is the
  repo itself where that is released in the format (gpt-oss: MXFP4,
  :func:`released_format`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from kvsim.config.engine import PagedEngineConfig, SlotEngineConfig
from kvsim.config.scenario import Scenario, resolve_scenario
from kvsim.errors import InputError
from kvsim.model.budget import share_within
from kvsim.model.weights import weight_format

_QUANT_V = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def check_contexts(contexts: Iterable[int], model: Any, field: str = "--contexts") -> None:
    """Refuse per-session contexts above the model's maximum, up front, on every engine:
    vLLM/SGLang refuse such a ``max_model_len`` (docs/reference/engines.md §1.1), Ollama clamps
    ``num_ctx`` to the training length (§4.1) and llama-server caps each slot at the
    training context — so such a point would be the model's maximum under a larger
    name (and on llama.cpp ``-c`` cells no session can use)."""
    most = model.max_context_tokens
    over = sorted({int(c) for c in contexts if int(c) > most})
    if over:
        raise InputError(field, over[0] if len(over) == 1 else over,
                         f"per-session contexts at most {model.name}'s maximum, {most} "
                         "tokens (vLLM/SGLang refuse a larger max_model_len, Ollama clamps "
                         "num_ctx to it, llama-server caps each slot at it)")


def engine_overrides(engine: Any, context: int, parallel: int, kv: str | None
                     ) -> dict[str, Any]:
    """Engine keys that realise one plan point on this engine."""
    if isinstance(engine, SlotEngineConfig):
        total = context * parallel if engine.preset == "llama.cpp" else context
        # NOTE: a context the plan sets is not --fit's to shrink
        out: dict[str, Any] = {"context_tokens": total, "parallel": parallel,
                               "fit_context": False}
        if kv is not None:
            out.update(cache_type_k=kv, cache_type_v=kv)
            if kv in _QUANT_V:
                out["flash_attn"] = True
        return out
    assert isinstance(engine, PagedEngineConfig)
    # NOTE: the memory fraction is configure's to lower (share_within), whole device
    out = {"context_tokens": context, "max_num_seqs": parallel}
    if kv is not None:
        out.update(cache_type_k=kv, cache_type_v=kv)
    return out


def configure(scenario: Scenario, context: int, parallel: int, kv: str | None,
              policies: tuple[dict[str, Any], ...] | None,
              max_device_fraction: float) -> Scenario:
    """The scenario with one plan point applied (validated like any scenario)."""
    doc = scenario.model_dump(mode="json")
    doc["engine"] = {**doc["engine"], **engine_overrides(
        scenario.engine, context, parallel, kv)}
    if policies is not None:
        doc["policies"] = [dict(p) for p in policies]
    out = resolve_scenario(doc)
    if isinstance(out.engine, PagedEngineConfig):
        util = share_within(out.gpu, out.model, out.weights, out.engine, max_device_fraction,
                            driver_reserve_bytes=out.driver_reserve_bytes,
                            display_reserve_bytes=out.display_reserve_bytes)
        if util is not None and util != out.engine.gpu_memory_utilization:
            # NOTE: lowered, in (0, 1): nothing to re-validate
            out = out.model_copy(update={"engine": out.engine.model_copy(
                update={"gpu_memory_utilization": util})})
    return out


LLAMA_CACHE_RAM_DEFAULT_BYTES = 8192 * 2**20  # docs/reference/engines.md §3.4: --cache-ram default
# 8192 MiB


def engine_flags(s: Scenario) -> str:
    """The command that starts the real engine with this scenario's settings."""
    e = s.engine
    if isinstance(e, SlotEngineConfig) and e.preset == "llama.cpp":
        parts = [f"llama-server -m {gguf_file(s)}", f"-c {e.context_tokens}",
                 f"--parallel {e.parallel}", f"-ctk {e.cache_type_k}", f"-ctv {e.cache_type_v}",
                 f"-fa {'on' if e.flash_attn else 'off'}"]
        if e.allocator == "unified":
            parts.append("-kvu")
        if e.cache_ram_bytes != LLAMA_CACHE_RAM_DEFAULT_BYTES:
            ram = -1 if e.cache_ram_bytes is None else -(-e.cache_ram_bytes // 2**20)
            parts.append(f"--cache-ram {ram}")
        if not e.cache_idle_slots:
            parts.append("--no-cache-idle-slots")
        return " ".join(parts)
    if isinstance(e, SlotEngineConfig):
        env = [f"OLLAMA_NUM_PARALLEL={e.parallel}", f"OLLAMA_CONTEXT_LENGTH={e.context_tokens}",
               f"OLLAMA_KV_CACHE_TYPE={e.cache_type_k}",
               f"OLLAMA_FLASH_ATTENTION={1 if e.flash_attn else 0}"]
        return " ".join(env) + " ollama serve"
    model, extra = checkpoint(s)
    dtype = "auto" if e.cache_type_k in ("f16", "bf16") else e.cache_type_k
    if e.preset == "sglang":
        cap = "" if e.max_total_tokens is None else f" --max-total-tokens {e.max_total_tokens}"
        return (f"python -m sglang.launch_server --model-path {model}{extra} "
                f"--context-length {e.context_tokens} --max-running-requests {e.max_num_seqs} "
                f"--mem-fraction-static {e.gpu_memory_utilization:g} --kv-cache-dtype {dtype}"
                + cap)
    pool = [f" --kv-cache-memory {e.kv_cache_memory_bytes}"
            if e.kv_cache_memory_bytes is not None else "",
            f" --num-gpu-blocks-override {e.num_gpu_blocks_override}"
            if e.num_gpu_blocks_override is not None else "",
            " --disable-hybrid-kv-cache-manager" if e.disable_hybrid_kv_cache_manager is True
            else ""]
    return (f"vllm serve {model}{extra} --max-model-len {e.context_tokens} "
            f"--max-num-seqs {e.max_num_seqs} "
            f"--gpu-memory-utilization {e.gpu_memory_utilization:g} --kv-cache-dtype {dtype}"
            + "".join(pool))


NATIVE_WEIGHTS = ("bf16", "f16")
# Hugging Face checkpoints whose config.json carries a quantization_config; every other
# format (q8_0, q4_k_m, mxfp4_moe, ...) is llama.cpp's: a GGUF file
HF_QUANT_WEIGHTS = ("awq", "gptq", "mxfp4")


def _is_gguf(w: str) -> bool:
    return w not in NATIVE_WEIGHTS + HF_QUANT_WEIGHTS + ("fp8",)


def _repo(s: Scenario) -> str:
    # NOTE: catalogue repos may note variants in parentheses: "org/Model(-Instruct)"
    return re.sub(r"\(.*?\)", "", s.model.hf_repo).strip() or s.model.name


# llama.cpp: experts-only formats (kvsim.model.weights) whose GGUF files share a name
# ("…-mxfp4.gguf") but not a layout — the placeholder says which tensors are which
_GGUF_LAYOUT = {"mxfp4": "experts MXFP4, rest BF16", "mxfp4_moe": "experts MXFP4, rest Q8_0"}
_RELEASED = re.compile(r"released weights are ([a-z0-9_]+)", re.IGNORECASE)


def released_format(model: Any) -> str | None:
    """The weight format the catalogue repo is published in, where the profile's notes
    say ("Released weights are MXFP4 …", docs/reference/models.csv gpt-oss); None when they do not.

    NOTE: ModelSpec has no released-format field; the notes are the profile's only
    record of it, read as kvsim.model.weights reads "tied embeddings"."""
    m = _RELEASED.search(model.notes or "")
    if m is None:
        return None
    try:
        return weight_format(m.group(1).lower()).name
    except Exception:  # noqa: BLE001 - a word that names no weight format
        return None


def gguf_file(s: Scenario) -> str:
    """llama.cpp ``-m``: ``<model>-<weights>.gguf``, or for an experts-only format a
    placeholder naming its layout, which the file name alone does not tell."""
    w = weight_format(s.weights).name
    if w in _GGUF_LAYOUT:
        return f"<{w.upper()} GGUF of {s.model.name}: {_GGUF_LAYOUT[w]}>"
    return f"{s.model.name}-{s.weights}.gguf"


def checkpoint(s: Scenario) -> tuple[str, str]:
    """vLLM / SGLang: (the model argument, flags that go with it) for the scenario's
    weight format (module docstring); the catalogue repo itself when it is published
    in that format (:func:`released_format`)."""
    w, repo = weight_format(s.weights).name, _repo(s)
    if w in NATIVE_WEIGHTS or w == released_format(s.model):
        return repo, ""
    if w == "fp8":
        return repo, " --quantization fp8"
    if _is_gguf(w):
        tok = f" --tokenizer {repo}" if s.engine.preset == "vllm" else ""
        return f"<{w.upper()} GGUF file of {repo}>", tok
    return f"<{w.upper()} checkpoint of {repo}>", ""


def flag_notes(s: Scenario) -> list[str]:
    """What the printed command cannot say by itself: which checkpoint to serve."""
    e = s.engine
    w, repo = weight_format(s.weights).name, _repo(s)
    if not isinstance(e, PagedEngineConfig):
        if e.preset != "llama.cpp" or w not in _GGUF_LAYOUT:
            return []
        return [(f"replace {gguf_file(s)} by the path of a GGUF of {s.model.name} in that "
                 "layout (a file name such as ...-mxfp4.gguf does not say which; "
                 "llama-quantize MXFP4_MOE gives experts MXFP4, rest Q8_0)")]
    if w in NATIVE_WEIGHTS:
        return []
    if w == released_format(s.model):
        return [(f"{repo} is published in {w.upper()} (the model's notes): {e.preset} "
                 "reads the quantization from its config.json quantization_config")]
    if w == "fp8":
        return [(f"{e.preset} quantizes {repo} to FP8 while loading (--quantization fp8); "
                 "an FP8 checkpoint of it is detected by itself (then drop the flag)")]
    if _is_gguf(w):
        tok = f", with the tokenizer of {repo} (vLLM's GGUF support is experimental)" \
            if e.preset == "vllm" else ""
        return [(f"replace <{w.upper()} GGUF file of {repo}> by the path of a single-file "
                 f"{w.upper()} GGUF of {repo}{tok}")]
    kernel = " (AWQ on the faster awq_marlin kernel; --quantization awq would force the " \
        "slower awq one)" if w == "awq" else ""
    return [(f"replace <{w.upper()} checkpoint of {repo}> by a checkpoint of {repo} in "
             f"{w.upper()} format (a local folder or a Hugging Face id; {repo} itself only "
             f"if it is published in {w.upper()}): {e.preset} reads the quantization from "
             f"its config.json quantization_config{kernel}, so no --quantization flag is "
             "needed")]


def point_parallel(s: Scenario) -> int:
    e = s.engine
    return e.parallel if isinstance(e, SlotEngineConfig) else e.max_num_seqs
