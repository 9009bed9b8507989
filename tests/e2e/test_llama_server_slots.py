"""End-to-end: more chat sessions than slots on a real llama-server, whose outcome hinges on
timing (issue 26, "Timing noise as a spread").

Six sessions of five turns, each with its own system prompt, on ``--parallel 4 --cache-ram
0``: which slot a returning session finds free — and so how much of its history the server
reuses — depends on which request finishes first, a matter of milliseconds; replays of
the same sessions reuse different amounts.  Checked, on the same server build and tiny GGUF
as tests/e2e/test_llama_server.py (one calibration round on each replay's server after
it replays, and one on a server of its own first, which sizes the sessions' spacing):

- every replay's prompt-cache reuse lies inside the range kvsim's jittered replications
  give (``latency.jitter_cv`` = the calibration's ``step_time_cv``, ``jitter_prompt_cv``
  = its ``prompt_step_cv``, ``jitter_run_cv`` = its rounds' ``run_speed_cv``,
  ``arrival_delay_s`` / ``arrival_jitter_s`` = its own);
- fed the server's own timing back (every turn sent when the replay sent it, every step
  ending when the server's did: tests/e2e/fed_back.py), kvsim's ``cache_n`` and
  ``prompt_n`` equal the server's for every request of every replay;
- TTFT and inter-token p95 — the median of kvsim's jittered replications, the figure
  `kvsim simulate --jitter-replications` gives for an outcome that hinges on timing —
  are within ±15 % of the median of three replays (of six when the first three miss: a
  busy machine's replays swing by more than the band), else a known miss; a TTFT p95
  fails where the replays' median is improbable under the jittered runs (FAIL_P). Steps
  that put one slot's prompt beside other slots' decodes, or several slots' prompts
  together, run as several ubatches (docs/reference/engines.md §3.5), each priced as the
  one-graph step of its shape (docs/design/calibration.md), and the first decode steps
  after a prompt step run slower (``after_prompt_s``); the simulation prices both.

NOTE: why the jittered median, not the one exact run: this shape's TTFT p95 is the
second-slowest of 30 requests, and those are the turns that find their slot taken
because another session's turn arrived a few milliseconds earlier (s0#2 against s5#1
around 5.7 s: the three turns that then queue behind one 1,158-token step make the
tail).  Replays of the same sessions measured 0.29-0.50 s; one exact run is one side of
the race (+2 / +3 / +22 % against three replays' medians in three recorded runs), the
jittered median −5 / −1 / +4 %.

NOTE: the sessions' spacing is a multiple of the predicted typical request, so a slow
machine stretches the replay instead of changing its shape.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from fed_back import simulate_fed_back
from scipy.stats import monte_carlo_test
from test_llama_server import (  # noqa: F401 - the module's fixtures, used by name
    SPACE,
    _serve,
    _warm_up,
    gguf_path,
    server_bin,
)

from kvsim.api import simulate
from kvsim.calibrate.engine import EngineGrid, measure_engine
from kvsim.calibrate.engine_samples import EngineSamples, engine_artifact
from kvsim.calibrate.lateness import client_lateness, turn_lateness
from kvsim.calibrate.replay import Replayer, ReplayOptions
from kvsim.calibrate.validate import compare_requests, compare_results
from kvsim.latency.artifact import save_artifact
from kvsim.model.importers import model_from_gguf
from kvsim.plan.jitter import jitter_replications
from kvsim.scenario import resolve_scenario
from kvsim.workload.io import write_trace
from kvsim.workload.schema import Session, TraceMeta, Turn

pytestmark = pytest.mark.e2e
SLOTS, SESSIONS, TURNS = 4, 6, 5
REPLAYS = 3
JITTER_RUNS = 400
"""kvsim's jittered replications a judgement takes (~20 s).  NOTE: the range is itself a
noisy estimate of kvsim's support: one recorded replay reused 14.8 % of prompt tokens
where 40 jittered runs reached 14.5 % at most and 100–400 runs 20.6 % (1 % of them above
it); on 2026-12-06 200 runs of four fresh calibrations reached 14.5 / 17.8 / 17.8 / 20.6 %,
while one replay of that day reused 17.8 %.  Later that day one run failed here: one of
six replays reused 20.6 % where the 800 runs reached 17.8 %; of the 108 replays recorded
that day and the day before (72 in test runs, 36 kept for docs/design/timing-noise.md) two
reused 20.6 %, so the server reaches that outcome more often than kvsim's draws do
(docs/design/timing-noise.md, "The slow part measured")."""
SERVER_ARGS = ("-c", str(SLOTS * 2048), "-np", str(SLOTS), "--cache-ram", "0")
# covers the replay: whole prompts recomputed after a session lost its slot (up to 646
# tokens; two such in one step up to 1,292 in all), follow-ups of ~70 new tokens on up to
# ~580 cached, decode batches up to 4 (a batch point's requests go to slots 0..B-1: one
# graph a step); one round per replay.  NOTE: the grid's prompts are one to a step, so a
# step of two prompts is clamped at one prompt's set-up (prefill_seq; counted, printed)
GRID = EngineGrid(prompt_tokens=(16, 40, 64, 128, 256, 512, 768, 1280), contexts=(0, 256, 512),
                  batches=(1, 2, 4), decode_tokens=64, repeats=1, space=SPACE)


def _system_ids() -> list[str]:
    """One system prompt id per session, their first tokens all different: a prompt whose
    first token equals that of a slot's other content reuses that one token on the server
    (``cache_n`` 1), where kvsim, which compares content, reuses none."""
    ids: list[str] = []
    firsts: set[int] = set()
    for k in range(10 * SESSIONS):
        first = SPACE.segment_ids(f"sys/sys{k}", 1)[0]
        if first not in firsts and len(ids) < SESSIONS:
            ids.append(f"sys{k}")
            firsts.add(first)
    return ids


def _sessions(unit_s: float) -> list[Session]:
    """Six closed-loop chats on their own system prompts (200 tokens), 5 turns each.

    Session ``i`` starts at ``0.5·i`` units and thinks ``2 + 0.5·((7i + 3t) mod 5)`` units
    before turn ``t`` (the household of tests/timing_households.py), so more sessions are
    open than there are slots and returning turns meet other sessions' turns."""
    out = []
    for i, system in enumerate(_system_ids()):
        turns = tuple(Turn(start_s=0.5 * unit_s * i if t == 0 else None,
                           think_s=0.0 if t == 0 else unit_s * (2 + 0.5 * ((7 * i + 3 * t) % 5)),
                           input_tokens=40 + 6 * i, output_tokens=24) for t in range(TURNS))
        out.append(Session(session_id=f"s{i}", system_prompt_id=system,
                           system_prompt_tokens=200, turns=turns))
    return out


def _scenario(gguf, artifact, trace, **noise: float | None):
    """The replay's scenario on the calibration ``artifact``; ``noise``: latency keys
    (jitter_cv, jitter_prompt_cv, jitter_run_cv, arrival_delay_s, arrival_jitter_s)."""
    return resolve_scenario({
        "gpu": "rtx-4090", "model": model_from_gguf(gguf), "weights": "f16",
        "engine": {"preset": "llama.cpp", "allocator": "slots",
                   "ctx_size": SLOTS * 2048, "parallel": SLOTS, "cache_ram_bytes": 0},
        "workload": {"trace": str(trace)},
        "latency": {"kind": "calibrated", "path": str(artifact),
                    **{k: v for k, v in noise.items() if v is not None}}})


def _jittered(gguf, artifact, trace, arrival: tuple[float, float] | None = None
              ) -> list[dict]:
    """Summaries of kvsim's JITTER_RUNS jittered replications, at the noise the
    calibration measured: its steps' CVs, its rounds' speed drift (one round on each
    replay's server, so the drift between replays) and how late its requests reached the server
    (``arrival``: this mean and standard deviation instead).
    NOTE: a machine busy enough to stall the server measures a CV of 1 or more, more than
    latency.jitter_cv takes: the widest noise kvsim takes then (calibrate says so)."""
    path, art = artifact
    cv, prompt = art.settings["step_time_cv"], art.settings.get("prompt_step_cv")
    late, sd = arrival or (art.settings.get("arrival_delay_s"),
                           art.settings.get("arrival_jitter_s"))
    run = art.settings.get("run_speed_cv")
    print(f"step_time_cv {cv:.3f}, prompt_step_cv {prompt}, run_speed_cv {run}, "
          f"arrival_delay_s {late}, arrival_jitter_s {sd}")
    sc = _scenario(gguf, path, trace, jitter_cv=min(cv, 0.99),
                   jitter_prompt_cv=None if prompt is None else min(prompt, 0.99),
                   jitter_run_cv=None if run is None else min(run, 0.99),
                   arrival_delay_s=late, arrival_jitter_s=sd)
    return [r.summary for r in jitter_replications(sc, JITTER_RUNS)[1]]


def test_more_sessions_than_slots(server_bin, gguf_path, tmp_path) -> None:  # noqa: F811
    samples: list[EngineSamples] = []
    players: list[Replayer] = []
    trace = tmp_path / "sessions.jsonl"

    def artifact():
        pooled = EngineSamples(props=samples[0].props)
        for smp in samples:
            pooled.extend(smp)
        art = engine_artifact(pooled, GRID)
        return save_artifact(art, tmp_path / f"engine{len(samples)}.json"), art

    def pairs(n: int, sessions: list[Session]) -> None:
        """n × (a fresh server: one replay, then one calibration round on it): one
        server process runs at another speed than the next, so each replay's server
        gives the pooled rounds one of its own; after the replay, which so starts on a
        fresh server (a round first disturbed the slot choices: docs/design/
        timing-noise.md, "Calibrate the server that replays")."""
        for _ in range(n):
            with _serve(server_bin, gguf_path, tmp_path / f"replay{len(players)}.log",
                        *SERVER_ARGS, "--slot-save-path", str(tmp_path)) as srv:
                _warm_up(srv.url)
                player = Replayer(ReplayOptions(url=srv.url, space=SPACE))
                asyncio.run(player.run(sessions))
                assert player.lost is None, player.lost
                players.append(player)
                samples.append(measure_engine(srv.url, GRID))

    with _serve(server_bin, gguf_path, tmp_path / "calibrate.log", *SERVER_ARGS) as cal:
        samples.append(measure_engine(cal.url, GRID))
    write_trace(trace, _sessions(1.0), TraceMeta(source="test"))
    first = simulate(_scenario(gguf_path, artifact()[0], trace)).requests
    unit_s = max(0.25, 4.0 * float(first["e2e_s"].median()))
    sessions = _sessions(unit_s)
    write_trace(trace, sessions, TraceMeta(source="test"))
    pairs(REPLAYS, sessions)
    path, spread, misses = _judged(gguf_path, artifact(), trace, players)
    if misses:  # a busy machine's replays swing by more than the band: three more
        pairs(REPLAYS, sessions)
        path, spread, misses = _judged(gguf_path, artifact(), trace, players)
    runs = [p.results() for p in players]
    print(f"unit {unit_s:.3f} s")

    # 1. measured reuse inside kvsim's jittered range
    _check_reuse(spread, _jittered(gguf_path, artifact(), trace, _client_lateness(players)),
                 runs)

    # 2. the server's timing fed back: every request's cache_n and prompt_n exactly
    known = _fed_back_misses(_scenario(gguf_path, path, trace), players, runs)

    # 3. TTFT and inter-token p95 within ±15 % of the median of the replays; a miss is
    # kept visible as a known miss; a TTFT p95 whose replays' median kvsim's jittered
    # runs make implausible is a failure (FAIL_P; recorded runs and this VM's speed
    # swings: docs/design/timing-noise.md)
    assert not {m: (e, p) for m, (e, p) in misses.items()
                if m.startswith("ttft") and p < FAIL_P}, misses
    known += [f"{m} {e:+.0%} (p {p:.2f})" for m, (e, p) in misses.items()]
    if known:  # NOTE: kept visible rather than loosened (FAIL_P, docs/testing.md)
        pytest.xfail("known misses: " + "; ".join(known))


FAIL_P = 0.01
"""A TTFT p95 fails where the replays' median is this improbable under kvsim's own
jittered runs: the two-sided p of a Monte Carlo test (``scipy.stats.monte_carlo_test``)
of that median against as many runs drawn from the jittered ones.

NOTE: why a test, not a band: this shape's TTFT p95 is the second slowest of 30
requests, and a replay's is one draw of its races: replays of one run measured 0.14 to
0.33 s (2026-12-06), so the median of three moves by ~15 % from one set of replays to the
next with no error in kvsim at all, and a fixed ±30 % band failed runs whose every
replay lay inside kvsim's range (docs/design/timing-noise.md, "Judging a p95 that is one
draw").  The ±15 % band stays, as a known miss (xfail), so a drift stays visible.
Known misses: the inter-token p95 of multi-slot decode steps swings with this 2-core
machine's load (+19 ... +63 % and -19 % in four runs; -16 and -22 % in two of seven on
2026-12-06, the replays' client streaming beside the one-thread server)."""
MAX_RACES = 2
"""Requests of one replay (of 30) that may differ with the server's timing fed back (a
known miss, listed): 0 or 1 in most replays, 2 in one of ~20 on 2026-12-06, before the
harness put requests of one server step together (every recorded replay matches since)."""


def _judged(gguf, artifact, trace, players: list[Replayer]
            ) -> tuple[Path, list[dict], dict[str, float]]:
    """The pooled artifact's path, kvsim's jittered summaries and the latency misses
    against the replays so far (one fit of the pooled rounds)."""
    spread = _jittered(gguf, artifact, trace)
    return artifact[0], spread, _latency_misses(gguf, artifact[0], trace, players, spread)


def _client_lateness(players: list[Replayer]) -> tuple[float, float]:
    """Mean and standard deviation of how late the replays' client sent its turns
    (kvsim.calibrate.lateness), over every replay."""
    late = [x for p in players for x in turn_lateness(p.rows)]
    mean, sd = client_lateness(late)
    print(f"replay client lateness: mean {1e3 * mean:.2f} ms, sd {1e3 * sd:.2f} ms, "
          f"max {1e3 * max(late):.2f} ms")
    return mean, sd


def _check_reuse(calibrated: list[dict], replayed: list[dict], runs: list) -> None:
    """Every replay's prompt-cache reuse inside the range of kvsim's jittered runs: at
    the calibration's noise, and with the replays' own client lateness as the arrival
    delay.

    NOTE: the step noise alone does not reach it: on a quiet machine the prompt CV
    measured 0.007 and 400 runs with step noise only all reused 4.1 % while the replays
    reused 4.1-8.7 % (2026-12-06). What moves the races is also when each request lands
    between steps: the client's lateness and the server's handling, which the calibration
    measures (latency.arrival_delay_s / arrival_jitter_s) on an idle server. Under the
    replay's load this VM's client now and then sends a turn tens of ms late (max 44.5 ms
    in one run's replays, 3.5 ms in a quiet one), which flips races no calibration here
    saw (replays reusing 14.8-20.6 % where 400 runs at the calibration's delay reached
    12.0 %); the replays' own lateness, read from their send times as the fed-back check
    reads them, covers those (docs/design/timing-noise.md)."""
    spread = [s["prefix_hit_rate"] for s in calibrated + replayed]
    print("reuse at the calibration's arrival delay "
          f"{min(s['prefix_hit_rate'] for s in calibrated):.4f} … "
          f"{max(s['prefix_hit_rate'] for s in calibrated):.4f}, at the replays' lateness "
          f"{min(s['prefix_hit_rate'] for s in replayed):.4f} … "
          f"{max(s['prefix_hit_rate'] for s in replayed):.4f}")
    measured = [m.summary["prefix_hit_rate"] for m in runs]
    print(f"reuse measured {[round(v, 4) for v in measured]}, kvsim jittered "
          f"{min(spread):.4f} … {max(spread):.4f} over {len(spread)} runs")
    assert all(min(spread) <= v <= max(spread) for v in measured)


def _fed_back_misses(exact, players: list[Replayer], runs: list) -> list[str]:
    """Each replay simulated with the server's own timing fed back: the requests whose
    cache_n / prompt_n differ, as known misses (more than MAX_RACES in a replay fails)."""
    known = []
    for k, (player, m) in enumerate(zip(players, runs, strict=True)):
        per = compare_requests(m, simulate_fed_back(exact, player))
        assert len(per) == SESSIONS * TURNS
        bad = per[~(per["cached_tokens_equal"] & per["computed_prompt_tokens_equal"])]
        print(f"replay {k}: {len(bad)} of {len(per)} requests differ with its timing fed back")
        which = ", ".join(f"{r.request_id} cached {r.cached_tokens_measured:g} measured, "
                          f"{r.cached_tokens_predicted:g} predicted" for r in bad.itertuples())
        known += [f"replay {k} fed back: {len(bad)} requests differ ({which})"] if len(bad) else []
        # NOTE: a request whose slot the server chose within a few milliseconds (of a step
        # end, or of another request's arrival) can go either way, and the harness cannot
        # always tell which way it went (fed_back.server_arrivals). Up to 2 of 30 were seen
        # while the harness ordered prompts of one step by their first tokens (which come
        # out slot by slot). Since then prompts of one step go in the order the server's
        # slot choices say (fed_back._slot_order), and requests the server took into one
        # step arrive together, in that order (fed_back._together: two requests sent
        # 1.7 ms apart to an idle server, which kvsim had run in two steps, releasing their
        # slots a step apart). The 12 replays recorded on 2026-12-06 then all match, the
        # two that missed (1 and 3 requests) included.
        # Up to MAX_RACES is a known miss, listed; more is a failure
        assert len(bad) <= MAX_RACES, bad.to_string()
    return known


def _latency_misses(gguf, artifact, trace, players: list[Replayer], jittered: list[dict]
                    ) -> dict[str, tuple[float, float]]:
    """p95 TTFT and inter-token latency — the median of kvsim's jittered replications —
    outside ±15 % of the replays' median, each with the p of that median under the
    jittered runs (:func:`_predictive_p`; p50s and the one exact run printed beside)."""
    exact = simulate(_scenario(gguf, artifact, trace))
    print(exact.summary["latency_model"])
    runs = [p.results() for p in players]
    misses = {}
    for metric in ("ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s"):
        each = [compare_results(m, exact).set_index("metric").loc[metric] for m in runs]
        med = float(np.median([e["measured"] for e in each]))
        predicted = float(np.median([s[metric] for s in jittered]))
        rel = predicted / med - 1
        p = _predictive_p([s[metric] for s in jittered], [e["measured"] for e in each])
        print(f"{metric}: measured {[round(e['measured'], 4) for e in each]} median "
              f"{med:.4f} over {len(runs)} replays, predicted {predicted:.4f} ({rel:+.1%}; "
              f"p {p:.3f}; one exact run {each[0]['predicted']:.4f}, "
              f"{each[0]['predicted'] / med - 1:+.1%})")
        if metric.endswith("p95_s") and abs(rel) > 0.15:
            misses[metric] = (rel, p)
    return misses


def _predictive_p(jittered: list[float], measured: list[float]) -> float:
    """Two-sided p of the replays' median under kvsim's jittered runs: how often the
    median of as many runs, drawn (with replacement) from the jittered ones, lies as far
    from theirs (``scipy.stats.monte_carlo_test``, a fixed seed: the same runs give the
    same p)."""
    pool = np.asarray(jittered, dtype=float)
    rng = np.random.default_rng(0)
    res = monte_carlo_test(np.asarray(measured, dtype=float),
                           lambda size: rng.choice(pool, size=size), np.median,
                           vectorized=True, n_resamples=9999)
    return float(res.pvalue)
