"""Start-up memory logs (``engine-memory-logs.csv``) as values kvsim's load-time memory
model can be compared with.

:func:`read_memory_rows` turns each row into a :class:`MemoryMeasurement`: the engine
(one of kvsim's presets, and whether the build is stock), the devices and model resolved
against the catalogue (:mod:`kvsim.config.gpu_names`, :mod:`kvsim.model.names`) or the
reason they are not, the weights format, the engine knobs of ``settings`` and the printed
figures (:mod:`kvsim.validate.memlog_text`, whose docstring says how units are read), and
the start-up outcome the notes state.  :mod:`kvsim.validate.memlog_predict` predicts it.

Metrics (what the engine printed → what kvsim's :class:`~kvsim.engines.memory.MemoryBudget`
says):

- ``kv_tokens``: vLLM "GPU KV cache size" / "maximum number of tokens that can be stored
  in KV cache" / "GPU blocks" × block size, SGLang ``max_total_num_tokens`` / ``#tokens``
  → ``kv_pool_tokens``;
- ``kv_bytes``: vLLM ``kv_cache_size`` / "Available KV cache memory", SGLang K + V size,
  llama.cpp's breakdown ``context`` or ``<dev> KV buffer size`` lines (else the cache's
  ``size =``), Ollama's ``kv cache device=…`` → ``kv_reserved_bytes``;
  ``kv_needed_bytes``: vLLM "KV cache needed" (one max_model_len request);
  ``max_model_len_fit``: vLLM "estimated maximum model length";
- ``weights_bytes``, ``compute_bytes`` (vLLM's peak activation, llama.cpp's model and
  compute buffers, Ollama's ``model weights`` / ``compute graph device=…``), ``device_bytes``
  (vLLM ``total_gpu_memory``, llama.cpp ``total``), ``used_bytes`` (device memory in use
  after loading, as a user read it) → ``weights_gpu_bytes``, ``activation_bytes``,
  ``device_bytes``, ``total_bytes``;
- ``ollama_required_full_bytes`` / ``_partial_bytes`` / ``_kv_bytes``,
  ``ollama_graph_full_bytes`` / ``_partial_bytes``, ``ollama_layers_offload`` → Ollama's
  estimate (``MemoryBudget.estimate``);
- ``ollama_ps_size_bytes`` / ``_vram_bytes`` / ``_gpu_percent``: ``ollama ps`` (its table
  or ``/api/ps`` JSON, read by :mod:`kvsim.validate.ollama_ps`) → the layout's ``ollama
  ps`` row (kvsim.engines._ollama_ps);
- ``max_concurrency``: vLLM "Maximum concurrency for L tokens per request: X x" →
  ``max_concurrency`` (L is the max_model_len where the settings give none);
- ``startup``: "Startup OK" / "Startup FAILED" in the notes (or ``status=OK``) →
  ``MemoryBudget.fits``.

NOTE: a row is never dropped: what cannot be resolved is kept as a reason
(``gpu_reason``, ``model_reason``, ``weights_reason``) and the prediction turns it into a
:class:`~kvsim.validate.records.Skipped`; names given on the command line (``--gpu``,
``--model``) replace unresolved ones there.
NOTE: an unstated weights format "ollama default quant" is Q4_K_M (the Ollama library's
default tag for its models), "unquantized 16-bit" is bf16 (vLLM's ``dtype auto`` on the
bf16 checkpoints these rows serve; f16 has the same bytes).
NOTE: a GPU name that fits several profiles ("NVIDIA A100") keeps them as
``gpu_candidates``, narrowed to the memory size the ``vram_total`` cell states (printed
or inferred: :func:`gpu_candidates`); the prediction uses them only when every one lays
the start-up out alike (kvsim.validate.memlog_predict).
NOTE: Ollama's ``memory.available`` (the free memory its estimate placed layers in, in the
vram_total or printed cell) is what kvsim's Ollama sees free on the first GPU: the rest of
the card is in use by others (``free_bytes``; kvsim.validate.memlog_predict).
NOTE: what a row states of its run beyond the settings column is read too: a box "(model
on CUDA0 only)" is that one card (:func:`gpus_named`); notes saying flash attention failed
("quantized KV needs FA which failed with --split-mode layer") mean the run had none
(``flash_attn`` off unless the settings set it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvsim.config.catalog import list_names, load_gpu
from kvsim.config.gpu_names import resolve_gpu
from kvsim.config.units import parse_bytes
from kvsim.engines import engine_for, registered_engines
from kvsim.engines.resolve import resolve_engine
from kvsim.errors import InputError, closest_names
from kvsim.model.names import resolve_model
from kvsim.validate.memlog_text import Figure, read_figures, read_settings

_NOT_SHOWN = re.compile(r"^\s*(?:not (?:shown|seen|stated|printed)|n/?a\b|unknown\b)",
                        re.IGNORECASE)
_NOT_STOCK = re.compile(r"fork|branch|omni|patch|lm studio", re.IGNORECASE)
_CONTEXT_UNSHOWN = re.compile(r"\bcontext (?:was )?not (?:seen|shown|stated)\b", re.IGNORECASE)


@dataclass(frozen=True)
class MemoryMeasurement:
    """One engine start-up as a user posted it (module docstring)."""

    id: str
    engine: str                     # a kvsim engine preset, "" when it is none of them
    engine_as_printed: str
    stock: bool                     # False: a fork, a PR branch, a patched stack, LM Studio
    engine_version: str
    gpu_as_printed: str
    gpus: tuple[str, ...]           # one catalogue slug per device; () when not resolved
    gpu_reason: str                 # why ``gpus`` is empty ("" when resolved)
    gpu_count: int                  # devices the GPU text names, resolved or not (0: none)
    model_as_printed: str
    model: str | None               # catalogue slug
    model_reason: str
    weights: str | None             # kvsim weight format (kvsim.model.weights)
    weights_reason: str
    figures: tuple[Figure, ...]
    startup: str | None = None      # "ok" / "failed" as the notes say; None: not stated
    remarks: tuple[str, ...] = ()   # settings that set no knob kvsim reads
    unread: tuple[str, ...] = ()    # printed figures that could not be taken as numbers
    source: str = ""
    notes: str = ""
    date: str = ""                  # the row's date as written (ISO, perhaps only YYYY-MM)
    stated: tuple[str, ...] = ()    # settings read from the notes (module NOTE)
    gpu_candidates: tuple[str, ...] = ()  # profiles an ambiguous name fits (module NOTE)
    gpu_memory_said: str = ""       # how the vram_total cell narrowed them ("": it did not)
    free_bytes: tuple[int, ...] = ()  # Ollama's memory.available, one per GPU (module NOTE)
    settings: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def context_unshown(self) -> bool:
        """The row says its context was not seen and sets no context knob."""
        knobs = ("ctx_size", "context", "num_ctx", "max_model_len", "context_length",
                 "n_ctx_seq")
        return any(_CONTEXT_UNSHOWN.search(r) for r in self.remarks) and \
            not any(self.settings.get(k) for k in knobs)

    @property
    def backend(self) -> str:
        """The summary's grouping: the engine, set apart when its build is not stock."""
        return self.engine if self.stock else f"{self.engine or self.engine_as_printed} " \
            "(fork/patched)"


def engine_name(text: str) -> str:
    """kvsim's preset for an engine as the CSV names it: the one the cell starts with
    ("llama.cpp (llama-server)", "sglang-omni (SGLang-based)"), else one it names as a
    word ("custom loadgen vs vllm serve"); "" when it is none of kvsim's engines."""
    low = (text or "").strip().lower()
    return next((e for e in registered_engines() if low.startswith(e)), "") or next(
        (e for e in registered_engines()
         if re.search(rf"(?<![\w.-]){re.escape(e)}(?![\w-])", low)), "")


def _figures(text: str, rid: str, engine: str, settings: dict[str, object]
             ) -> tuple[tuple[Figure, ...], tuple[str, ...]]:
    """The printed figures as the engine prints them: a paged engine (vLLM, SGLang) writes
    GB for GiB and counts blocks of its preset's size (or the row's ``block_size``); an
    engine following Ollama's releases prints its placement as "offloaded N/M layers"."""
    traits = engine_for(engine) if engine else None
    paged = traits is not None and not traits.slot_family
    block = settings.get("block_size") or settings.get("page_size") or \
        (resolve_engine(engine).block_tokens if paged else 1)  # type: ignore[union-attr]
    return read_figures(text, rid, gb_is_gib=paged, block=int(str(block)),
                        ollama_layers=traits is not None and "ollama_version" in traits.settings)


_ONE_DEVICE = re.compile(r"\bmodel on (?:CUDA|ROCm|Vulkan|SYCL)\d+ only\b", re.IGNORECASE)


def gpus_named(text: str) -> tuple[tuple[str, ...], str, int]:
    """(one slug per device, "", count) or ((), why, count): "2x NVIDIA GeForce RTX 3090"
    → two rtx-3090, "NVIDIA GeForce RTX 4070 Ti, NVIDIA GeForce RTX 3090 Ti" → those two
    in that order; ``count``: the devices the text names, even when unresolved.  A box
    whose text says the engine used one of its cards ("4x GTX 1080 (model on CUDA0
    only)") is that one card: the others held nothing of the model."""
    if _NOT_SHOWN.match(text or ""):
        return (), "GPU not named in the log", 0
    g = resolve_gpu(text)
    if g.slug is not None:
        n = 1 if _ONE_DEVICE.search(text or "") else max(1, g.count)
        return (g.slug,) * n, "", n
    if g.count == 0 or "no device model named" in g.reason:
        return (), f"GPU not named ({text!r} names no device model)", g.count
    if g.reason.startswith("several kinds of device"):  # a mixed box: each card by itself
        parts = [resolve_gpu(p) for p in re.split(r"\s*[,+]\s*", text) if p.strip()]
        if all(p.slug for p in parts):
            slugs = tuple(s for p in parts for s in (p.slug,) * max(1, p.count))
            return slugs, "", len(slugs)  # type: ignore[return-value]
    return (), g.reason, g.count


_VRAM = re.compile(r"(\d+(?:\.\d+)?)\s*(GiB|GB)\b", re.IGNORECASE)
_DRIVER_SHARE = 0.9
"""A device's memory as stated may sit below its profile's size by this share: a driver
reports a total a few per cent under the nominal size (an 80 GB card's
``total_gpu_memory`` 79.2 GiB), and "80GB" read as decimal gigabytes is 74.5 GiB."""


_AVAILABLE = re.compile(r'memory\.available\s*=\s*"?\[([^\]]*)\]', re.IGNORECASE)
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B)\b", re.IGNORECASE)


def available_bytes(*cells: str) -> tuple[int, ...]:
    """Ollama's ``memory.available=[23.6 GiB 11.8 GiB]`` in the first cell printing it:
    the free memory of each GPU its estimate placed layers in (() where none prints it)."""
    for cell in cells:
        if m := _AVAILABLE.search(cell or ""):
            return tuple(parse_bytes(f"{n} {u}", "memory.available")
                         for n, u in _SIZE.findall(m.group(1)))
    return ()


_GUESS = re.compile(r"\b(?:inferred|likely)\b", re.IGNORECASE)


def _inferred_names(text: str) -> list[str]:
    """Device names a cell gives in parentheses as its writer's inference: "1x 80GB-class
    GPU (total_gpu_memory 79.22GiB; H100/A100 inferred)" → ["H100", "A100"]."""
    out: list[str] = []
    for group in re.findall(r"\(([^()]*)\)", text or ""):
        for part in re.split(r"[;,]", group):
            if _GUESS.search(part):
                out += [n.strip() for n in _GUESS.sub(" ", part).split("/") if n.strip()]
    return out


def _fitting(name: str) -> tuple[str, ...]:
    g = resolve_gpu(name)
    return (g.slug,) if g.slug is not None else g.candidates


_VENDORS = (("NVIDIA", r"nvidia|geforce|quadro|tesla"), ("AMD", r"amd|radeon|instinct"),
            ("Intel", r"intel"), ("Apple", r"apple"))


def _vendor_sized(text: str, vram: str) -> tuple[tuple[str, ...], str]:
    """Every profile of the vendor a cell names with no device model, where it or the
    ``vram`` cell states a memory size ("1x AMD GPU, 24 GiB (model not seen)"; "1x NVIDIA
    GPU" beside Ollama's memory.available=[11.1 GiB]), and how they were found; () else."""
    vendor = next((v for v, word in _VENDORS
                   if re.search(rf"\b(?:{word})\b", text or "", re.IGNORECASE)), None)
    stated = _VRAM.search(text or "")
    if vendor is None or not (stated or _VRAM.search(vram or "")):
        return (), ""
    said = stated.group(0) if stated else ""
    return tuple(s for s in list_names("gpus") if load_gpu(s).vendor == vendor), \
        f"{vendor} cards" + (f" of the gpu cell's {said}" if said else "")


def _of_size(fit: tuple[str, ...], stated: re.Match[str]) -> tuple[str, ...]:
    """The profiles whose memory a size as stated may be (:data:`_DRIVER_SHARE`)."""
    gib = float(stated.group(1)) * (1.0 if stated.group(2).lower() == "gib" else 1e9 / 2**30)
    return tuple(s for s in fit
                 if _DRIVER_SHARE <= gib / (load_gpu(s).memory_bytes / 2**30) <= 1 + 1e-9)


def gpu_candidates(text: str, vram: str) -> tuple[tuple[str, ...], str]:
    """(the profiles an ambiguous device name fits — or, where the cell names no device,
    those its parenthesised inference names, else every card of the vendor it names
    with the memory size it states — narrowed to the memory size the ``vram`` cell
    states; how they were found, "" for a plain ambiguous name): () when the name
    resolves, is unknown, or names several kinds of device."""
    g = resolve_gpu(text)
    fit, how = g.candidates, []
    if not fit and g.slug is None and (names := _inferred_names(text)):
        fit = tuple(dict.fromkeys(s for n in names for s in _fitting(n)))
        how.append(f"{'/'.join(names)} as the gpu cell infers")
    elif not fit and g.slug is None and (sized := _vendor_sized(text, vram))[0]:
        stated = _VRAM.search(text)
        fit = _of_size(sized[0], stated) if stated else sized[0]
        how.append(sized[1])
    m = _VRAM.search(vram or "")
    if fit and m:
        fit = _of_size(fit, m)
        guess = " (which says it is inferred)" if re.search(r"infer|assum", vram, re.IGNORECASE) else ""
        how.append(f"{m.group(0)} from the vram_total cell{guess}")
    return fit, ", ".join(how)


def _short_name(text: str) -> str:
    """The part of a model cell most like a catalogue name: its GGUF file, else its
    last word with a digit ("unsloth/gemma-4-31B-it-GGUF gemma-4-31B-it-IQ4_XS.gguf +
    BF16 mmproj" → "gemma-4-31b-it-iq4_xs")."""
    words = re.sub(r"\(.*?\)", " ", text).split() or [text]
    word = next((w for w in words if w.lower().endswith(".gguf")), None) or \
        next((w for w in reversed(words) if re.search(r"\d", w)), words[-1])
    return re.sub(r"\.gguf$", "", word.rsplit("/", 1)[-1], flags=re.IGNORECASE).lower()


def model_named(text: str) -> tuple[str | None, str | None, str]:
    """(catalogue slug, the weight format the name states, why not: "" when resolved)."""
    if _NOT_SHOWN.match(text or ""):
        return None, None, "model not shown in the log"
    m = resolve_model(text)
    if m.slug is not None:
        return m.slug, m.weight_format, ""
    if m.reason.startswith("unknown"):
        close = ", ".join(closest_names(_short_name(text), list_names("models")))
        return None, m.weight_format, f"model {text!r} not in the catalogue (closest: {close})"
    return None, m.weight_format, m.reason


def weights_named(text: str, from_model: str | None) -> tuple[str | None, str]:
    """(kvsim weight format, why not) of the ``weight_format`` cell (module NOTE), else
    the one the model's name states."""
    low = (text or "").lower()
    if "ollama default quant" in low:
        return "q4_k_m", ""
    stated = resolve_model(text or "")
    said = re.search(r"names format '([^']+)'", stated.reason)
    if stated.weight_format:
        return stated.weight_format, ""
    if said:
        return None, f"weights format {text!r}: {said.group(1)}, which kvsim does not model"
    if re.search(r"unquantized|16-bit|\bbf16\b|bfloat16", low):
        return "bf16", ""
    if from_model:
        return from_model, ""
    if not low or _NOT_SHOWN.match(low):
        return None, "weights format not shown in the log"
    return None, f"weights format {text!r}: not one kvsim models"


def startup_outcome(notes: str, printed: str) -> str | None:
    """"ok" / "failed" where the notes say "Startup OK|FAILED" (or a figure status=OK)."""
    m = re.search(r"\bstartup\s+(ok|failed)\b", notes or "", re.IGNORECASE) or \
        re.search(r"\bstatus\s*=\s*(ok|failed)\b", printed or "", re.IGNORECASE)
    return m.group(1).lower() if m else None


_FA_FAILED = re.compile(r"\b(?:FA|flash[ -]?attn|flash[ -]attention)\b[^.;]*?\bfail(?:ed|s)?\b",
                        re.IGNORECASE)


_FA_OFF = "flash attention off: the notes say it failed"


def _stated_settings(settings: dict[str, object], notes: str
                     ) -> tuple[dict[str, object], tuple[str, ...]]:
    """The settings with what the notes state of the run (module NOTE), and what was
    read so."""
    if "flash_attn" not in settings and _FA_FAILED.search(notes):
        return {**settings, "flash_attn": False}, (_FA_OFF,)
    return settings, ()


def read_memory_row(row: dict[str, str], origin: str) -> MemoryMeasurement:
    """One CSV row (InputError naming ``<id>.<column>.<key>`` for a bad number)."""
    rid = (row.get("id") or "").strip() or origin
    engine = engine_name(row.get("engine", ""))
    settings, remarks = read_settings(row.get("settings", ""), rid)
    settings, stated = _stated_settings(settings, row.get("notes", "") or "")
    figures, unread = _figures(row.get("printed_figures", ""), rid, engine, settings)
    gpus, gpu_reason, gpu_count = gpus_named(row.get("gpu", ""))
    candidates, said = gpu_candidates(row.get("gpu", ""), row.get("vram_total", "")) \
        if not gpus and gpu_reason.startswith(("ambiguous", "GPU not named (")) else ((), "")
    if said and not candidates:  # "1x AMD GPU, 287 GB": no card of that vendor and size
        gpu_reason += f"; no card in the catalogue fits ({said})"
    model, fmt, model_reason = model_named(row.get("model", ""))
    weights, weights_reason = weights_named(row.get("weight_format", ""), fmt)
    notes = row.get("notes", "") or ""
    stock = not (_NOT_STOCK.search(row.get("engine", "")) or
                 re.search(r"out-of-tree patch|\bfork\b", notes, re.IGNORECASE))
    return MemoryMeasurement(
        id=rid, engine=engine, engine_as_printed=row.get("engine", ""), stock=stock,
        engine_version=row.get("engine_version", ""), gpu_as_printed=row.get("gpu", ""),
        gpus=gpus, gpu_reason=gpu_reason, gpu_count=gpu_count, model_as_printed=row.get("model", ""),
        model=model, model_reason=model_reason, weights=weights,
        weights_reason=weights_reason, figures=figures,
        startup=startup_outcome(notes, row.get("printed_figures", "")), remarks=remarks,
        unread=unread, source=row.get("source", ""), notes=notes,
        date=(row.get("date") or "").strip(), stated=stated, settings=settings,
        gpu_candidates=candidates, gpu_memory_said=said,
        free_bytes=available_bytes(row.get("vram_total", ""), row.get("printed_figures", "")))


def read_memory_rows(rows: list[dict[str, str]], origin: str) -> list[MemoryMeasurement]:
    """Every row of an engine-memory-logs CSV (InputError for none, or a bad number)."""
    if not rows:
        raise InputError(origin, "no rows", "an engine-memory-logs CSV with at least one row")
    return [read_memory_row(r, origin) for r in rows]
