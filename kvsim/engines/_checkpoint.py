"""What the launch commands name as the model: a GGUF file or a checkpoint, by weight format.

llama.cpp's ``-m`` names ``<model>-<weights>.gguf``, or for the experts-only formats
(``mxfp4``: experts MXFP4, rest BF16; ``mxfp4_moe``: rest Q8_0) a placeholder naming that
layout.  vLLM's and SGLang's model argument is the checkpoint in the scenario's weight
format: the catalogue repo for bf16/f16, that repo quantized at load (``--quantization
fp8``) for fp8, and a placeholder naming the format for AWQ, GPTQ, GGUF and the rest —
vLLM and SGLang read the quantization from the checkpoint's ``quantization_config`` (AWQ
runs on the faster ``awq_marlin`` kernel; ``--quantization awq`` would force the slow one),
so no flag is added, and :func:`paged_notes` says which checkpoint to use.  It is the repo
itself where that is released in the format (gpt-oss: MXFP4, :func:`released_format`).
"""

from __future__ import annotations

import re
from typing import Any

from kvsim.model.weights import weight_format

NATIVE_WEIGHTS = ("bf16", "f16")
# Hugging Face checkpoints whose config.json carries a quantization_config; every other
# format (q8_0, q4_k_m, mxfp4_moe, ...) is llama.cpp's: a GGUF file
HF_QUANT_WEIGHTS = ("awq", "gptq", "mxfp4")


def _is_gguf(w: str) -> bool:
    return w not in NATIVE_WEIGHTS + HF_QUANT_WEIGHTS + ("fp8",)


def _repo(s: Any) -> str:
    # NOTE: catalogue repos may note variants in parentheses ("org/Model(-Instruct)") and
    # list other checkpoints of the same geometry after ";": the first is the model's own
    first = s.model.hf_repo.split(";")[0]
    return re.sub(r"\(.*?\)", "", first).strip() or s.model.name


# llama.cpp: experts-only formats (kvsim.model.weights) whose GGUF files share a name
# ("…-mxfp4.gguf") but not a layout — the placeholder says which tensors are which
GGUF_LAYOUT = {"mxfp4": "experts MXFP4, rest BF16", "mxfp4_moe": "experts MXFP4, rest Q8_0"}
_RELEASED = re.compile(r"released weights are ([a-z0-9_]+)", re.IGNORECASE)


def released_format(model: Any) -> str | None:
    """The weight format the catalogue repo is published in, where the profile's notes
    say ("Released weights are MXFP4 …", docs/reference/models.csv gpt-oss); None when
    they do not.

    NOTE: ModelSpec has no released-format field; the notes are the profile's only
    record of it, read as kvsim.model.weights reads "tied embeddings"."""
    m = _RELEASED.search(model.notes or "")
    if m is None:
        return None
    try:
        return weight_format(m.group(1).lower()).name
    except Exception:  # noqa: BLE001 - a word that names no weight format
        return None


def gguf_file(s: Any) -> str:
    """llama.cpp ``-m``: ``<model>-<weights>.gguf``, or for an experts-only format a
    placeholder naming its layout, which the file name alone does not tell."""
    w = weight_format(s.weights).name
    if w in GGUF_LAYOUT:
        return f"<{w.upper()} GGUF of {s.model.name}: {GGUF_LAYOUT[w]}>"
    return f"{s.model.name}-{s.weights}.gguf"


def checkpoint(s: Any, gguf_tokenizer: bool) -> tuple[str, str]:
    """vLLM / SGLang: (the model argument, flags that go with it) for the scenario's
    weight format (module docstring); the catalogue repo itself when it is published
    in that format (:func:`released_format`).  ``gguf_tokenizer``: a GGUF file is served
    with the repo's tokenizer (``--tokenizer``, vLLM)."""
    w, repo = weight_format(s.weights).name, _repo(s)
    if w in NATIVE_WEIGHTS or w == released_format(s.model):
        return repo, ""
    if w == "fp8":
        return repo, " --quantization fp8"
    if _is_gguf(w):
        return f"<{w.upper()} GGUF file of {repo}>", f" --tokenizer {repo}" if gguf_tokenizer \
            else ""
    return f"<{w.upper()} checkpoint of {repo}>", ""


def paged_notes(s: Any, gguf_tokenizer: bool) -> list[str]:
    """vLLM / SGLang: what the printed command cannot say by itself, which checkpoint to
    serve (``gguf_tokenizer`` as in :func:`checkpoint`)."""
    e = s.engine
    w, repo = weight_format(s.weights).name, _repo(s)
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
            if gguf_tokenizer else ""
        return [(f"replace <{w.upper()} GGUF file of {repo}> by the path of a single-file "
                 f"{w.upper()} GGUF of {repo}{tok}")]
    kernel = " (AWQ on the faster awq_marlin kernel; --quantization awq would force the " \
        "slower awq one)" if w == "awq" else ""
    return [(f"replace <{w.upper()} checkpoint of {repo}> by a checkpoint of {repo} in "
             f"{w.upper()} format (a local folder or a Hugging Face id; {repo} itself only "
             f"if it is published in {w.upper()}): {e.preset} reads the quantization from "
             f"its config.json quantization_config{kernel}, so no --quantization flag is "
             "needed")]


def kv_dtype_flag(cache_type: str) -> str:
    """vLLM / SGLang ``--kv-cache-dtype``: ``auto`` for the model's own 16-bit type."""
    return "auto" if cache_type in ("f16", "bf16") else cache_type
