"""The named rows of the result tables, in their column order.

Each table's columns are its row type's fields (``REQUEST_COLUMNS`` is
``RequestRow._fields``, kvsim.metrics.records), so a row and its table cannot
disagree.  Rows are named tuples: built in C from positional or keyword fields,
indexable, and turned into a DataFrame as plain tuples are.

NOTE: :class:`StepRun` is the one mutable row: consecutive decode-only steps with
the same batch size extend the last run in place (``Recorder.step``); its table
rows (tuples) are read off with :data:`STEP_FIELDS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import NamedTuple


class RequestRow(NamedTuple):
    """One request: finished, failed or unfinished at the run's stop (``requests``).

    NOTE: ``prompt_tokens`` is the prompt as sent, before the engine truncated it to
    fit its context (Ollama, docs/reference/engines.md §4.5); ``truncated_prompt_tokens`` of it were
    dropped, and the engine looked the rest up in its cache (``cached_tokens``) and
    computed the remainder.  ``truncated``: the engine cut the context (that, a
    context shift or a stop at the end).  The ITL statistics are NaN until the
    recorder computes them for all requests at once.
    """

    request_id: str
    session_id: str
    turn: int
    member: str
    kind: str
    arrival_s: float
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    queue_s: float
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    computed_prompt_tokens: int
    recomputed_tokens: int
    output_tokens: int
    preemptions: int
    failed: bool
    failure_reason: str
    truncated: bool
    truncated_prompt_tokens: int
    itl_mean_s: float = math.nan
    itl_p50_s: float = math.nan
    itl_p95_s: float = math.nan
    itl_max_s: float = math.nan


ITL_STATS_AT = RequestRow._fields.index("itl_mean_s")  # the ITL statistics' first field


class MemoryRow(NamedTuple):
    """KV memory and queue lengths at one sampler tick (``memory``)."""

    time_s: float
    kv_reserved_bytes: int
    kv_allocated_bytes: int
    kv_cached_bytes: int
    host_kv_bytes: int
    running: int
    waiting: int
    kv_quant_bytes: int


class EventRow(NamedTuple):
    """One discrete engine event (``events``)."""

    time_s: float
    kind: str
    request_id: str
    detail: str
    bytes: int


@dataclass(slots=True)
class StepRun:
    """Engine steps ``start_s..end_s`` (``steps`` of them) of one batch shape (``steps``)."""

    start_s: float
    end_s: float
    steps: int
    prefill_tokens: int
    decode_tokens: int
    batch_size: int


STEP_FIELDS = attrgetter(*(f.name for f in fields(StepRun)))  # a StepRun's table row


class ReferenceRow(NamedTuple):
    """One scored reference of the accuracy proxy (``references``)."""

    time_s: float
    session_id: str
    request_id: str
    content: str
    outcome: str
    bits: float
    added_s: float
    score: float
