"""Engine calibration: fit a running llama-server's step costs from controlled requests.

``kvsim calibrate engine --url URL`` streams token-id prompts (``n_predict`` +
``ignore_eos``) and times them client-side, with the server's ``timings`` for what was
reused: prefill points extend a cached prompt, decode points are timed by ``predicted_ms``,
batch points decode ``B`` requests in lockstep; with ``--cache-ram`` the RAM-cache save and
restore costs are measured too (:func:`ram_cache_link`). The grid runs in ``repeats`` rounds,
each prompt after an ``idle_s`` pause. :func:`measure_engine` returns raw samples
(:class:`~kvsim.calibrate.engine_samples.EngineSamples`; rounds add up);
:func:`~kvsim.calibrate.engine_samples.engine_artifact` fits them (``source="engine"``).

NOTE: prompts are fresh random ids so only the intended context is reused; the measured
``cache_n`` / ``prompt_n``, not the requested lengths, go into the points.
Design: docs/design/calibration.md (after docs/reference/engines.md §3.7).
"""

from __future__ import annotations

import asyncio
import math
import numbers
import time
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import numpy as np

from kvsim.calibrate.engine_samples import (
    DecodeSample,
    EngineSamples,
    PrefillSample,
    engine_artifact,
)
from kvsim.calibrate.wire import (
    LLAMA_CPP_CACHE_TYPES,
    StreamResult,
    TokenSpace,
    check_server,
    llama_body,
    parse_event,
    sse_events,
)
from kvsim.config.specs import LinkSpec
from kvsim.errors import InputError
from kvsim.latency.artifact import CalibrationArtifact


@dataclass(frozen=True)
class EngineGrid:
    """The points :func:`measure_engine` visits and how often.

    Every field is checked on construction (before anything connects); a bad one is an
    :class:`InputError` named by the ``kvsim calibrate engine`` flag that sets it, or
    by the field's own name where no flag does.
    """

    prompt_tokens: tuple[int, ...] = (32, 128, 512)
    contexts: tuple[int, ...] = (0, 512, 1536)
    batches: tuple[int, ...] = (1, 2, 4)
    decode_tokens: int = 48
    repeats: int = 3
    decode_repeats: int = 3  # decode requests per point per round (cheap, and noisy)
    n_batch: int = 2048
    n_ubatch: int = 512  # NOTE: the server's -ub: it runs a longer prompt as several graphs
    idle_s: float = 0.25
    ram_cache: bool = True
    cache_type: str = "f16"
    space: TokenSpace = field(default_factory=TokenSpace)
    # NOTE: ggml's CPU flash attention tiles query rows in 64s (GGML_FA_TILE_Q) and runs a
    # slower per-row path for shorter ubatches: such prompts get their own attention
    # coefficient.  Keep prompt sizes on both sides of it in the grid.
    small_chunk_tokens: int = 64

    def __post_init__(self) -> None:
        for name, flag, least in (("prompt_tokens", "--prompts", 1),
                                  ("contexts", "--contexts", 0), ("batches", "--batches", 1)):
            object.__setattr__(self, name, _sizes(flag, getattr(self, name), least))
        # NOTE: the first token comes out of the prompt step: 2 tokens give 1 decode step
        for flag, value, least in (("--decode-tokens", self.decode_tokens, 2),
                                   ("--repeats", self.repeats, 1),
                                   ("--decode-repeats", self.decode_repeats, 1),
                                   ("n_batch", self.n_batch, 1),
                                   ("n_ubatch", self.n_ubatch, 1),
                                   ("--small-chunk-tokens", self.small_chunk_tokens, 0)):
            if not _is_int(value) or value < least:
                raise InputError(flag, value, f"an integer >= {least}")
        if self.cache_type not in LLAMA_CPP_CACHE_TYPES:
            raise InputError("--cache-type", self.cache_type, "the server's -ctk, one of "
                             + ", ".join(LLAMA_CPP_CACHE_TYPES))
        if isinstance(self.idle_s, bool) or not isinstance(self.idle_s, int | float) \
                or not 0 <= self.idle_s < math.inf:
            raise InputError("idle_s", self.idle_s, "a finite number of seconds >= 0")


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _sizes(field: str, values: object, least: int) -> tuple[int, ...]:
    """``values`` as a tuple of integers >= ``least``; empty, or any other, is refused."""
    allowed = f"one or more integers >= {least}"
    if not isinstance(values, tuple | list) or not values:
        raise InputError(field, values, allowed)
    if not all(_is_int(v) and v >= least for v in values):
        raise InputError(field, values, allowed)
    return tuple(int(v) for v in values)


class _Prober:
    def __init__(self, client: httpx.AsyncClient, grid: EngineGrid) -> None:
        self.client, self.grid, self.count, self.round = client, grid, 0, 0

    def fresh(self, n: int) -> list[int]:
        self.count += 1
        return self.grid.space.segment_ids(f"calibrate/{self.count}", n) if n else []

    async def complete(self, prompt: list[int], n_predict: int, slot: int | None = None
                       ) -> tuple[float, StreamResult]:
        """Stream one request; returns (send time, result) on the perf_counter clock."""
        body = llama_body(prompt, n_predict, self.grid.space, seed=self.count)
        if slot is not None:
            body["id_slot"] = slot
        res = StreamResult()
        t_send = time.perf_counter()
        async with self.client.stream("POST", "/completion", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode()[:200]
                raise InputError("calibrate engine", f"HTTP {r.status_code}",
                                 f"the server refused a calibration request: {text}")
            async for data in sse_events(r):
                parse_event("llama.cpp", data, res, time.perf_counter())
        if res.error or not res.final or not res.token_times_s:
            raise InputError("calibrate engine", res.error or "no tokens",
                             "the server did not stream a complete answer")
        return t_send, res

    async def prefill(self, ctx: int, p: int) -> PrefillSample:
        """One sample: client-side time to first token of P new tokens on C cached
        ones, with the server's ``cache_n`` and ``prompt_n``, how late the client sent it
        after its pause and the handling the server's ``prompt_ms`` leaves of the time to
        first token (engine_noise.arrival_delay)."""
        base = self.fresh(ctx)
        if ctx:
            await self.complete(base, 1)
        t_pause = time.perf_counter()
        await asyncio.sleep(self.grid.idle_s)
        t_send, res = await self.complete(base + self.fresh(p), 1)
        t = res.final["timings"]
        ttft = res.token_times_s[0] - t_send
        prompt_ms = t.get("prompt_ms")
        return PrefillSample(ttft, int(t["cache_n"]), int(t["prompt_n"]), self.round,
                             late_s=t_send - t_pause - self.grid.idle_s,
                             handling_s=None if prompt_ms is None
                             else ttft - float(prompt_ms) / 1000.0)

    async def decode(self, batch: int, ctx: int) -> list[DecodeSample]:
        """One sample per sequence of ``batch`` requests decoding in lockstep,
        server-timed.

        NOTE: a batch is sent to slots 0 … batch−1: on per-slot streams llama-server runs
        sequences of consecutive ids as one graph (docs/reference/engines.md §3.5), so
        each step measured is one graph of ``batch`` sequences, as the fit reads it."""
        res = await asyncio.gather(*(self.complete(self.fresh(max(ctx, 1)),
                                                   self.grid.decode_tokens,
                                                   slot=i if batch > 1 else None)
                                     for i in range(batch)))
        out = []
        for _, r in res:
            t = r.final["timings"]
            steps = int(t["predicted_n"]) - 1
            gaps = tuple((np.diff(r.server_ms) / 1000.0).tolist())
            # NOTE: the median gap (robust to a busy machine's stray slow steps and to
            # the first few steps after a prompt); the server's mean when it gave no
            # per-token times.
            step_s = (float(np.median(gaps)) if gaps
                      else t["predicted_ms"] / 1000.0 / max(steps, 1))
            out.append(DecodeSample(step_s, steps, gaps, self.round))
        return out


async def _ram_cache_round(probe: _Prober, ctx: int) -> tuple[int, float, float] | None:
    """One RAM-cache sample on ``ctx`` tokens: (restored tokens, save s, restore s);
    None when nothing came back (the server keeps no RAM cache).

    Slot 0 holds ``A`` (C tokens); an unrelated prompt takes the slot over (A is saved
    to the RAM cache), then ``A + x`` brings A back (restored), then ``A + x + y`` runs
    on the slot as it is.  The takeover's first-token time minus a takeover of a
    16-token slot is the save; the last two compute the same 16 new tokens on ~C
    cached ones, so the difference of their first-token times is the restore.
    """
    a = probe.fresh(ctx)
    await probe.complete(a, 1, slot=0)
    ax = a + probe.fresh(16)
    # takeover of A (saves A), takeover of a 16-token slot, A + x (restores A),
    # A + x + y (no cache traffic)
    res = []
    for prompt in (probe.fresh(16), probe.fresh(16), ax, ax + probe.fresh(16)):
        await asyncio.sleep(probe.grid.idle_s)
        res.append(await probe.complete(prompt, 1, slot=0))
    ttft = [r.token_times_s[0] - t for t, r in res]
    restored = int(res[2][1].final["timings"]["cache_n"])
    if restored < ctx // 2:
        return None
    return restored, ttft[0] - ttft[1], ttft[2] - ttft[3]


async def _measure(url: str, grid: EngineGrid, samples: EngineSamples) -> None:
    """``grid.repeats`` rounds, each visiting every grid point once, into ``samples``."""
    slots = int(samples.props.get("total_slots", 1))
    # NOTE: no keep-alive: llama-server may close a connection after a streamed answer,
    # and a reused closed connection fails the next request.
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0),
                                 limits=httpx.Limits(max_keepalive_connections=0)) as client:
        probe = _Prober(client, grid)
        await probe.complete(probe.fresh(8), 2)  # warm-up
        for _ in range(grid.repeats):
            probe.round = samples.rounds
            for c in grid.contexts:
                for p in grid.prompt_tokens:
                    samples.prefill.setdefault((c, p), []).append(await probe.prefill(c, p))
            for b in (b for b in grid.batches if b <= slots):
                for c in sorted(set(grid.contexts)):
                    for _ in range(grid.decode_repeats):
                        samples.decode.setdefault((b, c), []).extend(await probe.decode(b, c))
            for c in (c for c in grid.contexts if grid.ram_cache and c >= 256):
                if samples.ram_absent:
                    break
                got = await _ram_cache_round(probe, c)
                if got is None:
                    samples.ram_absent = True
                else:
                    samples.ram.append(got)
            samples.rounds += 1


def _slot_tokens(props: dict[str, Any]) -> int:
    """The server's cells per slot (``/props`` ``n_ctx``; 0 when it does not say)."""
    return int((props.get("default_generation_settings") or {}).get("n_ctx", 0) or 0)


def _check_fits(grid: EngineGrid, slot_ctx: int) -> None:
    need = max(grid.contexts) + max(grid.prompt_tokens) + grid.decode_tokens
    if slot_ctx and need > slot_ctx:
        raise InputError("calibrate engine", f"slot context {slot_ctx}",
                         f"the grid needs {need} tokens per slot; start the server with a "
                         "larger -c or calibrate a smaller grid")


def fit_grid(grid: EngineGrid, slot_ctx: int) -> EngineGrid:
    """``grid`` with its cached contexts shrunk to a slot of ``slot_ctx`` cells: the
    contexts that fit beside the largest prompt and the decode are kept, and the largest
    context that fits (a multiple of 256 where one fits) replaces those that do not.

    NOTE: a grid that fits is returned as it is; one whose prompts and decode alone
    overflow the slot cannot be shrunk here (:func:`measure_engine` refuses it)."""
    room = slot_ctx - max(grid.prompt_tokens) - grid.decode_tokens
    if not slot_ctx or room < 0 or max(grid.contexts) <= room:
        return grid
    kept = {c for c in grid.contexts if c <= room}
    kept.add(room // 256 * 256 if room >= 256 else room)
    return replace(grid, contexts=tuple(sorted(kept)))


def measure_engine(url: str, grid: EngineGrid | None = None,
                   props: dict[str, Any] | None = None) -> EngineSamples:
    """Check a running llama-server (or take its ``props`` already checked) and take
    ``grid.repeats`` rounds of samples; a grid larger than one slot is refused."""
    grid = grid or EngineGrid()
    props = props if props is not None else check_server(url, "llama.cpp")
    _check_fits(grid, _slot_tokens(props))
    samples = EngineSamples(props={**props, "url": url})
    asyncio.run(_measure(url, grid, samples))
    return samples


def calibrate_engine(url: str, grid: EngineGrid | None = None, *,
                     fit_contexts: bool = False) -> CalibrationArtifact:
    """Measure a running llama-server and return the fitted artifact.

    ``fit_contexts``: shrink the grid's cached contexts to the server's slot
    (:func:`fit_grid`) instead of refusing a grid larger than it — what ``kvsim
    calibrate engine`` does when ``--contexts`` is left at its default; the artifact
    records the contexts measured."""
    grid = grid or EngineGrid()
    props = check_server(url, "llama.cpp")
    if fit_contexts:
        grid = fit_grid(grid, _slot_tokens(props))
    return engine_artifact(measure_engine(url, grid, props), grid)


def ram_cache_link(artifact: CalibrationArtifact, kv_bytes_per_token: int) -> LinkSpec:
    """The "link" a llama-server's RAM-cache saves and restores move over, as measured.

    The simulator times a save of ``n`` bytes as ``latency + n / d2h_bytes_per_s``
    and a restore as ``latency + n / h2d_bytes_per_s``; the measured seconds per
    saved / restored token over the model's KV bytes per token give the rates.  An
    artifact that holds only the round-trip cost (``ram_cache_s_per_token``) splits it evenly between the two.
    The fixed cost per copy measured on restores (``ram_cache_fixed_s``) becomes the
    link's per-transfer latency, paid by saves and restores alike (an approximation:
    the save's fixed cost cancels out of its measurement).
    """
    st = artifact.settings
    total = st.get("ram_cache_s_per_token")
    save, restore = st.get("ram_cache_save_s_per_token"), st.get("ram_cache_restore_s_per_token")
    if not _is_number(save) or not _is_number(restore):
        if not _is_number(total):
            raise InputError("calibration", artifact.device,
                             "measured no RAM-cache cost (server without --cache-ram?)")
        save = restore = total / 2
    # NOTE: a cost below the measurement noise (0) becomes a link too fast to matter.
    def rate(s_per_token: float) -> float:
        return kv_bytes_per_token / s_per_token if s_per_token > 0 else 1e18

    fixed = st.get("ram_cache_fixed_s")
    return LinkSpec(name="llama-server-ram-cache", display_name="llama-server RAM cache",
                    h2d_bytes_per_s=rate(restore), d2h_bytes_per_s=rate(save),
                    latency_s=fixed if _is_number(fixed) else 0.0,
                    source=f"kvsim calibrate engine ({artifact.device})")


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
