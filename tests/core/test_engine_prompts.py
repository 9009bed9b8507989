"""The engine builds each turn's prompt incrementally; it must equal prompt_segments."""

from kvsim.core.requests import seq_from_segments
from kvsim.core.sessions import session_prompts
from kvsim.scenario import load_scenario
from kvsim.workload import load_workload
from kvsim.workload.schema import Segment, Session, Turn, prompt_segments


def _reference(s: Session) -> list:
    return [seq_from_segments([(g.id, g.tokens) for g in prompt_segments(s, i)])
            for i in range(len(s.turns))]


def test_incremental_prompts_equal_prompt_segments_on_a_household_week() -> None:
    sc = load_scenario("quickstart", ["workload.days=7"])
    sessions = list(load_workload(sc.workload, sc.seed))
    assert sum(len(s.turns) > 1 for s in sessions) > 10  # multi-turn histories covered
    for s in sessions:
        assert list(session_prompts(s)) == _reference(s), s.session_id


def test_incremental_prompts_with_system_prefix_tools_and_no_history() -> None:
    pre = (Segment(id="doc", tokens=50),)
    turns = (Turn(start_s=0.0, input_tokens=10, output_tokens=5, prefix=pre),
             Turn(start_s=1.0, input_tokens=0, tool_tokens=7, output_tokens=3),
             Turn(start_s=2.0, input_tokens=4, output_tokens=1))
    for history in ("full", "none"):
        s = Session(session_id="x", system_prompt_id="p", system_prompt_tokens=20,
                    history=history, turns=turns)
        got = list(session_prompts(s))
        assert got == _reference(s)
    # full history, turn 2: system, doc, in0, out0, tool1, out1, in2 (by hand)
    s = Session(session_id="x", system_prompt_id="p", system_prompt_tokens=20, turns=turns)
    assert list(session_prompts(s))[2] == (
        ("sys/p", 0, 20), ("doc", 0, 50), ("x/t0/in", 0, 10), ("x/t0/out", 0, 5),
        ("x/t1/tool", 0, 7), ("x/t1/out", 0, 3), ("x/t2/in", 0, 4))
