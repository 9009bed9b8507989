"""Catalogue slugs from the model names benchmarks, engines and file names print.

:func:`resolve_model` turns what published tables and tools print — "Llama 2 7B
(llama-2-7b.Q4_0.gguf)", "meta-llama/Llama-3.1-8B-Instruct", "qwen2.5-7b-instruct-
q4_k_m.gguf", Ollama tags ("llama3.1:8b"), llama-bench's ``model_type`` ("llama 7B Q4_0",
"gpt-oss 20B MXFP4 MoE") — into a model-profile slug and, when the text names one, a
kvsim weight format (:func:`kvsim.model.weights.weight_format_names`).

A caller must know:

- matching is by whole name tokens, never by string similarity: a catalogue name matches
  when its tokens appear contiguously in the text ("qwen2.5-14b" never matches
  "qwen2.5-1.5b"; "Qwen2.5-Coder-7B" is not "Qwen2.5-7B"); Instruct / chat / it / base /
  hf / qat variants share the base model's geometry slug, and so do fine-tunes whose name
  contains a catalogue name ("dolphin-qwen2:72b" → qwen2-72b);
- a llama-bench ``model_type`` names only llama.cpp's architecture and size class; several
  models print the same one ("llama 7B": Llama 1 and 2 7B, Mistral 7B), so ``n_params``
  (llama-bench ``model_n_params``) or ``size_bytes`` (``model_size``) picks among them, and
  without them the answer is ``slug=None`` with a reason starting "ambiguous: ";
- a text that names a model the catalogue lacks gives ``slug=None`` and a reason starting
  "unknown: " (never the nearest catalogue model).

NOTE: it lives in ``model``, not beside ``config.gpu_names``, because a file size
narrows the candidates through each model's weight bytes (:mod:`kvsim.model.weights`).
NOTE: pure and deterministic — the catalogue index is built once per process
(``functools.lru_cache``) from the shipped profiles; nothing is mutated afterwards.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from kvsim.config.catalog import has_profile, list_names, load_model, names_a_file
from kvsim.config.specs import ModelSpec
from kvsim.errors import InputError
from kvsim.model.weights import model_weights

__all__ = ["ModelMatch", "model_slug", "resolve_model"]

PARAM_TOLERANCE = 0.02
"""``n_params`` selects a catalogue model within 2 % of its ``params_total``."""
SIZE_TOLERANCE = 0.04
"""``size_bytes`` selects a model whose weights in the named format are within 4 %."""

# (kvsim format, pattern) in the order they are tried at one position; llama.cpp prints
# "Q4_K - Medium" for Q4_K_M and "MXFP4 MoE" for its MXFP4_MOE file type
_FORMATS = (
    ("mxfp4_moe", r"mxfp4[ _-]?moe"), ("mxfp4", r"mxfp4"),
    ("q4_k_m", r"q4_k(?:_m| - medium)"), ("q4_k_s", r"q4_k(?:_s| - small)"),
    ("q5_k_m", r"q5_k(?:_m| - medium)"), ("q6_k", r"q6_k"), ("q8_0", r"q8_0"),
    ("q4_0", r"q4_0"), ("iq4_xs", r"iq4_xs"), ("iq4_nl", r"iq4_nl"), ("nvfp4", r"nvfp4"),
    ("bf16", r"bf16|bfloat16"), ("f16", r"f16|fp16|float16"), ("fp8", r"fp8"),
    ("awq", r"awq"), ("gptq", r"gptq"),
)
_EDGE_L, _EDGE_R = r"(?<![a-z0-9])", r"(?![a-z0-9]|_[a-z0-9])"
FOUR_BIT_ONLY = frozenset({"awq", "gptq"})
"""Formats kvsim models as 4-bit weights only; the same name with an 8-bit qualifier
after it ("GPTQ-Int8", "AWQ-8bit") is a format kvsim does not model."""
_EIGHT_BIT = re.compile(r"[ _-]?(?:int8|8[ _-]?bit|w8a16)(?![a-z0-9])")
_OTHER_FORMAT = re.compile(_EDGE_L + r"(i?q\d_[a-z0-9]+(?:_[a-z0-9]+)?"
                           r"(?: - (?:small|medium|large))?|int[48])" + _EDGE_R)
_NOISE = frozenset({"instruct", "chat", "it", "hf", "base", "qat"})
_HF_CLASS = re.compile(r"\b\w+for(?:causallm|conditionalgeneration)\b")
_SIZE = r"\d+(?:\.\d+)?(?:x\d+(?:\.\d+)?)?[bm](?:\.a\d+(?:\.\d+)?b)?"
# llama.cpp general.architecture names a llama-bench model_type starts with
_GGUF_ARCHS = ("llama", "llama4", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "qwen3next",
               "gemma", "gemma2", "gemma3", "phi2", "phi3", "gpt-oss", "deepseek2",
               "jamba", "mamba", "mamba2", "command-r", "cohere2", "starcoder2", "falcon")
_MODEL_TYPE = re.compile(r"^\s*(?P<arch>" + "|".join(re.escape(a) for a in _GGUF_ARCHS)
                         + r")\s+(?P<size>" + _SIZE + r")(?![a-z0-9])", re.IGNORECASE)
# catalogue slug prefix -> llama.cpp architecture (convert_hf_to_gguf.py writes Mistral,
# Mixtral and the Llama distills as "llama", Qwen2.5 and the Qwen distills as "qwen2")
_ARCH_OF = (("deepseek-r1-distill-qwen", "qwen2"), ("deepseek-r1-distill-llama", "llama"),
            ("deepseek", "deepseek2"), ("llama-4", "llama4"), ("llama", "llama"),
            ("mistral", "llama"), ("mixtral", "llama"), ("qwen3-next", "qwen3next"),
            ("qwen3", "qwen3"), ("qwen2", "qwen2"), ("gemma-2", "gemma2"),
            ("gemma-3", "gemma3"), ("phi-", "phi3"), ("gpt-oss", "gpt-oss"),
            ("jamba", "jamba"), ("mamba-2", "mamba2"), ("command-r", "command-r"))
_PHI3_SIZE_BY_LAYERS = {24: "1b", 32: "3b", 40: "14b"}   # llama.cpp llm_type for phi3
_SIZE_OF = {"deepseek-v2-lite": "16b", "deepseek-v3": "671b",   # llama.cpp deepseek2 types
            "command-r-v01": "35b"}   # llama.cpp command-r: 40 layers 35B, else "?B"
# the Apple Silicon scoreboard (llama.cpp #4167) writes Llama 2 as "LLaMA 7B v2"
_LLAMA_V = re.compile(r"\bllama[ -]?(\d+(?:\.\d+)?b)[ -]?v(\d)\b", re.IGNORECASE)
# Ollama library tags whose name is not the model's: deepseek-r1:<size> is a DeepSeek-R1
# distill (ollama.com/library/deepseek-r1; the DeepSeek-R1 model card lists the six); the
# 8b tag is left out (its model changed with R1-0528) and the 671b one is R1 itself
_OLLAMA_TAGS = {"1.5b": "DeepSeek-R1-Distill-Qwen-1.5B", "7b": "DeepSeek-R1-Distill-Qwen-7B",
                "14b": "DeepSeek-R1-Distill-Qwen-14B", "32b": "DeepSeek-R1-Distill-Qwen-32B",
                "70b": "DeepSeek-R1-Distill-Llama-70B"}
_ANY_MINOR = re.compile(r"(\d+)\.x")  # "3.x": a version whose minor is left open
_OLLAMA_R1 = re.compile(r"^(?:library/)?deepseek-r1:(\d+(?:\.\d+)?b)\b(.*)$", re.IGNORECASE)
# Ollama's library tag "mistral" is Mistral 7B v0.3 ("updated to version 0.3", its page)
# (a tag naming its own version, "mistral:7b-instruct-v0.2-q4_0", is that version)
_OLLAMA_MISTRAL = re.compile(r"^(?:library/)?mistral(?::(?:latest|7b)\b(?!.*v0\.\d)(.*))?$",
                             re.IGNORECASE)


@dataclass(frozen=True)
class ModelMatch:
    """The catalogue model a printed name denotes, if any, and the format it names."""

    slug: str | None
    weight_format: str | None
    reason: str
    candidates: tuple[str, ...] = ()  # an ambiguous name's catalogue models, sorted


@dataclass(frozen=True)
class _Entry:
    slug: str
    names: tuple[tuple[str, ...], ...]   # token sequences: the slug and its repo names
    arch: str                            # llama.cpp architecture ('' unknown)
    size: str                            # llama.cpp size class, lower case ('' unknown)
    params: float


def _tokens(text: str) -> tuple[str, ...]:
    """Name tokens: lower case, split at separators and letter→digit ('qwen2.5' →
    'qwen', '2.5'), variant words (Instruct, chat, it …) dropped."""
    t = _HF_CLASS.sub(" ", text.lower().replace(".gguf", " "))
    t = re.sub(r"(?<=[a-z])(?=\d)", " ", t)
    parts = (p.strip(".") for p in re.split(r"[\s\-_/:,;()+|]+", t))
    return tuple(p for p in parts if p and p not in _NOISE)


def _repo_names(hf_repo: str) -> list[str]:
    """Model names in a catalogue ``hf_repo`` ("org/Model(-Instruct); org/Other")."""
    out = []
    for repo in hf_repo.split(";"):
        repo = re.sub(r"\(.*?\)", "", repo).strip().split(" ")[0]
        if repo:
            out.append(repo.rsplit("/", 1)[-1])
    return out


def _size_class(slug: str, model: ModelSpec, arch: str) -> str:
    m = re.search(r"(?<![a-z0-9.])(\d+x)?(\d+(?:\.\d+)?)b(?:-a(\d+(?:\.\d+)?)b)?(?![a-z0-9])",
                  slug)
    if m:
        return f"{m[1] or ''}{m[2]}b" + (f".a{m[3]}b" if m[3] else "")
    if arch == "phi3":
        return _PHI3_SIZE_BY_LAYERS.get(model.num_layers, "")
    return _SIZE_OF.get(slug, "")


@functools.lru_cache(maxsize=1)
def _catalogue() -> tuple[_Entry, ...]:
    entries = []
    for slug in list_names("models"):
        model = load_model(slug)
        arch = next((a for prefix, a in _ARCH_OF if slug.startswith(prefix)), "")
        if arch == "qwen3" and model.num_experts:
            arch = "qwen3moe"
        names = {_tokens(slug)} | {_tokens(n) for n in _repo_names(model.hf_repo)}
        entries.append(_Entry(slug, tuple(sorted(n for n in names if n)), arch,
                              _size_class(slug, model, arch), model.params_total))
    return tuple(entries)


def _weight_format(text: str) -> tuple[str | None, str]:
    """(kvsim format, note) for the first format the text names."""
    low, best = text.lower(), None
    for name, pattern in _FORMATS:
        m = re.search(_EDGE_L + "(?:" + pattern + ")" + _EDGE_R, low)
        if m and (best is None or m.start() < best[1]):
            best = (name, m.start(), m.end())
    other = _OTHER_FORMAT.search(low)
    if other and (best is None or other.start() < best[1]):
        return None, f"; the text names format {other[0].upper()!r}, which kvsim does not model"
    eight = best and best[0] in FOUR_BIT_ONLY and _EIGHT_BIT.match(low, best[2])
    if eight:  # kvsim's awq / gptq are 4-bit checkpoints: an 8-bit one is another format
        return None, (f"; the text names format {low[best[1]:eight.end()].upper()!r}, "
                      "which kvsim does not model")
    return (best[0], "") if best else (None, "")


def _strip_formats(text: str) -> str:
    low = text.lower()
    for _, pattern in _FORMATS:
        low = re.sub(_EDGE_L + "(?:" + pattern + ")" + _EDGE_R, " ", low)
    return _OTHER_FORMAT.sub(" ", low)


def _contains(text: tuple[str, ...], name: tuple[str, ...]) -> bool:
    """``name`` occurs contiguously in ``text``; a short name without a size token
    ('phi-4') only as the whole text, so 'phi-4-multimodal' is not 'phi-4'."""
    if text == name:
        return True
    if len(name) < 3 and not any(re.fullmatch(_SIZE, t) for t in name):
        return False
    n = len(name)
    return any(text[i:i + n] == name for i in range(len(text) - n + 1))


def _by_name(tokens: tuple[str, ...]) -> tuple[list[str], str]:
    """Catalogue slugs a name's tokens denote: the longest contained catalogue names, else
    the catalogue names the text is the start of; and how they were found."""
    best, found = 0, set[str]()
    for e in _catalogue():
        for name in e.names:
            if _contains(tokens, name) and len(name) >= best:
                found = found if len(name) == best else set()
                best = len(name)
                found.add(e.slug)
    if found:
        return sorted(found), "name"
    starts = {e.slug for e in _catalogue() for name in e.names
              if len(tokens) >= 2 and name[:len(tokens)] == tokens and len(name) > len(tokens)}
    return sorted(starts), "start of name"


def _weight_bytes(slug: str, fmt: str) -> int | None:
    """The checkpoint bytes of one model in one format (None: the format does not apply,
    e.g. an experts-only format on a dense model)."""
    try:
        return model_weights(load_model(slug), fmt).total_bytes
    except InputError:
        return None


def _narrow(slugs: list[str], fmt: str | None, n_params: int | None,
            size_bytes: int | None) -> tuple[list[str], str]:
    """Candidates left after the parameter count and the file size, and what was used."""
    used = ""
    if n_params and len(slugs) > 1:
        by = {e.slug: e.params for e in _catalogue()}
        near = [s for s in slugs if abs(by[s] - n_params) <= PARAM_TOLERANCE * n_params]
        slugs, used = (near, f" with {n_params / 1e9:.2f}e9 parameters") if near else (slugs, "")
    if size_bytes and fmt and len(slugs) > 1:
        near = [s for s in slugs if (total := _weight_bytes(s, fmt)) is not None
                and abs(total - size_bytes) <= SIZE_TOLERANCE * size_bytes]
        if near:
            slugs, used = near, used + f" at {size_bytes / 2**30:.2f} GiB of {fmt}"
    return slugs, used


def _wild_eq(text_token: str, name_token: str) -> bool:
    """A text token matches a name token; "3.x" (a version with its minor left open)
    matches "3" and every "3.M"."""
    if text_token == name_token:
        return True
    m = _ANY_MINOR.fullmatch(text_token)
    return bool(m) and (name_token == m[1] or name_token.startswith(m[1] + "."))


def _names_wild(text: tuple[str, ...], name: tuple[str, ...]) -> bool:
    """``name`` occurs contiguously in ``text``, "N.x" versions matching any minor."""
    n = len(name)
    return any(all(map(_wild_eq, text[i:i + n], name)) for i in range(len(text) - n + 1))


def _hinted(left: list[str], segments: list[str]) -> tuple[list[str], str]:
    """``left`` narrowed by another part of the text that names some of them ("llama 70B
    Q4_K_M (Llama 3.x 70B inferred)": the Llama 3 models), and what narrowed it."""
    names = {e.slug: e.names for e in _catalogue()}
    for segment in segments:
        tokens = _tokens(segment)
        hits = [s for s in left if any(_names_wild(tokens, n) for n in names[s])]
        if hits and len(hits) < len(left):
            return hits, f", narrowed by {segment.strip()!r}"
    return left, ""


def _by_model_type(arch: str, size: str) -> list[str]:
    return [e.slug for e in _catalogue() if e.arch == arch.lower() and e.size == size.lower()]


@functools.lru_cache(maxsize=1)
def _family_words() -> frozenset[str]:
    return frozenset(name[0] for e in _catalogue() for name in e.names)


def _segments(text: str) -> list[str]:
    """The text outside parentheses first, then each parenthesised part."""
    inner = re.findall(r"\(([^()]*)\)", text)
    return [re.sub(r"\([^()]*\)", " ", text)] + inner


def _decide(slugs: list[str], how: str, fmt: str | None, n_params: int | None,
            size_bytes: int | None) -> tuple[str | None, str, tuple[str, ...]]:
    """The one model left after :func:`_narrow`, or None, why, and the models left."""
    left, used = _narrow(slugs, fmt, n_params, size_bytes)
    if len(left) == 1:
        shared = " (models outside the catalogue may share it)" if how.startswith("llama") \
            else ""
        return left[0], f"{how}{used}{shared}", ()
    return None, f"ambiguous: {how}{used} fits {', '.join(left)}", tuple(sorted(left))


def resolve_model(text: str, *, n_params: int | None = None,
                  size_bytes: int | None = None) -> ModelMatch:
    """The catalogue model and weight format a printed model name denotes.

    ``n_params`` and ``size_bytes`` (llama-bench ``model_n_params`` / ``model_size``)
    choose among models that share a name or a llama.cpp ``model_type``.
    """
    shown = text or ""
    text = _LLAMA_V.sub(lambda m: f"llama-{m[2]}-{m[1]}", shown)
    if (r1 := _OLLAMA_R1.match(text.strip())) and r1[1].lower() in _OLLAMA_TAGS:
        text = _OLLAMA_TAGS[r1[1].lower()] + r1[2]
    elif mi := _OLLAMA_MISTRAL.match(text.strip()):
        text = "Mistral-7B-v0.3" + (mi[1] or "")
    fmt, fmt_note = _weight_format(text)
    hedge = "; the text hedges ('probably')" if "probably" in text.lower() else ""
    families = _family_words()
    segments = _segments(_strip_formats(text))
    for i, segment in enumerate(segments):
        mt = _MODEL_TYPE.match(segment)
        if mt:
            size = mt["size"].upper().replace("X", "x")
            how = f"llama.cpp model_type '{mt['arch']} {size}'"
            slugs = _by_model_type(mt["arch"], mt["size"])
            if not slugs:
                return ModelMatch(None, fmt, f"unknown: no catalogue model is {how}{fmt_note}")
            slugs, hint = _hinted(slugs, segments[i + 1:])
            slug, why, left = _decide(slugs, how + hint, fmt, n_params, size_bytes)
            return ModelMatch(slug, fmt, why + fmt_note + hedge, left)
        tokens = _tokens(segment)
        slugs, how = _by_name(tokens)
        if slugs:
            slug, why, left = _decide(slugs, f"{how} in {shown!r}", fmt, n_params,
                                      size_bytes)
            return ModelMatch(slug, fmt, why + fmt_note + hedge, left)
        if families & set(tokens):
            return ModelMatch(None, fmt, f"unknown: {shown!r} names no catalogue model"
                              f"{fmt_note}")
    return ModelMatch(None, fmt, f"unknown: no model name in {shown!r}{fmt_note}")


def model_slug(text: str, field: str) -> str:
    """What a user typed for a model (``--model``, a scenario's ``model``) as a profile
    name: a slug or a file path as given; a printed name (a Hugging Face repo id
    ``meta-llama/Llama-3.1-8B-Instruct``, an Ollama tag ``qwen2.5:14b``) as the catalogue
    model it names (module docstring).

    NOTE: the weight format a name may carry is not taken (``--weights`` / ``weights``
    say it); an ambiguous name is an InputError naming ``field``; an unknown one is
    returned as given, so the catalogue's own error (closest slugs, or what a file path
    should be) names it.
    """
    if has_profile("models", text) or names_a_file(text):
        return text
    m = resolve_model(text)
    if m.slug is not None:
        return m.slug
    if m.reason.startswith("ambiguous"):
        raise InputError(field, text, m.reason)
    return text
