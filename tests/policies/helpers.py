"""A fixed three-turn document session and a small llama.cpp scenario around it."""

import re

from kvsim.api import simulate
from kvsim.scenario import load_scenario
from kvsim.workload.schema import ReferenceEvent, Session, Turn

SYS_TOKENS = 400
SPAN = (96, 112)  # 16 exact tokens near the start of turn 0's input


def doc_session(think_s: float = 5.0, content: str = "exact") -> Session:
    ref = ReferenceEvent(turn=0, part="input", offset_tokens=SPAN[0],
                         length_tokens=SPAN[1] - SPAN[0], content=content)
    return Session(session_id="s", system_prompt_id="general", system_prompt_tokens=SYS_TOKENS,
                   turns=(Turn(start_s=0.0, input_tokens=3000, output_tokens=50),
                          Turn(think_s=think_s, input_tokens=2000, output_tokens=20),
                          Turn(think_s=think_s, input_tokens=20, output_tokens=10,
                               references=(ref,))))


def scenario(*sets: str, context: int = 16384, parallel: int = 1):
    return load_scenario("quickstart", [f"engine.context_tokens={context}",
                                        f"engine.parallel={parallel}", *sets])


def run(*sets: str, sessions=None, **kw):
    sc = scenario(*sets, **kw)
    return sc, simulate(sc, sessions=sessions if sessions is not None else [doc_session()])


def references(res) -> list[tuple[str, float, float, int]]:
    """(outcome, m, added_s, bytes) of every scored reference event."""
    ev = res.events[res.events["kind"] == "reference"]
    out = []
    for detail, nbytes in zip(ev["detail"], ev["bytes"]):
        m = re.search(r"^(\S+) .* m=([0-9.]+) added_s=(\S+)$", detail)
        out.append((m.group(1), float(m.group(2)), float(m.group(3)), int(nbytes)))
    return out
