"""Drive a scheduler without SimPy: a fixed clock step per engine step."""

from kvsim.core.requests import Request


def req(rid: str, segs: list[tuple[str, int]], out: int, arrival: float = 0.0) -> Request:
    return Request(request_id=rid, session_id=rid.split("#")[0], turn=0, arrival_s=arrival,
                   prompt=tuple((s, 0, n) for s, n in segs),
                   output_id=f"{rid.split('#')[0]}/t{rid.split('#')[-1]}/out",
                   max_output_tokens=out)


def run_until_idle(sched, now: float = 0.0, dt: float = 0.01, max_steps: int = 100_000) -> float:
    for _ in range(max_steps):
        plan = sched.schedule(now)
        if plan is None:
            return now
        now += dt
        sched.complete(plan, now)
    raise AssertionError("scheduler did not drain")
