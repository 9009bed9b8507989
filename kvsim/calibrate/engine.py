"""Engine calibration: fit a running llama-server's step costs from controlled requests.

``kvsim calibrate engine --url URL`` streams controlled requests — token-id prompts
with ``n_predict`` + ``ignore_eos`` — and times them as a client sees them, using the
server's own ``timings`` (``reference/engines.md`` §3.7) for what was reused:

- prefill: a prompt of ``C`` tokens is cached, then a prompt that extends it by ``P``
  tokens is sent; the server reports ``cache_n`` (≈ C) and ``prompt_n`` (≈ P); the
  point's time is the client-side time to the first streamed token, split into
  ``ceil(prompt_n / n_batch)`` steps as the engine packs prompts.  No ``id_slot``: the
  server picks the slot itself (prompt similarity, LRU) and saves/restores slot state
  to its RAM cache as configured, so those per-request costs land in the fit as they
  land in a replay;
- decode: ``n − 1`` decode steps of one sequence (the first token comes out of the
  prompt step), timed by the server's per-token ``predicted_ms`` — the clock replay
  reads its gaps from — as the median gap times the steps;
- batch effects: ``B`` requests sent together decode in lockstep: ``n − 1`` steps of a
  ``B``-sequence decode batch;
- prompts shorter than ``small_chunk_tokens`` (64: the query-row tile of ggml's CPU
  flash attention, below which it runs a per-row path) are fitted with their own
  attention coefficient, so the grid needs prompt sizes on both sides of it.

Client-side times include what the server's ``prompt_ms`` leaves out (HTTP, slot
set-up, first-token sampling) — exactly what ``kvsim replay`` measures, so predictions
and replays are compared on the same footing.  With ``--cache-ram`` on, the seconds
per token that a RAM-cache save + restore adds are measured too
(``settings.ram_cache_save_s_per_token`` / ``ram_cache_restore_s_per_token``;
:func:`ram_cache_link` turns them into the link a
scenario's saves and restores are timed on).  Each measured prompt follows an idle
pause (``idle_s``), as a household's requests follow think time: a prompt sent
straight after another finds the weights hot in the CPU caches and runs faster than
one that arrives after a pause.

Every point is the median over ``repeats``; the points are fitted by
:func:`kvsim.calibrate.fit.fit_points` into an artifact with ``source="engine"``
that scenarios use like a kernel calibration.

NOTE: prompts are fresh random ids (a per-request segment id) so nothing but the
intended context is ever reused from the prompt cache; the measured ``cache_n`` /
``prompt_n``, not the requested lengths, go into the points.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import numpy as np

from kvsim.calibrate.artifact import CalibrationArtifact, TimingPoint
from kvsim.calibrate.fit import fit_points
from kvsim.calibrate.wire import StreamResult, TokenSpace, check_server, llama_body, parse_event
from kvsim.config.specs import LinkSpec
from kvsim.errors import InputError


@dataclass(frozen=True)
class EngineGrid:
    prompt_tokens: tuple[int, ...] = (32, 128, 512)
    contexts: tuple[int, ...] = (0, 512, 1536)
    batches: tuple[int, ...] = (1, 2, 4)
    decode_tokens: int = 48
    repeats: int = 3
    n_batch: int = 2048
    idle_s: float = 0.25
    ram_cache: bool = True
    cache_type: str = "f16"
    space: TokenSpace = field(default_factory=TokenSpace)
    # NOTE: ggml's CPU flash attention tiles query rows in 64s (GGML_FA_TILE_Q) and runs a
    # slower per-row path for shorter ubatches: such prompts get their own attention
    # coefficient.  Keep prompt sizes on both sides of it in the grid.
    small_chunk_tokens: int = 64


class _Prober:
    def __init__(self, client: httpx.AsyncClient, grid: EngineGrid) -> None:
        self.client, self.grid, self.count = client, grid, 0

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
            async for line in r.aiter_lines():
                kind, _, payload = line.partition(":")
                if kind == "data" and payload.strip():
                    parse_event("llama.cpp", json.loads(payload), res, time.perf_counter())
        if res.error or not res.final or not res.token_times_s:
            raise InputError("calibrate engine", res.error or "no tokens",
                             "the server did not stream a complete answer")
        return t_send, res

    async def prefill(self, ctx: int, p: int) -> TimingPoint:
        """Time to first token (client side) of P new tokens on C cached ones."""
        g, times, seen = self.grid, [], []
        for _ in range(g.repeats):
            base = self.fresh(ctx)
            if ctx:
                await self.complete(base, 1)
            await asyncio.sleep(g.idle_s)
            t_send, res = await self.complete(base + self.fresh(p), 1)
            times.append(res.token_times_s[0] - t_send)
            t = res.final["timings"]
            seen.append((int(t["cache_n"]), int(t["prompt_n"])))
        cache_n, prompt_n = statistics.median_low(seen)
        return TimingPoint(kind="prefill", cache_type=g.cache_type, batch=1, context=cache_n,
                           tokens=prompt_n, steps=math.ceil(prompt_n / g.n_batch),
                           measured_s=statistics.median(times), repeats=g.repeats)

    async def decode(self, batch: int, ctx: int) -> TimingPoint:
        """Server-timed decode of ``batch`` requests decoding in lockstep."""
        g, times, counts = self.grid, [], []
        for _ in range(g.repeats):
            res = await asyncio.gather(*(self.complete(self.fresh(max(ctx, 1)),
                                                       g.decode_tokens) for _ in range(batch)))
            for _, r in res:
                t = r.final["timings"]
                steps = int(t["predicted_n"]) - 1
                gaps = np.diff(r.server_ms) / 1000.0
                # NOTE: the median step (robust to a busy machine's stray slow steps)
                # times the steps; the server's total when it gave no per-token times.
                times.append(float(np.median(gaps)) * steps if gaps.size
                             else t["predicted_ms"] / 1000.0)
                counts.append(steps)
        return TimingPoint(kind="decode", cache_type=g.cache_type, batch=batch,
                           context=max(ctx, 1), steps=max(1, min(counts)),
                           measured_s=statistics.median(times), repeats=g.repeats)


async def _ram_cache_s_per_token(probe: _Prober, contexts: tuple[int, ...]
                                 ) -> tuple[float, float, float] | None:
    """Seconds per token that a RAM-cache save and a restore add to a prompt, and the
    fixed seconds per copy (``(save, restore, fixed)``; None: no RAM cache).

    Slot 0 holds ``A`` (C tokens); an unrelated prompt takes the slot over (A is saved
    to the RAM cache), then ``A + x`` brings A back (restored), then ``A + x + y`` runs
    on the slot as it is.  The takeover's first-token time minus a takeover of a
    16-token slot is the save; the last two compute the same 16 new tokens on ~C
    cached ones, so the difference of their first-token times is the restore.  Each
    is a least-squares slope through the origin over every sample, per saved or
    restored token: the simulator charges saves (synchronous on llama-server's loop
    thread) and restores separately.
    """
    restored_n, save_s, restore_s = [], [], []
    for ctx in (c for c in contexts if c >= 256):
        for _ in range(probe.grid.repeats):
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
                return None  # nothing came back: the server keeps no RAM cache
            restored_n.append(restored)
            save_s.append(ttft[0] - ttft[1])
            restore_s.append(ttft[2] - ttft[3])
    if not restored_n:
        return None
    # NOTE: the saved slot held A plus its one answer token; ~C either way.  The save
    # difference cancels any fixed cost (both takeovers pay it), so its slope goes
    # through the origin; the restore is fitted with an intercept: a fixed cost per
    # copy (state set-up, buffer allocation) that the per-token slope cannot show.
    # A cost the noise hides is recorded as 0, not as negative.
    n = np.array(restored_n, dtype=float)
    save = max(0.0, float(n @ np.array(save_s) / (n @ n)))
    if len(set(restored_n)) > 1:
        (fixed, per_token), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(n), n]),
                                                 np.array(restore_s), rcond=None)
    else:
        fixed, per_token = 0.0, float(n @ np.array(restore_s) / (n @ n))
    return save, max(0.0, float(per_token)), max(0.0, float(fixed))


async def _measure(url: str, grid: EngineGrid, slots: int
                   ) -> tuple[list[TimingPoint], float | None]:
    # NOTE: no keep-alive: llama-server may close a connection after a streamed answer,
    # and a reused closed connection fails the next request.
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0),
                                 limits=httpx.Limits(max_keepalive_connections=0)) as client:
        probe = _Prober(client, grid)
        await probe.complete(probe.fresh(8), 2)  # warm-up
        points = [await probe.prefill(c, p) for c in grid.contexts for p in grid.prompt_tokens]
        for b in grid.batches:
            if b > slots:
                continue
            for c in sorted(set(grid.contexts)):
                points.append(await probe.decode(b, c))
        ram = await _ram_cache_s_per_token(probe, grid.contexts) if grid.ram_cache else None
        return points, ram


def calibrate_engine(url: str, grid: EngineGrid | None = None) -> CalibrationArtifact:
    """Measure a running llama-server and return the fitted artifact."""
    grid = grid or EngineGrid()
    with httpx.Client(base_url=url) as client:
        props = check_server(client, "llama.cpp")
    slots = int(props.get("total_slots", 1))
    slot_ctx = int((props.get("default_generation_settings") or {}).get("n_ctx", 0))
    need = max(grid.contexts) + max(grid.prompt_tokens) + grid.decode_tokens
    if slot_ctx and need > slot_ctx:
        raise InputError("calibrate engine", f"slot context {slot_ctx}",
                         f"the grid needs {need} tokens per slot; start the server with a "
                         "larger -c or calibrate a smaller grid")
    points, ram = asyncio.run(_measure(url, grid, slots))
    extra = {} if ram is None else {"ram_cache_save_s_per_token": ram[0],
                                    "ram_cache_restore_s_per_token": ram[1],
                                    "ram_cache_fixed_s": ram[2],
                                    "ram_cache_s_per_token": ram[0] + ram[1]}
    model = str(props.get("model_alias") or props.get("model_path") or "server").split("/")[-1]
    return CalibrationArtifact(
        source="engine", device=f"llama-server at {url}", model=model,
        software={"server": str(props.get("build_info", "llama-server"))},
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        grid={"prompt_tokens": list(grid.prompt_tokens), "context": list(grid.contexts),
              "batch": [b for b in grid.batches if b <= slots],
              "cache_type": [grid.cache_type]},
        settings={"repeats": grid.repeats, "decode_tokens": grid.decode_tokens,
                  "n_batch": grid.n_batch, "slots": slots, "slot_ctx": slot_ctx, **extra},
        points=tuple(points), fits=fit_points(points, grid.small_chunk_tokens))


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
