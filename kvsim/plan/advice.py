"""One run's verdict, and the one change that would help it most — laid out and checked.

:func:`run_verdict` judges a run's summary against the SLOs (:mod:`kvsim.plan.slo`: the
scenario's own ``slo`` section, ``--slo``, or :data:`DEFAULT_SLOS`), the memory line and
its failures: does it meet them, at what memory, with what OOM risk (one run: 0 or 1 of
1, with its Wilson interval), and what binds.

:func:`advise` finds the change that addresses the binding problem — a larger context
for requests longer than it, a larger pool (or a smaller KV type) for KV memory
exhausted under load, a smaller KV type for a peak over the line, more slots when
requests queued for one — and **checks** it: each candidate is laid out by the engine's
own load-time arithmetic (:func:`kvsim.engines.budget.memory_budget`) and kept only if it
loads, keeps every layer on the GPU, stays under the line and (for a longer context)
lets one session hold the longest request; the first one kept is then re-simulated
with the same seed (unless ``check=False``) and the outcome said as it came out.

NOTE: the change is named by the engine flags that differ between the two launch
commands (``-c 32768``, ``OLLAMA_CONTEXT_LENGTH=32768``) and by the scenario keys it sets.
Design: docs/design/answers.md.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvsim.config.units import format_bytes, format_latency
from kvsim.engines.config import SlotEngineConfig, drop_derived_context
from kvsim.errors import InputError
from kvsim.metrics.failures import CODE_KIND, CODE_WORDS, FAILURE_CODES
from kvsim.plan.flags import engine_flags
from kvsim.plan.slo import Constraints, build_constraints, judge
from kvsim.scenario import Scenario, resolve_scenario

DEFAULT_SLOS = ("ttft_p95=2s", "itl_p95=150ms")
"""kvsim's SLOs when neither ``--slo`` nor the scenario's ``slo`` gives any: an
interactive chat (docs/results.md, "The verdict")."""
MIN_REQUESTS = 100  # a p95 over fewer rests on five or fewer requests
QUEUE_SHARE = 0.5  # queueing this share of the TTFT p95 or more: slots are short
SMALL_KV = ("q8_0", "fp8", "fp8_e4m3")  # the first the engine supports is tried


def constraints_for(scenario: Scenario, slos: tuple[str, ...] = (), **limits: Any
                    ) -> tuple[Constraints, str]:
    """The constraints a verdict judges, and where the SLOs came from ("--slo", "the
    scenario's slo section", "kvsim's defaults")."""
    if slos:
        return build_constraints(list(slos), **limits), "--slo"
    own = [f"{k}={v}" for k, v in scenario.slo.items()]
    if own:
        return build_constraints(own, **limits), "the scenario's slo section"
    return build_constraints(list(DEFAULT_SLOS), **limits), "kvsim's defaults"


@dataclass(frozen=True)
class RunVerdict:
    meets: bool
    binding: str
    headline: str
    details: tuple[str, ...] = ()


def failures(summary: dict[str, Any]) -> dict[str, int]:
    """Failed requests per code (kvsim.metrics.failures), those with any."""
    out = {c: int(summary.get(f"failed_{c}_requests") or 0) for c in FAILURE_CODES}
    return {c: n for c, n in out.items() if n}


def _messages(requests: Any) -> dict[str, str]:
    """The engine's most frequent message per failure code."""
    if requests is None or "failure_code" not in getattr(requests, "columns", ()):
        return {}
    failed = requests[requests["failed"].astype(bool)]
    return {str(c): str(g["failure_reason"].mode().iloc[0])
            for c, g in failed.groupby("failure_code") if len(g)}


def format_limit(s: float) -> str:
    """An SLO's bound as written: '2 s', '150 ms'."""
    return f"{s:g} s" if s >= 1 else f"{s * 1e3:g} ms"


def latency_words(c: Constraints, summary: dict[str, Any]) -> str:
    """'TTFT p95 1,980 ms ≤ 2 s; ITL p95 38.9 ms ≤ 150 ms' for each SLO."""
    out = []
    for b in c.latency:
        v = float(summary.get(b.key, float("nan")))
        metric, pct = b.name.split("_")
        if math.isnan(v):
            out.append(f"{metric.upper()} {pct} - (no request ended)")
            continue
        mark = "≤" if v <= b.limit_s else ">"
        out.append(f"{metric.upper()} {pct} {format_latency(v)} {mark} {format_limit(b.limit_s)}")
    return "; ".join(out)


def binding_words(binding: str) -> str:
    """What a binding constraint or failure code means to a user."""
    if binding in CODE_WORDS:
        return CODE_WORDS[binding]
    if binding == "device_fraction":
        return "peak device memory over the line"
    if binding == "recall":
        return "recall below its target"
    metric, _, pct = binding.partition("_")
    return f"{metric.upper()} {pct} over its SLO" if pct else binding


ONE_RUN_OOM_CI = {False: (0.0, 0.7934506856227626), True: (0.20654931437723745, 1.0)}
"""The Wilson 95 % interval of an OOM risk seen in one run (0 or 1 OOM of 1) — what
``kvsim.plan.stats.wilson_interval(k, 1)`` gives (scipy.stats.binomtest), pinned by
tests/plan/test_one_run_verdict.py.  NOTE: a single run's verdict needs only these two,
and importing scipy.stats would add ~0.6 s to every ``kvsim simulate`` (issue 24)."""


def run_verdict(summary: dict[str, Any], c: Constraints, requests: Any = None,
                session_tokens: int | None = None, source: str = "") -> RunVerdict:
    """Judge one run (module doc); ``session_tokens``: what one session may hold, said
    beside the requests longer than it; ``source``: where the SLOs came from."""
    failed = failures(summary)
    memory_failed = sum(n for code, n in failed.items() if CODE_KIND[code] == "memory")
    # NOTE: no request ended (every one failed): no latency to judge, the failures bind
    ended = [b for b in c.latency if float(summary.get(b.key, float("nan"))) == float(
        summary.get(b.key, float("nan")))]
    given, c = c, replace(c, latency=tuple(ended))
    est = {b.key: float(summary[b.key]) for b in c.latency}
    est["device_fraction"] = float(summary.get("peak_device_fraction", float("nan")))
    est["oom_risk"] = 1.0 if memory_failed else 0.0
    v = judge(c, est)
    meets = v.feasible and not failed
    binding = v.binding if not v.feasible else max(failed, key=failed.get) if failed else ""
    if binding == "oom_risk":  # NOTE: the memory failure behind it is what to act on
        binding = max((k for k in failed if CODE_KIND[k] == "memory"), key=failed.get)
    low, high = ONE_RUN_OOM_CI[bool(memory_failed)]
    head = "meets every target" if meets else \
        f"misses — binding: {binding} ({binding_words(binding)})"
    lines = [f"latency: {latency_words(given, summary)}" + (f" (SLOs: {source})" if source else ""),
             f"memory: peak {format_bytes(summary.get('peak_device_bytes', 0))}, "
             f"{est['device_fraction']:.0%} of the device (line {c.max_device_fraction:.0%}); "
             + ("an OOM-class failure in this run" if memory_failed else "no OOM in this run")
             + f" (one run: OOM risk 95 % CI {low:.0%}–{high:.0%}; kvsim plan -n 8 "
             "narrows it)"]
    lines += _detail_lines(summary, requests, session_tokens)
    return RunVerdict(meets, binding, f"verdict: {head}", tuple(lines))


def _detail_lines(summary: dict[str, Any], requests: Any, session_tokens: int | None
                  ) -> list[str]:
    out = []
    failed, words = failures(summary), _messages(requests)
    if failed:
        parts = []
        for code, n in sorted(failed.items(), key=lambda kv: -kv[1]):
            said = f" — \"{words[code]}\"" if code in words else ""
            extra = ""
            if CODE_KIND[code] == "too_long" and session_tokens:
                extra = (f": the longest needed {int(summary.get('longest_request_tokens', 0)):,}"
                         f" tokens, a session holds {session_tokens:,}")
            parts.append(f"{n:,} {code} ({CODE_WORDS[code]}{extra}){said}")
        out.append(f"failed: {int(summary.get('failed_requests', 0)):,} of "
                   f"{int(summary.get('requests', 0)):,} requests: " + "; ".join(parts))
    n = int(summary.get("latency_requests") or 0)
    if 0 < n < MIN_REQUESTS:
        out.append(f"the latency percentiles rest on {n} requests (fewer than {MIN_REQUESTS}: "
                   "a p95 over them is one of its largest few); simulate more days "
                   "(workload.days) or pool seeds with kvsim plan -n N")
    return out


@dataclass(frozen=True)
class Change:
    """A change that lays out: what it sets and how it came out."""

    why: str
    flags: str  # the launch flags that differ
    sets: dict[str, Any]
    fraction: float
    checked: dict[str, Any] | None = None  # the re-simulated summary
    slo_words: str = ""  # the re-simulated run against the SLOs

    def text(self) -> str:
        sets = ", ".join(f"{k}={v}" for k, v in self.sets.items())
        out = f"{self.why}: `{self.flags}` ({sets}) lays out at {self.fraction:.0%} of device memory"
        if self.checked is not None:
            s = self.checked
            fails = failures(s)
            done = "no request fails" if not fails else "still " + ", ".join(
                f"{n} {c}" for c, n in fails.items())
            out += (f"; re-simulated (same seed): {done}, {self.slo_words}, "
                    f"peak {s['peak_device_fraction']:.0%}")
        return out


def _candidates(s: Scenario, summary: dict[str, Any], c: Constraints, binding: str
                ) -> list[tuple[str, dict[str, Any], int]]:
    """(why, scenario overrides, tokens one session must hold) in the order tried."""
    e = s.engine
    ctx = int(e.context_tokens)
    need = int(summary.get("longest_request_tokens") or 0) + 1
    out: list[tuple[str, dict[str, Any], int]] = []
    small = next((t for t in SMALL_KV if t in e.supported_cache_types
                  and e.cache_type_k in ("f16", "bf16", "f32")), None)
    kv = {"engine.cache_type_k": small, "engine.cache_type_v": small} if small else {}
    if kv and isinstance(e, SlotEngineConfig):
        kv["engine.flash_attn"] = True
    if CODE_KIND.get(binding) == "too_long":
        out += [(f"{binding}: a context that holds the longest request",
                 {"engine.context_tokens": ctx << k}, need) for k in range(1, 9)]
    elif CODE_KIND.get(binding) == "memory":
        out += [(f"{binding}: a larger KV pool", {"engine.context_tokens": ctx << k}, 0)
                for k in (1, 2)]
        if kv:
            out.append((f"{binding}: a smaller KV type, the pool twice as large",
                        {**kv, "engine.context_tokens": ctx * 2}, 0))
    elif binding == "device_fraction" and kv:
        out.append(("device_fraction: a smaller KV type", kv, 0))
    elif binding.startswith(("ttft", "e2e")):
        q, t = float(summary.get("queue_p95_s") or 0), float(summary.get("ttft_p95_s") or 0)
        par = getattr(e, "parallel", None)
        peak = int(summary.get("peak_concurrent_requests") or 0)
        if par and t > 0 and q >= QUEUE_SHARE * t and peak > par:
            # NOTE: each session keeps its context (llama.cpp's -c grows with the slots)
            sets: dict[str, Any] = {"engine.parallel": peak}
            out.append((f"{binding}: requests queued for a slot ({peak} at once on {par})",
                        sets, 0))
    return out


def _apply(s: Scenario, sets: dict[str, Any]) -> Scenario | None:
    doc = s.model_dump(mode="json")
    doc["engine"] = drop_derived_context(doc["engine"], {
        k.split(".", 1)[1] for k in sets if k.startswith("engine.")})
    for key, value in sets.items():
        node = doc
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    if "engine.context_tokens" in sets and "fit_context" in doc["engine"]:
        doc["engine"]["fit_context"] = False
    try:
        return resolve_scenario(doc)
    except InputError:
        return None


def _lays_out(s: Scenario, limit: float, need: int) -> float | None:
    """The device fraction of ``s``'s layout when it is acceptable (module doc)."""
    from kvsim.engines.budget import box_reserves, memory_budget

    try:
        b = memory_budget(s.gpu, s.model, s.weights, s.engine, **box_reserves(s))
    except InputError:
        return None
    if not (b.fits and b.all_layers_on_gpu) or b.device_fraction > limit:
        return None
    if need and min(b.slot_tokens, s.model.max_context_tokens) < need:
        return None
    return float(b.device_fraction)


def changed_flags(before: str, after: str) -> str:
    """The flags of launch command ``after`` whose value differs from ``before``'s."""
    def pairs(cmd: str) -> dict[str, str]:
        toks, out, i = shlex.split(cmd), {}, 0
        while i < len(toks):
            t = toks[i]
            if "=" in t and not t.startswith("-"):
                k, _, v = t.partition("=")
                out[k] = f"{k}={v}"
            elif t.startswith("-"):
                nxt = toks[i + 1] if i + 1 < len(toks) else ""
                has = nxt and not nxt.startswith("-") and "=" not in nxt
                out[t] = f"{t} {nxt}" if has else t
                i += 1 if has else 0
            i += 1
        return out

    old, new = pairs(before), pairs(after)
    return " ".join(v for k, v in new.items() if old.get(k) != v)


MAX_CHECKS = 2  # re-simulations at most, when the first change laid out does not cure it


def _no_latency_setting(summary: dict[str, Any]) -> str:
    """Why no engine setting is offered for a latency target (:func:`_candidates` offers
    more slots only when requests queued for one): they hardly waited, so their own
    prompt and decode steps set it; or they waited with no more at once than the slots."""
    q, t = float(summary.get("queue_p95_s") or 0), float(summary.get("ttft_p95_s") or 0)
    waited = f"queue p95 {format_latency(q)} of TTFT p95 {format_latency(t)}"
    faster = "a faster card (kvsim compare --gpus …), shorter prompts or a looser target"
    if q < QUEUE_SHARE * t or t <= 0:
        return (f"requests hardly waited for a slot ({waited}): the card's own prompt and "
                f"decode speed sets it, which no engine setting changes; {faster} would")
    return (f"requests waited ({waited}) but never more came at once than the slots "
            f"({int(summary.get('peak_concurrent_requests') or 0)} at most): more slots "
            f"would not shorten it; {faster} would")


def advise(s: Scenario, summary: dict[str, Any], c: Constraints, binding: str, *,
           simulate: Callable[[Scenario], dict[str, Any]] | None = None
           ) -> tuple[Change | None, str]:
    """The change for ``binding`` (module doc) and, when there is none, why.

    Candidates are tried in order; one that lays out is re-simulated with
    ``simulate(scenario) → summary`` when given, and kept when no request fails for
    ``binding``'s kind any more — else the next is tried (:data:`MAX_CHECKS` runs at
    most) and the one with the fewest such failures is returned."""
    kind = CODE_KIND.get(binding)
    best: tuple[int, Change] | None = None
    checks = 0
    candidates = _candidates(s, summary, c, binding)
    if not candidates and binding.startswith(("ttft", "e2e")):
        return None, _no_latency_setting(summary)
    for why, sets, need in candidates:
        if need and need > s.model.max_context_tokens:
            return None, (f"the longest request needs {need - 1:,} tokens, more than "
                          f"{s.model.name}'s maximum context ({s.model.max_context_tokens:,}): "
                          "no context serves it; shorter conversations would")
        alt = _apply(s, sets)
        frac = None if alt is None else _lays_out(alt, c.max_device_fraction, need)
        if alt is None or frac is None:
            continue
        flags = changed_flags(engine_flags(s), engine_flags(alt))
        checked = simulate(alt) if simulate is not None else None
        change = Change(why, flags, sets, frac, checked,
                        latency_words(c, checked) if checked is not None else "")
        if checked is None or kind is None:
            return change, ""
        left = sum(n for code, n in failures(checked).items() if CODE_KIND[code] == kind)
        if best is None or left < best[0]:
            best = (left, change)
        checks += 1
        if left == 0 or checks >= MAX_CHECKS:
            break
    if best is not None:
        return best[1], ""
    return None, (f"no single engine setting for {binding} lays out under the "
                  f"{c.max_device_fraction:.0%} line on this card (kvsim compare --gpus …: a "
                  "larger one)")
