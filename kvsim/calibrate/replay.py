"""Replay a trace against a real server and record measured Results.

Sessions play closed-loop exactly as the simulator's engine plays them, with the same
``after_failure`` rule (:class:`~kvsim.core.sessions.SessionChat`); segments map to token ids
by id (:class:`~kvsim.calibrate.wire.TokenSpace`), earlier answers as the server generated
them. Returns :class:`~kvsim.metrics.results.Results` with ``source="measured"``; HTTP and
stream errors are failed requests with the engine's wording, and the replay goes on.

NOTE: a transport error (refused, reset, timed out) stops the replay at once: :func:`replay`
returns the results so far with ``Results.stopped`` set (a :class:`~kvsim.errors.RunStopped`;
lost requests left out of the requests table); Ctrl-C returns them with a
:class:`ReplayInterrupted` there.
NOTE: every network wait has a wall-clock deadline (a read timeout alone would not do:
every byte resets it, so a server trickling one event a second would hold a request
forever): the server check and the warm-up GET ``check_timeout_s``, each request from
send to its last event ``request_timeout_s``.  A request past its deadline stops the
replay as a lost server does, its stop naming the request (``--request-timeout``).
NOTE: ``time_scale`` multiplies every start and think time, as the workload's ``time_scale``
does for the simulator; pass the same value to both.
Design: docs/design/calibration.md (after docs/design/DESIGN.md §5).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pandas as pd

from kvsim.calibrate.lateness import client_lateness, turn_lateness
from kvsim.calibrate.wire import (
    CHECK_TIMEOUT_S,
    MAX_CHECK_TIMEOUT_S,
    MAX_REQUEST_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    Api,
    StreamResult,
    TokenSpace,
    chat_messages,
    check_server,
    error_reason,
    llama_body,
    openai_body,
    parse_event,
    server_url,
    sse_events,
)
from kvsim.config.units import check_finite_positive
from kvsim.config.workload import AFTER_FAILURE, AfterFailure
from kvsim.core.sessions import SessionChat
from kvsim.errors import InputError, RunStopped
from kvsim.metrics.records import (
    ABANDON_EVENT,
    EVENT_COLUMNS,
    ITL_COLUMNS,
    NEW_CHAT_EVENT,
    REQUEST_COLUMNS,
    weighted_quantile,
)
from kvsim.metrics.results import COLUMNS, Results
from kvsim.metrics.summary import session_outcomes, summarize
from kvsim.workload.schema import Segment, Session, output_segment


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay.  NOTE: both timeouts are wall-clock deadlines (module NOTE)."""

    url: str
    api: Api = "llama.cpp"
    model: str = ""
    space: TokenSpace = field(default_factory=TokenSpace)
    time_scale: float = 1.0
    request_timeout_s: float = REQUEST_TIMEOUT_S
    check_timeout_s: float = CHECK_TIMEOUT_S
    seed: int = 0
    after_failure: AfterFailure = "new_chat"  # NOTE: use the workload's after_failure

    def __post_init__(self) -> None:
        """Checked before anything connects (the CLI's flags are these fields)."""
        object.__setattr__(self, "url", server_url(self.url))
        check_finite_positive("--time-scale", self.time_scale)
        for flag, value, most in (("--request-timeout", self.request_timeout_s,
                                   MAX_REQUEST_TIMEOUT_S),
                                  ("--check-timeout", self.check_timeout_s,
                                   MAX_CHECK_TIMEOUT_S)):
            check_finite_positive(flag, value, f"seconds in (0, {most:g}]")
            if value > most:
                raise InputError(flag, value, f"seconds in (0, {most:g}]")
        if self.after_failure not in AFTER_FAILURE:
            raise InputError("--after-failure", self.after_failure,
                             "one of " + ", ".join(AFTER_FAILURE))


@dataclass
class _Row:
    session: Session
    turn: int
    arrival_s: float
    prompt_tokens: int
    res: StreamResult
    finish_s: float = math.nan


class ServerLost(Exception):
    """A request got no answer at all (a transport error): the replay stops."""

    def __init__(self, at_s: float, reason: str) -> None:
        super().__init__(reason)
        self.at_s, self.reason = at_s, reason


class RequestTimedOut(ServerLost):
    """A request had no complete answer by its deadline: the replay stops."""

    def __init__(self, at_s: float, reason: str, request_id: str) -> None:
        super().__init__(at_s, reason)
        self.request_id = request_id


class ReplayInterrupted(RunStopped):
    """Ctrl-C ended a replay: the stop its Results carry (``Results.stopped``).

    NOTE: a value, never raised; ``allowed`` is the summary's ``stopped_reason``.
    """

    def __init__(self) -> None:
        super().__init__("Ctrl-C", "interrupted", "interrupted (Ctrl-C)")


TRANSPORT_EVENT = "transport_error"


def _earliest(group: BaseExceptionGroup[ServerLost]) -> ServerLost:
    """The first transport error of a (nested) group of them."""
    leaves = [_earliest(e) if isinstance(e, BaseExceptionGroup) else e
              for e in group.exceptions]
    return min(leaves, key=lambda e: e.at_s)


def _what(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _rid(row: _Row) -> str:
    return f"{row.session.session_id}#{row.turn}"


def _row_outcome(row: _Row, now_s: float) -> str | None:
    """A sent turn as the client knows it (:class:`SessionChat`'s ``outcome``)."""
    return None if math.isnan(row.finish_s) or row.finish_s > now_s else row.res.error


class Replayer:
    """Plays sessions against one server; one instance per replay."""

    def __init__(self, opts: ReplayOptions) -> None:
        self.opts = opts
        self.rows: list[_Row] = []
        self.events: list[tuple[float, str, str, str, int]] = []
        self.generated: dict[str, list[int]] = {}
        self.generated_text: dict[str, str] = {}
        self.t0 = 0.0
        self.lost: ServerLost | None = None  # the transport error that stopped the replay
        self._tg: asyncio.TaskGroup | None = None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def run(self, sessions: list[Session]) -> None:
        # NOTE: no keep-alive: a server may close a connection after a streamed answer,
        # and a reused closed connection would fail the next request.
        limits = httpx.Limits(max_connections=len(sessions) + 4, max_keepalive_connections=0)
        timeout = httpx.Timeout(self.opts.request_timeout_s, connect=10.0)
        async with httpx.AsyncClient(base_url=self.opts.url, limits=limits,
                                     timeout=timeout) as client:
            # NOTE: one cheap GET first, so the client's first-use costs (lazy imports,
            # connection machinery: tens of ms) do not land in the first request's TTFT.
            path = "/props" if self.opts.api == "llama.cpp" else "/v1/models"
            try:
                async with asyncio.timeout(self.opts.check_timeout_s):
                    await client.get(path)
            except httpx.TransportError as exc:
                self.lost = ServerLost(0.0, _what(exc))
                return
            except TimeoutError:
                self.lost = ServerLost(0.0, f"GET {path} got no complete answer within "
                                       f"{self.opts.check_timeout_s:g} s")
                return
            self.t0 = time.perf_counter()
            try:  # NOTE: a ServerLost in any task cancels every other one
                async with asyncio.TaskGroup() as tg:
                    self._tg = tg
                    for s in sessions:
                        tg.create_task(self._session(client, s))
            except* ServerLost as group:
                self.lost = _earliest(group)

    async def _sleep_until(self, t_s: float) -> None:
        delay = t_s * self.opts.time_scale - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _session(self, client: httpx.AsyncClient, s: Session) -> None:
        chat = SessionChat(s, self.opts.after_failure, _row_outcome)
        prev: asyncio.Task[None] | None = None
        for i, turn in enumerate(s.turns):
            if i > 0 and turn.start_s is None:
                if prev is not None:
                    await prev
                if turn.think_s and not chat.poll(self.now()):  # NOTE: ends at once
                    await asyncio.sleep(turn.think_s * self.opts.time_scale)
            elif turn.start_s is not None:
                await self._sleep_until(turn.start_s)
            if not chat.begin(i, self.now()):
                self._note_chat(chat, ABANDON_EVENT)
                break
            if chat.opened is not None:
                self._note_chat(chat, NEW_CHAT_EVENT)
            row = _Row(s, i, self.now(), 0, StreamResult())
            seed = self.opts.seed + len(self.rows)
            self.rows.append(row)
            chat.sent(i, row)
            assert self._tg is not None
            prev = self._tg.create_task(self._turn(client, row, chat.segments(i), seed))
        if prev is not None:
            await prev

    def _note_chat(self, chat: SessionChat, kind: str) -> None:
        """The simulator's events for a new chat / an ended session (kvsim.core.engine)."""
        self.events.extend((self.now(), kind, rid, detail, 0) for rid, detail in chat.notes(kind))

    def _prompt_ids(self, segs: list[Segment]) -> list[int]:
        ids: list[int] = []
        for seg in segs:
            ids.extend(self.generated.get(seg.id)
                       or self.opts.space.segment_ids(seg.id, seg.tokens))
        return ids

    async def _turn(self, client: httpx.AsyncClient, row: _Row, segs: list[Segment],
                    seed: int) -> None:
        s, i = row.session, row.turn
        n_out = s.turns[i].output_tokens
        if self.opts.api == "llama.cpp":
            prompt = self._prompt_ids(segs)
            path, body = "/completion", llama_body(prompt, n_out, self.opts.space, seed)
            row.prompt_tokens = len(prompt)
        else:
            path = "/v1/chat/completions"
            msgs = chat_messages(s, i, segs, self.opts.space, self.generated_text)
            body = openai_body(self.opts.model, msgs, n_out, seed)
            row.prompt_tokens = sum(seg.tokens for seg in segs)
        row.arrival_s = self.now()
        try:
            async with asyncio.timeout(self.opts.request_timeout_s):
                await self._stream(client, path, body, row.res)
        except TimeoutError:
            row.finish_s = self.now()
            row.res.transport = (f"no complete answer within "
                                 f"{self.opts.request_timeout_s:g} s")
            raise RequestTimedOut(row.finish_s, row.res.transport, _rid(row)) from None
        row.finish_s = self.now()
        if row.res.transport:
            raise ServerLost(row.finish_s, row.res.transport)
        out_id = output_segment(s, i).id
        if not row.res.error:
            if row.res.tokens:
                self.generated[out_id] = row.res.tokens
            self.generated_text[out_id] = row.res.text

    async def _stream(self, client: httpx.AsyncClient, path: str, body: dict[str, Any],
                      res: StreamResult) -> None:
        try:
            async with client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    res.error = error_reason(r.status_code, (await r.aread()).decode())
                    return
                async for data in sse_events(r):
                    parse_event(self.opts.api, data, res, self.now())
                    if res.error:
                        return
        except httpx.TransportError as exc:  # no answer from the engine (module docstring)
            res.transport = _what(exc)
        except httpx.HTTPError as exc:
            res.error = f"{type(exc).__name__}: {exc}"

    # -- results --------------------------------------------------------------------
    def _request_row(self, row: _Row) -> tuple[tuple[Any, ...], list[tuple[str, float, int]]]:
        s, res, nan = row.session, row.res, math.nan
        rid = _rid(row)
        times = res.token_times_s
        first = times[0] if times else nan
        gaps: list[tuple[str, float, int]] = []
        # NOTE: the server's own gaps when it reports them for every token event
        # (llama.cpp timings_per_token), else the client's arrival gaps.
        stamps = ([m / 1000.0 for m in res.server_ms] if len(res.server_ms) == len(times)
                  else times)
        for a, b, n in zip(stamps, stamps[1:], res.token_counts[1:]):
            gaps.append((rid, b - a, 1))
            gaps.extend((rid, 0.0, 1) for _ in range(n - 1))
        t = res.final.get("timings", {})
        usage = res.usage
        cached = t.get("cache_n", (usage.get("prompt_tokens_details") or {}).get(
            "cached_tokens", nan))
        computed = t.get("prompt_n", nan)
        prompt = row.prompt_tokens
        if self.opts.api == "openai" and usage.get("prompt_tokens") is not None:
            prompt = usage["prompt_tokens"]
            computed = nan if math.isnan(cached) else prompt - cached
        n_out = int(res.final.get("tokens_predicted", sum(res.token_counts)))
        failed = bool(res.error)
        vals = [g for _, g, _ in gaps]
        stats = ((sum(vals) / len(vals), weighted_quantile(vals, [1] * len(vals), 0.5),
                  weighted_quantile(vals, [1] * len(vals), 0.95), max(vals))
                 if vals else (nan,) * 4)
        finish = row.finish_s if not failed else nan
        truncated = bool(res.final.get("truncated", False))
        # NOTE: what the server dropped of the prompt sent, when it reports what it read
        # (llama.cpp timings); 0 when it does not say
        read = cached + computed
        dropped = int(max(0, prompt - read)) if truncated and not math.isnan(read) else 0
        out = (rid, s.session_id, row.turn, s.member, s.kind, row.arrival_s, nan, first,
               finish, nan, first - row.arrival_s, finish - row.arrival_s, prompt, cached,
               computed, 0, n_out if not failed else len(res.tokens), 0, failed, res.error,
               truncated, dropped, *stats)
        return out, gaps

    def results(self, scenario: dict[str, Any] | None = None,
                stopped: RunStopped | None = None) -> Results:
        """The measured Results; ``stopped`` is why the replay ended early (None = it
        did not; its ``allowed`` text is the summary's ``stopped_reason``).  Requests without an answer (lost or cut off) are left out (module
        docstring)."""
        reqs, itl = [], []
        answered = [r for r in self.rows if r.res.error or not (
            r.res.transport or math.isnan(r.finish_s))]
        for row in sorted(answered, key=lambda r: r.arrival_s):
            rec, gaps = self._request_row(row)
            reqs.append(rec)
            itl.extend(gaps)
        lost = [r for r in self.rows if r.res.transport and not r.res.error]
        events = self.events + [(r.finish_s, TRANSPORT_EVENT, _rid(r), r.res.transport, 0)
                                for r in lost]
        frames = {name: pd.DataFrame([], columns=list(COLUMNS[name])) for name in COLUMNS}
        frames["requests"] = pd.DataFrame(reqs, columns=list(REQUEST_COLUMNS))
        frames["itl"] = pd.DataFrame(itl, columns=list(ITL_COLUMNS))
        if events:
            frames["events"] = pd.DataFrame(sorted(events), columns=list(EVENT_COLUMNS))
        for col in ("cached_tokens", "computed_prompt_tokens"):
            frames["requests"][col] = frames["requests"][col].astype("float64")
        end = float(frames["requests"]["finish_s"].max()) if reqs else 0.0
        summary = summarize(frames["requests"], frames["itl"], frames["memory"],
                            frames["steps"], static_device_bytes=0, device_bytes=1,
                            preemptions=0, sim_time_s=0.0 if math.isnan(end) else end)
        for key in ("peak_device_bytes", "device_bytes", "peak_device_fraction"):
            summary[key] = math.nan  # not observable from the HTTP side
        summary.update(session_outcomes(frames["events"]))
        late = client_lateness(turn_lateness(self.rows, self.opts.time_scale))
        if late is not None:
            summary.update(client_late_s=late[0], client_late_sd_s=late[1])
        summary.update(replay_url=self.opts.url, replay_api=self.opts.api,
                       replay_after_failure=self.opts.after_failure,
                       transport_errors=len(lost),
                       unfinished_requests=len(self.rows) - len(answered) - len(lost))
        if stopped is not None:
            at = self.lost.at_s if self.lost else self.now() if self.t0 else 0.0
            summary.update(stopped_at_s=at, stopped_reason=stopped.allowed)
        return Results(**frames, summary=summary, scenario=scenario or {}, source="measured",
                       stopped=stopped)


def replay(sessions: list[Session], opts: ReplayOptions,
           scenario: dict[str, Any] | None = None) -> Results:
    """Check the server, replay ``sessions`` closed-loop and return measured Results.

    When the server stops answering (a :class:`RunStopped`) or on Ctrl-C (a
    :class:`ReplayInterrupted`) it returns the Results so far with ``stopped`` set.
    """
    check_server(opts.url, opts.api, opts.check_timeout_s)
    player = Replayer(opts)
    try:
        asyncio.run(player.run(sessions))
    except KeyboardInterrupt:
        return player.results(scenario, ReplayInterrupted())
    if isinstance(player.lost, RequestTimedOut):
        why = (f"request {player.lost.request_id} got {player.lost.reason} "
               f"({player.lost.at_s:.1f} s into the replay); replay stopped")
        return player.results(scenario, RunStopped("--request-timeout",
                                                   opts.request_timeout_s, why))
    if player.lost is not None:
        why = (f"the server stopped answering {player.lost.at_s:.1f} s into the replay "
               f"({player.lost.reason}); replay stopped")
        return player.results(scenario, RunStopped("--url", opts.url, why))
    return player.results(scenario)
