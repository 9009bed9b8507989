"""Household generator: determinism, session structure, presets, load_workload."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvsim.config.workload import WorkloadConfig
from kvsim.errors import InputError
from kvsim.workload import load_workload
from kvsim.workload.generator import generate
from kvsim.workload.inspect import inspect_sessions
from kvsim.workload.io import write_trace
from kvsim.workload.preset import load_preset
from kvsim.workload.schema import prompt_segments

DAY = 86_400.0


@pytest.fixture(scope="module")
def family4():
    return load_preset("family-4")


@pytest.fixture(scope="module")
def day(family4):
    return generate(family4, 1, seed=3)


def test_same_seed_same_trace_other_seed_differs(family4, day):
    assert generate(family4, 1, seed=3) == day
    assert generate(family4, 1, seed=4) != day


def test_sorted_by_first_start(day):
    starts = [s.turns[0].start_s for s in day]
    assert starts == sorted(starts) and 0 <= starts[0] and starts[-1] < DAY


def test_family4_evening_overlap(family4, day):
    evening = [s for s in day if s.turns[0].start_s >= 18 * 3600]
    assert inspect_sessions(evening)["concurrency"]["peak_sessions"] >= 3
    # not a lucky seed: at least half of 16 days reach three overlapping evening sessions
    hits = sum(inspect_sessions([s for s in generate(family4, 1, seed) if
                                 s.turns[0].start_s >= 18 * 3600])
               ["concurrency"]["peak_sessions"] >= 3 for seed in range(16))
    assert hits >= 8


def test_history_grows_turn_by_turn(day):
    for s in day:
        sizes = [sum(g.tokens for g in prompt_segments(s, i)) for i in range(len(s.turns))]
        for i in range(1, len(sizes)):
            t = s.turns[i]
            # prompt i = prompt i-1 + answer i-1 + this turn's tool output and input
            assert sizes[i] == sizes[i - 1] + s.turns[i - 1].output_tokens \
                + t.tool_tokens + t.input_tokens
            assert sizes[i] > sizes[i - 1]


def test_both_reference_classes_agents_and_documents(family4):
    week = generate(family4, 7, seed=1)
    kinds = {s.kind for s in week}
    assert kinds == {"chat", "homework", "agent", "voice", "document"}
    classes = {r.content for s in week for t in s.turns for r in t.references}
    assert classes == {"exact", "gist"}
    agents = [s for s in week if s.kind == "agent"]
    for s in agents:
        assert s.system_prompt_id == "coder" and s.system_prompt_tokens == 5000
        assert all(t.tool_tokens > 0 and t.input_tokens == 0 for t in s.turns[1:])
        rereads = [i for i, t in enumerate(s.turns) for r in t.references if r.part == "system"]
        # instructions re-read every 4-8 tool calls (uniform 4..8 rounded)
        gaps = [b - a for a, b in zip([0, *rereads], rereads)]
        assert all(4 <= g <= 8 for g in gaps)
        assert len(rereads) == 0 or len(s.turns) >= 5
    assert any(len(s.turns) > 8 for s in agents)
    docs = [s for s in week if s.kind == "document"]
    assert docs
    for s in docs:
        assert s.turns[0].input_tokens >= 500
        for t in s.turns[1:]:
            for r in t.references:
                assert r.turn == 0 and r.part == "input"
                assert r.offset_tokens + r.length_tokens <= s.turns[0].input_tokens


def test_shared_system_prompts(day):
    by_kind = {}
    for s in day:
        by_kind.setdefault(s.kind, set()).add((s.system_prompt_id, s.system_prompt_tokens))
    assert all(len(v) == 1 for v in by_kind.values())


def test_members_are_independent_streams(family4):
    """Removing a member leaves every other member's sessions unchanged."""
    raw = family4.model_dump()
    del raw["members"]["teen-2"]
    smaller = type(family4).model_validate(raw)
    full = [s for s in generate(family4, 2, 5) if s.member != "teen-2"]
    assert generate(smaller, 2, 5) == full


def test_weekend_pattern(family4):
    # day 5 of a Monday-start run is Saturday: parent-1 has morning weekend windows
    sat = [s for s in generate(family4, 7, seed=0) if 5 * DAY <= s.turns[0].start_s < 6 * DAY]
    hours = sorted((s.turns[0].start_s - 5 * DAY) / 3600 for s in sat if s.member == "parent-1")
    allowed = [(9, 12), (14, 18), (20, 22.5)]
    assert hours and all(any(a <= h < b for a, b in allowed) for h in hours)


# family-2 transcribed from workloads/households/family-2.yaml: each member's activity
# windows in hours [start, end) for weekdays and weekends, and its kinds
FAMILY2_WINDOWS = {
    "parent-1": {"weekday": [(7, 9), (12, 13), (20, 22.5)],
                 "weekend": [(9, 12), (14, 18), (20, 22.5)]},
    "parent-2": {"weekday": [(6.5, 8.5), (20, 22.5)],
                 "weekend": [(8, 12), (19.5, 22.5)]},
}
FAMILY2_KINDS = {"parent-1": {"chat", "document", "voice"},
                 "parent-2": {"chat", "voice", "document"}}
# turns clipped to [min, max] then rounded: chat lognormal [1, 40], document [2, 40];
# voice uniform(0.5, 3.49) with min 1 rounds to 1..3.  System prompts: chat → general
# (400 tokens), document → reader (300), voice → voice (250).
FAMILY2_TURNS = {"chat": (1, 40), "document": (2, 40), "voice": (1, 3)}
FAMILY2_SYSTEM = {"chat": ("general", 400), "document": ("reader", 300),
                  "voice": ("voice", 250)}


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), days=st.floats(1.0, 7.0),
       start_weekday=st.integers(0, 6))
def test_any_seed_gives_valid_sorted_trace(seed, days, start_weekday):
    # ≥ 1 whole day: two members with 5 + 4 weekday (6 + 5 weekend) sessions a day on
    # average, so fewer than two sessions is a Poisson(≥ 9) draw ≤ 1 (p < 0.2 %)
    sessions = generate(load_preset("family-2"), days, seed, start_weekday)
    assume(len(sessions) >= 2)
    assert all(0 <= s.turns[0].start_s < days * DAY for s in sessions)
    starts = [(s.turns[0].start_s, s.session_id) for s in sessions]
    assert starts == sorted(starts)
    assert len({s.session_id for s in sessions}) == len(sessions)
    for s in sessions:
        start = s.turns[0].start_s
        day = int(start // DAY)
        assert s.session_id.startswith(f"{s.member}-d{day}-")
        pattern = "weekend" if (start_weekday + day) % 7 >= 5 else "weekday"
        hour = (start - day * DAY) / 3600
        assert any(a - 1e-9 <= hour < b + 1e-9 for a, b in FAMILY2_WINDOWS[s.member][pattern]), \
            (s.member, pattern, hour)
        assert s.kind in FAMILY2_KINDS[s.member]
        lo, hi = FAMILY2_TURNS[s.kind]
        assert lo <= len(s.turns) <= hi, (s.kind, len(s.turns))
        assert (s.system_prompt_id, s.system_prompt_tokens) == FAMILY2_SYSTEM[s.kind]
        assert all(t.start_s is None for t in s.turns[1:])


@pytest.mark.parametrize("name", ["family-2", "family-4", "family-6"])
def test_presets_load_and_document_sources(name):
    p = load_preset(name)
    for kind in p.kinds.values():
        for dist in (kind.turns, kind.input_tokens, kind.output_tokens, kind.think_s):
            assert dist.source, f"{name}: every distribution says where it comes from"
    assert len(p.members) == {"family-2": 2, "family-4": 4, "family-6": 6}[name]


def test_preset_errors():
    with pytest.raises(InputError) as exc:  # a small catalogue is listed whole
        load_preset("family-5")
    assert str(exc.value) == "preset: 'family-5' — unknown; one of: family-6, family-4, family-2"
    with pytest.raises(InputError, match="preset 'family-4'.members.teen-1.weekday.sessions"):
        load_preset("family-4", {"members": {"teen-1": {"weekday": {"sessions": -1}}}})
    with pytest.raises(InputError, match="members.teen-1.kinds: 'gaming' — unknown kind"):
        load_preset("family-4", {"members": {"teen-1": {"kinds": {"gaming": 1}}}})


def test_load_workload_preset_with_overrides(family4):
    cfg = WorkloadConfig(preset="family-4", days=1, params={
        "members": {"parent-2": {"weekday": {"sessions": 0}}}})
    got = list(load_workload(cfg, seed=3))
    # per-member streams: the other members' sessions are exactly those of the preset
    assert got == [s for s in generate(family4, 1, 3) if s.member != "parent-2"]
    assert got


def test_load_workload_trace_sampling_and_scaling(tmp_path, day):
    path = tmp_path / "t.parquet"
    write_trace(path, day)
    assert list(load_workload(WorkloadConfig(trace=str(path)), 0)) == day
    cfg = WorkloadConfig(trace=str(path), max_sessions=5, time_scale=0.5)
    got = list(load_workload(cfg, 0))
    assert len(got) == 5
    ids = {s.session_id for s in day}
    assert {s.session_id for s in got} <= ids
    orig = {s.session_id: s for s in day}
    for s in got:
        assert s.turns[0].start_s == orig[s.session_id].turns[0].start_s * 0.5
        assert s.turns[1:] == orig[s.session_id].turns[1:]
    starts = [s.turns[0].start_s for s in got]
    assert starts == sorted(starts)
    assert list(load_workload(cfg, 0)) == got


def test_sessions_are_made_a_day_at_a_time(family4, monkeypatch):
    """A long run holds only the sessions about to start: taking the first session of a
    week makes day 0's sessions only (the heap yields a day's sessions once the next
    day's are made or the days end), and the stream equals the list."""
    import kvsim.workload.generator as gen

    week = generate(family4, 7, seed=3)
    first_day = sum(1 for s in week if s.turns[0].start_s < 86_400.0)
    made = []
    real = gen.make_session
    monkeypatch.setattr(gen, "make_session", lambda *a: made.append(a) or real(*a))
    stream = gen.stream_sessions(family4, 7, seed=3)
    assert made == []  # nothing made before the first session is asked for
    assert next(stream) == week[0]
    assert len(made) == first_day < len(week)
    assert [week[0], *stream] == week
    with pytest.raises(InputError, match="days"):  # checked at once, not at first next()
        gen.stream_sessions(family4, -1, seed=3)
