"""Simulate a measured replay with the server's own timing fed back (tests/e2e).

A replay measures, for every request, when it was sent and when each of its tokens was
sampled.  :func:`simulate_fed_back` runs kvsim on the same sessions with

- every turn arriving when the replay sent it (open loop at the measured times), and
- every engine step ending when the server's did: a step ends at the measured time of the
  token it samples for its requests (a decode's next token, a prompt's first token).

Then the slot each request finds — and so ``cache_n`` / ``prompt_n`` — is decided on the
server's own clock, and what is left to compare is kvsim's slot and prompt-cache rules.

The server's sampling times are read on the replay's clock: each token's server-side time
(``timings.predicted_ms``, cumulative from the request's first token) plus one offset per
request, the least of its tokens' client arrival time minus that server time (the token
that reached the client fastest; a busy client reads others late).  Decode tokens of one
step then line up within tens of microseconds across requests, first tokens within a few
milliseconds.

Arrivals are the send times, corrected where the server's own output shows it took a
request otherwise (:func:`server_arrivals`): requests sent within a few milliseconds of
each other reach it in either order, and one sent just before a step ended may reach it
after, and requests whose prompts the server computed in one step arrive together, in
the order its slot choices say (kvsim, idle, would otherwise start a step with the first
alone).
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, bisect_right
from typing import Any

from kvsim.calibrate.replay import Replayer
from kvsim.workload.schema import Session, Turn


def token_times(player: Replayer) -> dict[str, list[float]]:
    """Each request's sampled tokens on the replay clock, by request id (module doc)."""
    out = {}
    for row in player.rows:
        res = row.res
        assert len(res.server_ms) == len(res.token_times_s), "no per-token server timings"
        server = [ms / 1000.0 for ms in res.server_ms]
        offset = min(c - s for c, s in zip(res.token_times_s, server,
                                                         strict=True))
        times: list[float] = []
        for t, n in zip(server, res.token_counts, strict=True):
            times.extend([offset + t] * n)
        out[rid(row)] = times
    return out


TIE_S = 0.005
"""Requests sent closer together than this may reach the server in either order: its
HTTP threads read and tokenize them in parallel (seen: one sent 1.3 ms after another
had its prompt computed first)."""
SAME_STEP_S = 0.0005
"""Sampled tokens closer than this are counted as one step end (:func:`server_arrivals`).
NOTE: tokens of one step can come out further apart (slot by slot, seen 0.8 ms apart):
such a step counts as two ends about a millisecond apart."""


MIN_PROMPT_STEP_S = 0.005
"""A step that computes a prompt takes longer than this here (40+ tokens on the test's
tiny model take 20 ms or more): a token within it before a first token is of that step."""


def server_arrivals(player: Replayer, times: dict[str, list[float]]
                    ) -> tuple[dict[str, float], dict[str, int]]:
    """Each request's arrival as the server took it, and its rank in the server's order
    (which :func:`simulate_fed_back` gives requests arriving at one instant), by id.

    Requests sent together are ordered as the server took them (:func:`_ties`).  Then a
    request whose prompt step started at a step end ``E`` (the server was busy) reached
    the server after the end ``E'`` before that one — else it would have joined the step
    from ``E'`` — so it arrives no earlier than just after ``E'``: a request sent a few
    ms before a step ended may reach the server after it, its HTTP thread reading and
    tokenizing it meanwhile (seen: 11 ms on a busy machine).  A request that waited for
    a slot is moved within its wait, which changes nothing.  Last, requests whose
    prompts the server computed in one step arrive together (:func:`_together`); the
    rank keeps the order set before that (:func:`_slot_order`'s within a step)."""
    ends, steps = _step_ends(times), _prompt_steps(times)
    sent = _ties(player, times, ends, steps)
    out = dict(sent)
    for k, r in enumerate(sorted(sent, key=sent.get)):
        first = times[r][0]
        i = bisect_left(ends, first - MIN_PROMPT_STEP_S)  # ends[i - 1]: the step before
        if i >= 2 and sent[r] <= ends[i - 2] < ends[i - 1]:
            out[r] = ends[i - 2] + 1e-7 * (k + 1)  # NOTE: keeps the order they were sent in
    rank = {r: k for k, r in enumerate(sorted(out, key=lambda r: (out[r], r)))}
    return _together(out, steps), rank


def _prompt_steps(times: dict[str, list[float]]) -> dict[str, float]:
    """Each request's prompt step, named by the earliest first token of it: first tokens
    closer than :data:`MIN_PROMPT_STEP_S` to that one are of the same step."""
    out: dict[str, float] = {}
    step = -math.inf
    for r in sorted(times, key=lambda r: times[r][0]):
        if times[r][0] - step >= MIN_PROMPT_STEP_S:
            step = times[r][0]
        out[r] = step
    return out


def _together(arrivals: dict[str, float], steps: dict[str, float]) -> dict[str, float]:
    """``arrivals`` with the requests whose prompts one server step computed (``steps``:
    :func:`_prompt_steps`) all arriving when the last of them did.

    NOTE: the server had every one of them when that step started; kvsim, idle when the
    first arrives, would start a step with it alone, and the slots of the two steps are
    then released a step apart (seen: s5#3 and s1#4 sent 1.7 ms apart to an idle server
    that took both into one step; the next LRU choice then took s5's slot). Requests
    arriving at one instant reach kvsim in an order SimPy does not promise:
    :func:`simulate_fed_back` puts them in :func:`server_arrivals`' rank order."""
    last: dict[float, float] = {}
    for r, t in arrivals.items():
        last[steps[r]] = max(t, last.get(steps[r], -math.inf))
    return {r: last[steps[r]] for r in arrivals}


def _step_ends(times: dict[str, list[float]]) -> list[float]:
    """The server's step ends: its sampled tokens, those closer than SAME_STEP_S one end."""
    ends: list[float] = []
    for t in sorted(t for ts in times.values() for t in ts):
        if not ends or t - ends[-1] >= SAME_STEP_S:
            ends.append(t)
    return ends


def _ties(player: Replayer, times: dict[str, list[float]], ends: list[float],
          steps: dict[str, float]) -> dict[str, float]:
    """Each request's send time, reordered as the server took them: among requests sent
    within :data:`TIE_S` of each other, the one whose prompt step ended first came first;
    those whose prompts ran in one step in the order the server gave them their slots
    (:func:`_slot_order`).

    NOTE: first tokens of one step come out slot by slot (a few tenths of a millisecond
    to over one apart on a busy machine: seen 0.8 ms), so within a step their order is
    the slots', not the arrivals'; steps that compute prompts are at least
    :data:`MIN_PROMPT_STEP_S` apart, so first tokens closer than that share a step."""
    rows = sorted(player.rows, key=lambda r: r.arrival_s)
    groups: list[list] = []
    for r in rows:
        if groups and r.arrival_s - groups[-1][-1].arrival_s < TIE_S:
            groups[-1].append(r)
        else:
            groups.append([r])
    taken = _slot_order(player, times, ends)
    out: dict[str, float] = {}
    for g in groups:
        sent = sorted(r.arrival_s for r in g)
        for r, t in zip(sorted(g, key=lambda r: (steps[rid(r)], taken[rid(r)], r.arrival_s)),
                        sent, strict=True):
            out[rid(r)] = t
    return out


def _slot_order(player: Replayer, times: dict[str, list[float]], ends: list[float]
                ) -> dict[str, tuple]:
    """Per request, where the server's slot choice puts it among requests taken at once
    (the server's ``id_slot`` of each answer).

    A request that found its own history (``cache_n`` > 0: chosen by prefix similarity)
    takes that slot whenever it comes, so it goes first; the others took the least
    recently used idle slot in the order they came, so they go in the order of their
    slots' last release — the step it ended in, then the slot id (one step releases its
    slots in slot order) — slots never used first, the highest id first (llama-server
    scans with ``<=``).  NOTE: kvsim's slot pool applies the same rules
    (kvsim.core.kv.slots.SlotPool.select), so given this order it gives the server's slots.
    """
    by_slot: dict[int, list[tuple[float, float]]] = {}  # slot → (first token, last token)
    for row in player.rows:
        ts = times[rid(row)]
        by_slot.setdefault(int(row.res.final["id_slot"]), []).append((ts[0], ts[-1]))
    out: dict[str, tuple] = {}
    for row in player.rows:
        slot, first = int(row.res.final["id_slot"]), times[rid(row)][0]
        if int(row.res.final["timings"]["cache_n"]) > 0:
            out[rid(row)] = (0,)
            continue
        before = [last for _, last in by_slot[slot] if last < first]
        step = bisect_right(ends, max(before)) - 1 if before else -1  # its release's step
        out[rid(row)] = (1, step, slot if before else -slot)
    return out


def rid(row) -> str:
    return f"{row.session.session_id}#{row.turn}"


def open_loop(player: Replayer, sent: dict[str, float]) -> list[Session]:
    """The replayed sessions with every turn arriving at ``sent`` (by request id: when
    the server took it, :func:`server_arrivals`)."""
    sessions = {r.session.session_id: r.session for r in player.rows}
    out = []
    for sid, s in sessions.items():
        turns = tuple(Turn(start_s=sent[f"{sid}#{i}"], prefix=t.prefix, tool_tokens=t.tool_tokens,
                           input_tokens=t.input_tokens, output_tokens=t.output_tokens)
                      for i, t in enumerate(s.turns))
        out.append(s.model_copy(update={"turns": turns}))
    return sorted(out, key=lambda s: s.turns[0].start_s)


class FedBackSteps:
    """A latency model whose steps end when the server's did (module doc).

    NOTE: it reads the plan being run and the time it started from :attr:`plan` and
    :attr:`now_s`, which :func:`simulate_fed_back` sets from the scheduler at each
    schedule; the run must be at ``sim.fidelity: step`` (no decode stretch)."""

    clamped_steps = None
    settle_steps = 0
    decode_spread: tuple[float, ...] = ()
    prefill_spread: tuple[float, ...] = ()
    gpu_bytes_per_s = None
    kv_read_token_bytes = 0
    provenance = "the replay's own step ends"

    def __init__(self, times: dict[str, list[float]]) -> None:
        self.times = times
        self.plan: Any = None
        self.now_s = 0.0
        self.unmatched = 0  # steps whose requests had no measured token left

    def step_time_s(self, batch: Any) -> float:
        ends = []
        for item in self.plan.items:
            req = item.req
            samples = item.is_decode or item.num_new_tokens == req.remaining_tokens
            measured = self.times.get(req.request_id, [])
            if samples and req.num_output < len(measured):
                ends.append(measured[req.num_output])
        if not ends:
            self.unmatched += 1
            return 1e-6
        return max(statistics.median(ends) - self.now_s, 1e-6)

    def decode_steps_s(self, contexts: Any, steps: int, kv_read_saved_bytes: float = 0.0):
        raise AssertionError("a fed-back run simulates every step")

    def decode_steps_list(self, contexts: Any, steps: int, kv_read_saved_bytes: float = 0.0):
        return None


def simulate_fed_back(scenario: Any, player: Replayer):
    """kvsim's Results for ``player``'s replay, on the server's own timing (module doc)."""
    import pytest

    from kvsim import api

    model = FedBackSteps(token_times(player))
    sent, rank = server_arrivals(player, model.times)
    build = api.make_scheduler

    def in_order(waiting) -> None:
        """Requests that arrived at one instant in the server's order (:func:`_together`):
        the queue sorted by arrival, then rank (stable: otherwise first come, first served)."""
        if len(waiting) > 1:
            queue = sorted(waiting, key=lambda r: (r.arrival_s, rank.get(r.request_id, 0)))
            waiting.clear()
            waiting.extend(queue)

    def make_scheduler(*args: Any, **kw: Any):
        sched = build(*args, **kw)
        plain = sched.schedule

        def schedule(now_s: float):
            in_order(sched.waiting)
            model.plan, model.now_s = plain(now_s), now_s
            return model.plan

        sched.schedule = schedule
        return sched

    stepwise = scenario.model_copy(update={"sim": scenario.sim.model_copy(
        update={"fidelity": "step"})})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "make_scheduler", make_scheduler)
        mp.setattr(api, "make_latency_model", lambda sc, budget=None: model)
        results = api.simulate(stepwise, sessions=open_loop(player, sent))
    assert model.unmatched == 0, f"{model.unmatched} steps sampled no measured token"
    return results
