"""The ``settings`` and ``printed_figures`` cells of an ``engine-memory-logs.csv`` row as
values: engine knobs by their engine's own names, printed figures as metrics.

:func:`read_settings` reads ``key=value`` items (``;``-separated), command-line flags
(``-c 32k``, ``--split-mode layer``) and ``word on|off`` (flash attention's ``auto``
as llama.cpp resolves it, :data:`kvsim.validate.records.FA_AUTO`); knobs are named as the engine
names them (vLLM / SGLang long names, llama.cpp's long flag names, Ollama's ``num_ctx`` /
``parallel``), short flags and aliases folded in (``-c`` = ``ctx_size``, ``tp`` =
``tensor_parallel_size``).  A value the row leaves at its default ("default",
"not in non-default args") is ``None``; an item that is no knob is kept as a remark.

:func:`read_figures` turns what the engine printed into :class:`Figure` values (metrics
in :data:`METRICS`): ``key=value`` items, lines as the engine prints them (the words
before the first number: "GPU KV cache size: 48,944 tokens", "model weights take
14.99GiB"), and the engines' own lines (kvsim.validate.memlog_lines: llama.cpp's
``llama_memory_breakdown_print`` table and buffer lines, one figure per device; SGLang's
pool line; Ollama's per-device layout; vLLM's maximum concurrency).

NOTE: units as printed, with one exception: vLLM and SGLang print GiB but write "GB"
(vLLM's worker: ``model_memory_usage / float(2**30)`` logged as "GB", the 14.9888 "GB" of
issue #10517 that docs/reference/engines.md §1.1 quotes as 14.99 GiB; SGLang divides by
``1 << 30``), so their "GB" is read as GiB.  Anyone else's GB (a user's nvidia-smi
reading, Ollama's ``ollama ps``) is 10^9 bytes.  llama.cpp's breakdown is in MiB.

NOTE: a knob or figure this reader knows whose value holds no number (or a count that is
not whole) is an InputError naming ``<row id>.<column>.<key>`` and the value; a byte
figure printed without a unit (an excerpt cut off) is listed in ``unread``, not guessed.
"""

from __future__ import annotations

import re

from kvsim.config.units import parse_bytes, parse_count
from kvsim.errors import InputError
from kvsim.validate.memlog_lines import DEVICE, QTY, Figure, engine_lines, printed_bytes
from kvsim.validate.records import FA_AUTO

METRICS = ("kv_tokens", "kv_bytes", "kv_needed_bytes", "max_model_len_fit", "weights_bytes",
           "compute_bytes", "device_bytes", "used_bytes", "ollama_required_full_bytes",
           "ollama_required_partial_bytes", "ollama_required_kv_bytes", "ollama_graph_full_bytes",
           "ollama_graph_partial_bytes", "ollama_projector_weights_bytes",
           "ollama_projector_graph_bytes", "ollama_layers_offload", "ollama_ps_size_bytes",
           "ollama_ps_vram_bytes", "ollama_ps_gpu_percent", "max_concurrency")
"""Every figure metric, in the order rows are listed (``startup`` comes last)."""

_ALIASES = {
    "tp": "tensor_parallel_size", "tp_size": "tensor_parallel_size",
    "pp": "pipeline_parallel_size", "pp_size": "pipeline_parallel_size",
    "dp": "data_parallel_size", "prefix_caching": "enable_prefix_caching",
    "chunked_prefill": "enable_chunked_prefill", "c": "ctx_size", "ctx": "ctx_size",
    "n_ctx_slot": "n_ctx_seq", "np": "parallel", "num_parallel": "parallel",
    "ollama_num_parallel": "parallel", "ctk": "cache_type_k", "ctv": "cache_type_v",
    "ngl": "n_gpu_layers", "gpu_layers": "n_gpu_layers", "sm": "split_mode",
    "b": "batch_size", "ub": "ubatch_size", "fa": "flash_attn",
    "ollama_flash_attention": "flash_attn", "kvu": "kv_unified",
    "ollama_kv_cache_type": "kv_cache_dtype", "kv_cache_type": "kv_cache_dtype",
    "ollama_context_length": "num_ctx",
}
COUNTS = frozenset({
    "max_model_len", "context_length", "max_num_batched_tokens", "chunked_prefill_size",
    "max_num_seqs", "max_running_requests", "max_total_tokens", "block_size", "page_size",
    "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "ctx_size",
    "context", "n_ctx_seq", "parallel", "n_gpu_layers", "batch_size", "ubatch_size",
    "num_ctx", "layers_requested", "num_gpu"})
FRACTIONS = frozenset({"gpu_memory_utilization", "mem_fraction_static"})
SWITCHES = frozenset({"enforce_eager", "enable_prefix_caching", "enable_chunked_prefill",
                      "flash_attn", "kv_unified", "fit", "language_model_only"})
NAMES = frozenset({"kv_cache_dtype", "cache_type_k", "cache_type_v", "split_mode",
                   "quantization", "dtype"})
KNOBS = COUNTS | FRACTIONS | SWITCHES | NAMES | {"kv_cache_memory"}
"""The knobs :func:`read_settings` reads as values; any other ``key=value`` is kept as text."""

ALL_LAYERS = 2**31 - 1
"""``-ngl all``: llama.cpp's 32-bit layer count, more than any model has (= every layer)."""

_ON = {"on", "true", "1", "yes", "enabled"}
_OFF = {"off", "false", "0", "no", "disabled"}
_UNSET = re.compile(r"\bdefault\b|not (?:shown|seen|set|in non-default)", re.IGNORECASE)
_COUNT = re.compile(r"(?<![\w.])(-?\d[\d,]*(?:\.\d+)?)\s*([kKmM]i?)?(?![\w])")


def _key(text: str) -> str:
    k = re.sub(r"[\s.\-]+", "_", text.strip().lstrip("-").lower()).strip("_")
    return _ALIASES.get(k, k)


_ITEM_FORMS = (  # key=value, a command-line flag (-c 32k, --split-mode layer), "word on|off"
    re.compile(r"^(--?[A-Za-z][\w.-]*|[A-Za-z][\w. -]*?)\s*=\s*(.*)$"),
    re.compile(r"^(--?[A-Za-z][\w-]*)(?:\s+(\S.*))?$"),
    re.compile(r"^([A-Za-z][\w ]*?)\s+(on|off)\b", re.IGNORECASE),
)


def _items(text: str) -> list[tuple[str, str | None, str]]:
    """(key as written, value or None for a bare flag, the item) of a settings cell."""
    out: list[tuple[str, str | None, str]] = []
    for item in (p.strip() for p in (text or "").split(";")):
        m = next((m for pat in _ITEM_FORMS if (m := pat.match(item))), None)
        if m is not None:
            out.append((m.group(1), m.group(2), item))
        elif item:
            out.append(("", None, item))
    return out


def _count(field: str, key: str, raw: str) -> int | None:
    if key == "n_gpu_layers" and raw.strip().lower() == "all":
        return ALL_LAYERS
    m = _COUNT.search(raw)
    if m is None:
        if _UNSET.search(raw):
            return None
        raise InputError(field, raw, "a count such as 20000 or '32k' (or 'default')")
    return parse_count(m.group(1).replace(",", "") + (m.group(2) or ""), field)


def _fraction(field: str, raw: str) -> float | None:
    m = _COUNT.search(raw)
    if m is None and _UNSET.search(raw):
        return None
    x = float(m.group(1).replace(",", "")) if m else float("nan")
    if not 0 < x <= 1:
        raise InputError(field, raw, "a memory fraction in (0, 1] such as 0.9 (or 'default')")
    return x


def _switch(field: str, raw: str | None) -> bool | None:
    word = (raw or "on").strip().split(" ")[0].lower()
    if word in _ON or word in _OFF:
        return word in _ON
    if _UNSET.search(raw or ""):
        return None
    raise InputError(field, raw, "on or off (true/false, 1/0)")


def knob_value(field: str, key: str, raw: str | None) -> object:
    """The value of knob ``key`` written ``raw`` (None: left at the engine's default)."""
    if key == "flash_attn" and (raw or "").strip().lower().startswith(("auto", "-1")):
        return FA_AUTO  # llama.cpp's -fa auto (kvsim.validate.records)
    if key in SWITCHES:
        return _switch(field, raw)
    text = raw or ""
    if key in COUNTS:
        return _count(field, key, text)
    if key in FRACTIONS:
        return _fraction(field, text)
    if key == "kv_cache_memory":
        m = QTY.search(text)
        return parse_bytes(f"{m.group(1).replace(',', '')} {m.group(2) or ''}".strip(),
                           field) if m else None
    word = re.sub(r"\(.*?\)", " ", text).split()
    return None if not word or _UNSET.search(text) else word[0].lower()


def read_settings(text: str, rid: str) -> tuple[dict[str, object], tuple[str, ...]]:
    """(knobs by the engine's own name, remarks: items that set no knob kvsim reads)."""
    knobs: dict[str, object] = {}
    remarks: list[str] = []
    for written, raw, item in _items(text):
        key = _key(written)
        if key not in KNOBS:
            remarks.append(item)
            continue
        knobs[key] = knob_value(f"{rid}.settings.{written.strip()}", key, raw)
    return knobs, tuple(remarks)


# printed key (a regex, whole key) -> metric; tokens/bytes by the value's unit
_FIGURE_KEYS = (
    ((r"gpu kv cache size|kv cache|maximum number of tokens that can be stored in kv cache"
      r"|max_total_num_tokens|kv pool sized for"), "kv_tokens"),
    ((r"kv_cache_size|available kv cache memory|available_kv_cache_memory"
      r"|rest reserved for kv cache|(?:the )?rest of the memory reserved for kv cache"
      r"|kv cache memory in use"), "kv_bytes"),
    (r"kv cache needed", "kv_needed_bytes"),
    (r"estimated maximum model length", "max_model_len_fit"),
    (r"loading model weights took|model weights take|weights|model loading took",
     "weights_bytes"),
    (r"pytorch activation peak memory|peak activation", "compute_bytes"),
    (r"(?:the current vllm instance can use )?total_gpu_memory", "device_bytes"),
    (r"vram usage|total vram usage|actual vram usage|nvidia-smi|nvidia-smi after load",
     "used_bytes"),
    (r"memory\.required\.full|total required memory(?: \(log\))?",
     "ollama_required_full_bytes"),
    (r"memory\.required\.partial", "ollama_required_partial_bytes"),
    (r"memory\.required\.kv", "ollama_required_kv_bytes"),
    (r"memory\.graph\.full", "ollama_graph_full_bytes"),
    (r"memory\.graph\.partial", "ollama_graph_partial_bytes"),
    (r"projector\.weights", "ollama_projector_weights_bytes"),
    (r"projector\.graph", "ollama_projector_graph_bytes"),
    (r"layers\.offload", "ollama_layers_offload"),
)
_TOKEN_METRICS = {"kv_tokens", "max_model_len_fit", "ollama_layers_offload"}


def _quantity(field: str, raw: str, gb_is_gib: bool) -> tuple[float, str]:
    """(number, unit as printed: '' none, 'tokens', or a byte unit) of a figure's value."""
    m = QTY.search(raw)
    if m is None:
        raise InputError(field, raw, "a number as the engine printed it, e.g. '3.81GiB' "
                         "or '31,232 tokens'")
    unit = (m.group(2) or "").strip()
    if unit.lower().startswith("token"):
        unit = "tokens"
    elif unit.upper() == "GB" and gb_is_gib:
        unit = "GiB"  # NOTE: module docstring
    return float(m.group(1).replace(",", "")), unit


def _figure(field: str, key: str, raw: str, gb_is_gib: bool,
            block: int) -> tuple[Figure | None, str]:
    """The figure of one ``key=value`` item (None, why: cannot be read as one)."""
    metric = next((met for pat, met in _FIGURE_KEYS if re.fullmatch(pat, key)), None)
    if key == "gpu blocks":
        n, _ = _quantity(field, raw, gb_is_gib)
        return Figure("kv_tokens", float(n * block),
                      as_printed=f"GPU blocks={raw} x {block}"), ""
    if metric is None:
        return None, ""
    n, unit = _quantity(field, raw, gb_is_gib)
    if metric == "kv_tokens" and unit not in ("", "tokens"):
        metric = "kv_bytes"  # "KV cache=2.30GiB": a size, not a token count
    if metric in _TOKEN_METRICS:
        return Figure(metric, n, as_printed=raw), ""
    if unit in ("", "tokens"):
        return None, f"{key}={raw}: no byte unit printed (cut off?)"
    number = QTY.search(raw).group(1).replace(",", "")  # type: ignore[union-attr]
    value, half = printed_bytes(number, unit, field)
    return Figure(metric, value, as_printed=raw, half_unit=half), ""


_LOG_KEY = re.compile(r"^(?:.*\]\s*|\S+\.py:\d+\]?\s*)?(?P<key>[A-Za-z_#][^=\d]*?)\s*[:=]?\s*"
                      r"(?P<raw>\d.*)$")
_VERB = re.compile(r"\s+(?:takes?|took|is|was)$", re.IGNORECASE)


def _printed_key(item: str) -> tuple[str, str]:
    """(key, value) of a figure printed without ``=`` ("Model loading took 14.99 GiB and
    5.2 seconds", "model weights take 14.99GiB", "the rest of the memory reserved for KV
    Cache is 4.87GiB"): the words before the first number, with a trailing verb where
    the key is no figure's with it; ("", "") when the item starts no such way."""
    m = _LOG_KEY.match(item)
    if m is None:
        return "", ""
    key = m.group("key").strip().rstrip(":(").strip()
    if not _is_figure_key(key):
        key = _VERB.sub("", key)
    return key, m.group("raw")


def _is_figure_key(key: str) -> bool:
    k = key.strip().lower()
    return k == "gpu blocks" or any(re.fullmatch(pat, k) for pat, _ in _FIGURE_KEYS)


def read_figures(text: str, rid: str, *, gb_is_gib: bool = False, block: int = 16,
                 ollama_layers: bool = False) -> tuple[tuple[Figure, ...], tuple[str, ...]]:
    """(figures, unread: printed figures kvsim could not take as numbers) of one cell.

    ``gb_is_gib``: the engine writes GB for GiB (vLLM, SGLang: module NOTE); ``block``: the
    paged engine's block size, for vLLM's older ``GPU blocks``; ``ollama_layers``: an
    "offloaded N/M layers" note is Ollama's placement (``ollama_layers_offload``)."""
    figures = engine_lines(text)
    if ollama_layers and (m := re.search(r"offloaded (\d+)/(\d+) layers", text)):
        figures.append(Figure("ollama_layers_offload", float(m.group(1)),
                              as_printed=m.group(0)))
    unread: list[str] = []
    seen = {(f.metric, f.device) for f in figures}
    for item in (p.strip() for p in re.split(r"[;\n]", text or "")):
        key, eq, raw = item.partition("=")
        if not eq or not _is_figure_key(key):  # a line as the engine prints it
            key, raw = _printed_key(item)     # ("GPU KV cache size: 48,944 tokens")
        if not key or DEVICE.match(key.strip()):
            continue
        got, why = _figure(f"{rid}.printed_figures.{key.strip()}", key.strip().lower(),
                           raw.strip(), gb_is_gib, block)
        if why:
            unread.append(why)
        if got is not None and (got.metric, got.device) not in seen:
            seen.add((got.metric, got.device))
            figures.append(got)
    order = {m: i for i, m in enumerate(METRICS)}
    return tuple(sorted(figures, key=lambda f: (order[f.metric], f.device))), tuple(unread)
