"""Flat records the engine emits while it runs (pure Python; no pandas here).

The engine appends rows as things happen; :mod:`kvsim.metrics.results` turns the lists into
DataFrames once at the end. Consecutive decode-only steps with the same batch size merge into
one ``steps`` row; inter-token gaps are affine runs (:mod:`kvsim.core.itl`) in typed arrays
(28 bytes a row). A run cut short records its running and waiting requests as ``unfinished``
(``status``, :data:`STATUSES`) with their progress so far.

NOTE: the requests table cannot be spilled: past :data:`MAX_REQUESTS` ``check_capacity``
raises :class:`~kvsim.errors.RunStopped` and the results so far are kept (≈ 400–500 MB a
run); the process memory is checked too (``max_rss_bytes``), with the headroom saving the
rows held will take (:meth:`Recorder.save_reserve_bytes`), so the bound holds to the end.
Design: docs/design/fast-forward.md (measured memory per request there).
"""

from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import numpy as np
import psutil

from kvsim.errors import RunStopped, capacity_hint
from kvsim.metrics.gaps import group_stats
from kvsim.metrics.recorded import MemorySample, RecordedEvent, RecordedRequest
from kvsim.metrics.rows import (
    ITL_STATS_AT,
    STEP_FIELDS,
    EventRow,
    MemoryRow,
    RequestRow,
    StepRun,
)

_Event = TypeVar("_Event", bound=RecordedEvent)  # a scheduler's own event type

MAX_REQUESTS = 60_000  # NOTE: keeps one run's peak memory within ~400-500 MB (module doc)
RSS_CHECK_REQUESTS = 500  # NOTE: read the process memory once per this many requests
RSS_CHECK_SAMPLES = 1 << 16  # ... and once per this many memory samples
# NOTE: headroom the memory guard keeps for turning the rows into tables, saving them and
# writing the report (kvsim simulate): a fixed part (the Parquet and plotting imports,
# ~70 MiB measured on a 136-request run) and a part per row held, measured with
# benchmarks/rss_bound.py (≈ 270 bytes a memory sample at 1.25 M samples, the report's
# timeline the most of it; ≈ 1-4 KB a request row with its steps and events)
SAVE_RESERVE_BYTES = 80 * 2**20
SAVE_BYTES_PER_ROW = {"requests": 3072, "itl": 100, "steps": 200, "memory": 300,
                      "events": 300}
# ... and what the rows can grow by before the next check (a memory sample held ≈ 160 bytes)
NEXT_CHECK_BYTES = RSS_CHECK_SAMPLES * (160 + 300) + RSS_CHECK_REQUESTS * (2048 + 3072)

REQUEST_COLUMNS = RequestRow._fields  # NOTE: what each column holds: RequestRow
OPTIONAL_REQUEST_COLUMNS = {"truncated_prompt_tokens": 0}  # absent from older folders
# NOTE: ``status`` (one of STATUSES) is a column of the requests *table*, not of these
# rows (kvsim.metrics.results adds it; measured results and older folders derive it
# from ``failed``): finished, failed (by the engine), or unfinished at the run's stop
STATUS = "status"
FINISHED, FAILED, UNFINISHED = "finished", "failed", "unfinished"
NEW_CHAT_EVENT = "new_chat"  # events table: a turn that starts a new chat
ABANDON_EVENT = "abandon"  # events table: one dropped turn (end_session)
STATUSES = (FINISHED, FAILED, UNFINISHED)
ITL_COLUMNS = ("request_id", "gap_s", "count")  # required (measured results have only these)
ITL_DELTA = "gap_delta_s"  # affine runs; absent or 0 = run-length rows
ITL_TABLE_COLUMNS = (*ITL_COLUMNS, ITL_DELTA)
STEP_COLUMNS = tuple(f.name for f in fields(StepRun))
MEMORY_COLUMNS = MemoryRow._fields
EVENT_COLUMNS = EventRow._fields


def current_rss_bytes() -> int:
    """This process's resident memory now (psutil: Linux, macOS and Windows)."""
    return int(psutil.Process().memory_info().rss)


def default_rss_limit_bytes() -> int | None:
    """Half of the machine's physical memory (None when it cannot be read)."""
    try:
        return int(psutil.virtual_memory().total) // 2
    except (OSError, RuntimeError):
        return None


def weighted_quantile(values: list[float], counts: list[int], q: float) -> float:
    """Smallest value with at least ``q`` of the total weight at or below it."""
    if len(values) == 0:
        return math.nan
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    acc = np.cumsum(np.asarray(counts, dtype=np.int64)[order])
    i = int(np.searchsorted(acc, q * int(acc[-1]), side="left"))
    return float(v[order[min(i, len(v) - 1)]])


@dataclass
class Recorder:
    """Collects request, ITL, step, memory-sample and event rows during one run."""

    request_rows: list[RequestRow] = field(default_factory=list)
    status: bytearray = field(default_factory=bytearray)  # per row: its index in STATUSES
    itl_row: array = field(default_factory=lambda: array("i"))  # per itl id: its request row
    final_rows: int = 0  # leading request rows that carry their ITL statistics
    itl_ids: list[str] = field(default_factory=list)  # one per request with gaps
    itl_index: array = field(default_factory=lambda: array("i"))
    itl_gap_s: array = field(default_factory=lambda: array("d"))
    itl_count: array = field(default_factory=lambda: array("q"))
    itl_delta_s: array = field(default_factory=lambda: array("d"))
    steps: list[StepRun] = field(default_factory=list)
    memory: list[MemoryRow] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    output_tokens: int = 0
    max_requests: int = MAX_REQUESTS
    max_rss_bytes: int | None = None  # process memory that stops the run (_check_rss)
    _next_sample_check: int = RSS_CHECK_SAMPLES

    @property
    def requests(self) -> list[RequestRow]:
        """The ``requests`` rows, ITL statistics included."""
        self._finalize()
        return self.request_rows

    @property
    def step_rows(self) -> list[tuple[float, float, int, int, int, int]]:
        """The ``steps`` rows (STEP_COLUMNS) of the step runs."""
        return list(map(STEP_FIELDS, self.steps))

    def _finalize(self) -> None:
        """Fill in the ITL statistics of the rows recorded since the last call, in place.

        NOTE: computed for all those requests at once (:func:`gaps.group_stats`), not
        as each request finishes; rows are replaced one by one (no second copy).
        """
        rows, n0 = self.request_rows, self.final_rows
        if n0 == len(rows):
            return
        self.final_rows = len(rows)
        k0 = bisect.bisect_left(self.itl_row, n0)  # first request with runs to fill
        if k0 == len(self.itl_ids):
            return
        idx = np.frombuffer(self.itl_index, dtype=np.int32)
        r0 = int(np.searchsorted(idx, k0, side="left"))
        stats = group_stats(idx[r0:] - k0, self.itl_gap_s[r0:], self.itl_delta_s[r0:],
                            self.itl_count[r0:], len(self.itl_ids) - k0).tolist()
        make = RequestRow._make
        for k, st in enumerate(stats, start=k0):
            row = self.itl_row[k]
            rows[row] = make((*rows[row][:ITL_STATS_AT], *st))

    @property
    def itl(self) -> dict[str, Any]:
        """The ``itl`` table as columns (request_id, gap_s, count, gap_delta_s)."""
        ids = np.array(self.itl_ids, dtype=object)
        idx = np.frombuffer(self.itl_index, dtype=np.int32) if self.itl_index else \
            np.zeros(0, dtype=np.int32)
        return {"request_id": ids[idx] if len(ids) else np.zeros(0, dtype=object),
                "gap_s": np.array(self.itl_gap_s, dtype=np.float64),
                "count": np.array(self.itl_count, dtype=np.int64),
                ITL_DELTA: np.array(self.itl_delta_s, dtype=np.float64)}

    @property
    def statuses(self) -> list[str]:
        """The ``status`` of each request row (:data:`STATUSES`)."""
        return [STATUSES[c] for c in self.status]

    def check_capacity(self, submitted: int) -> None:
        """Stop a run whose per-request rows would exceed the memory bound (called before
        the ``submitted``-th request enters: it gets no row)."""
        if submitted > self.max_requests:
            raise RunStopped("workload", f"more than {self.max_requests:,} requests",
                             capacity_hint(self.max_requests))

    def check_requests_rss(self, submitted: int) -> None:
        """Stop a run whose process has grown past ``max_rss_bytes`` (read every
        :data:`RSS_CHECK_REQUESTS` requests, after the ``submitted``-th entered: a long
        queue of big prompts grows faster than the rows)."""
        if self.max_rss_bytes is None or submitted % RSS_CHECK_REQUESTS:
            return
        self._check_rss(f"{submitted:,} requests")

    def check_samples(self) -> None:
        """Stop a run whose process has grown past ``max_rss_bytes`` while sampling
        (read every :data:`RSS_CHECK_SAMPLES` memory samples: a fine tick on a busy
        engine grows the memory timeline faster than the request rows)."""
        n = len(self.memory)
        if self.max_rss_bytes is None or n < self._next_sample_check:
            return
        self._next_sample_check = n + RSS_CHECK_SAMPLES
        self._check_rss(f"{n:,} memory samples")

    def save_reserve_bytes(self) -> int:
        """The memory that building, saving and reporting the rows held so far takes on
        top of them (:data:`SAVE_RESERVE_BYTES` + :data:`SAVE_BYTES_PER_ROW` a row), and
        what they may grow by until the next check (:data:`NEXT_CHECK_BYTES`)."""
        per = SAVE_BYTES_PER_ROW
        return (SAVE_RESERVE_BYTES + NEXT_CHECK_BYTES + per["requests"] * len(self.request_rows)
                + per["itl"] * len(self.itl_gap_s) + per["steps"] * len(self.steps)
                + per["memory"] * len(self.memory) + per["events"] * len(self.events))

    def _check_rss(self, after: str) -> None:
        """Stop the run when the process plus what saving its rows takes would pass
        ``max_rss_bytes``, so the bound holds until the results are written."""
        assert self.max_rss_bytes is not None
        rss, reserve = current_rss_bytes(), self.save_reserve_bytes()
        if rss + reserve > self.max_rss_bytes:
            raise RunStopped(
                "sim.max_rss_bytes", f"{rss / 2**20:,.0f} MiB (+{reserve / 2**20:,.0f} MiB "
                f"to save the results) after {after}",
                f"the run passed its memory limit ({self.max_rss_bytes / 2**20:,.0f} MiB); "
                "down-sample or cut the workload, raise sim.sample_interval_s or "
                "sim.max_rss_bytes")

    def request_done(self, req: RecordedRequest) -> None:
        """Record a request row: finished or failed, or (``req.done`` false) one still
        running or waiting when the run stopped — ``unfinished``, its progress so far."""
        nan = math.nan
        arr = req.arrival_s
        first = req.first_scheduled_s
        tok = req.first_token_s
        fin = req.finish_s
        failed = req.failure_reason != ""
        runs = req.itl.runs()
        # NOTE: positional, in RequestRow's declared field order (a keyword call costs
        # ~1 µs a row); tests/metrics/test_request_row.py checks it against the keywords
        self.request_rows.append(RequestRow._make((
            req.request_id, req.session_id, req.turn, req.member, req.kind, arr, first, tok,
            fin, nan if math.isnan(first) else first - arr, nan if math.isnan(tok) else tok - arr,
            fin - arr if not failed else nan, req.sent_prompt_tokens, req.cached_tokens,
            req.computed_prompt_tokens, req.recomputed_tokens, req.num_output, req.preemptions,
            failed, req.failure_reason, req.truncated, req.truncated_prompt_tokens,
            nan, nan, nan, nan)))  # the ITL statistics: filled in by _finalize
        self.status.append(1 if failed else 0 if req.done else 2)  # index in STATUSES
        self.output_tokens += req.num_output
        if runs:
            k = len(self.itl_ids)
            self.itl_ids.append(req.request_id)
            self.itl_row.append(len(self.request_rows) - 1)
            gaps, deltas, counts = zip(*runs)
            self.itl_index.extend([k] * len(runs))
            self.itl_gap_s.extend(gaps)
            self.itl_delta_s.extend(deltas)
            self.itl_count.extend(counts)

    def step(self, start_s: float, end_s: float, prefill_tokens: int, decode_tokens: int,
             batch_size: int, steps: int = 1) -> None:
        last = self.steps[-1] if self.steps else None
        if (last is not None and prefill_tokens == 0 and last.prefill_tokens == 0
                and last.batch_size == batch_size and last.end_s == start_s):
            last.end_s = end_s
            last.steps += steps
            last.decode_tokens += decode_tokens
            return
        self.steps.append(StepRun(start_s, end_s, steps, prefill_tokens, decode_tokens,
                                  batch_size))

    def sample(self, time_s: float, mem: MemorySample) -> None:
        self.memory.append(MemoryRow(time_s, mem.kv_reserved_bytes, mem.kv_allocated_bytes,
                                     mem.kv_cached_bytes, mem.host_kv_bytes, mem.running,
                                     mem.waiting, mem.kv_quant_bytes))

    def event(self, ev: RecordedEvent) -> None:
        self.events.append(EventRow(ev.time_s, ev.kind, ev.request_id, ev.detail,
                                    int(ev.bytes)))

    def drain(self, pending: list[_Event]) -> None:
        """Record and clear a scheduler's pending event list (its ``events``)."""
        if pending:
            for ev in pending:
                self.event(ev)
            pending.clear()
