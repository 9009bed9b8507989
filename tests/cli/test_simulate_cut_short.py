"""`kvsim simulate` of a run the clock cuts short: unfinished requests stay visible.

Three one-turn sessions arrive together at 0 s (10-token prompts, 100 output tokens)
on llama.cpp with one slot (no RAM prompt cache: a slot taken over is not saved, no
stall) and constant 10 ms steps, so they run one after another:
the prompt's step gives the first token (TTFT 10 ms), then 99 decode steps, 1.00 s
per request.  ``sim.max_sim_time_s=1.505`` stops the run while the second decodes.
"""

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from kvsim.cli import main
from kvsim.metrics.results import Results

SESSION = {"kind": "chat", "member": "", "system_prompt_id": None, "system_prompt_tokens": 0,
           "history": "full"}


def _scenario(tmp_path: Path) -> Path:
    lines = [json.dumps({"trace_meta": {"source": "test", "schema_version": 1}})]
    for sid in "abc":
        lines.append(json.dumps({**SESSION, "session_id": sid, "turns": [
            {"start_s": 0.0, "think_s": 0.0, "prefix": [], "tool_tokens": 0,
             "input_tokens": 10, "output_tokens": 100, "references": []}]}))
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    p = tmp_path / "sc.yaml"
    p.write_text("name: three\ndescription: a family-4 household, one day\n"
                 "gpu: rtx-4090\nmodel: llama-3.1-8b\n"
                 "engine: {preset: llama.cpp, parallel: 1, context_tokens: 4096, "
                 "cache_ram_bytes: 0}\n"
                 "latency: {kind: constant, step_s: 0.01}\nworkload:\n  trace: t.jsonl\n")
    return p


def _simulate(tmp_path: Path, capsys, *sets: str) -> tuple[int, str, Path]:
    out = tmp_path / "res"
    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(_scenario(tmp_path)),
              *[arg for s in sets for arg in ("--set", s)], "-o", str(out)])
    return exc.value.code, capsys.readouterr().err, out


def test_requests_running_or_waiting_at_the_stop_are_kept_and_counted(tmp_path,
                                                                       capsys) -> None:
    code, err, out = _simulate(tmp_path, capsys, "sim.max_sim_time_s=1.505")
    assert code == 0
    assert err.strip().splitlines() == [(
        "warning: 2 of 3 requests were still running or waiting at the stop (1.5 s), kept "
        "with status 'unfinished' in requests.parquet; latency percentiles cover the 1 "
        "that ended only")]
    req = pd.read_parquet(out / "requests.parquet").set_index("request_id")
    assert list(req["status"]) == ["finished", "unfinished", "unfinished"]
    # a: 0-1.00 s, finished; b: admitted at 1.00 s, first token 1.01 s, then one token
    # per 10 ms step: tokens at 1.01, 1.02, ..., 1.50 s = 50 by the stop at 1.505 s
    # (TTFT 1.01 s from its arrival at 0); c: still waiting, nothing scheduled
    assert req.loc["a#0", "e2e_s"] == pytest.approx(1.0)
    assert req.loc["b#0", "output_tokens"] == 50
    assert req.loc["b#0", "ttft_s"] == pytest.approx(1.01)
    assert math.isnan(req.loc["b#0", "e2e_s"]) and math.isnan(req.loc["b#0", "finish_s"])
    assert req.loc["c#0", "output_tokens"] == 0 and math.isnan(req.loc["c#0", "ttft_s"])
    assert math.isnan(req.loc["c#0", "first_scheduled_s"])
    # b's 49 gaps so far are stored; the summary's ITL covers a's 99 gaps only
    itl = pd.read_parquet(out / "itl.parquet").groupby("request_id")["count"].sum()
    assert itl.to_dict() == {"a#0": 99, "b#0": 49}
    s = json.loads((out / "summary.json").read_text())
    assert (s["requests"], s["unfinished_requests"], s["failed_requests"]) == (3, 2, 0)
    assert s["output_tokens"] == 100 + 50 == req["output_tokens"].sum()
    # percentiles over a alone: TTFT 10 ms, E2E 1.00 s (b's 1.01 s TTFT left out)
    assert s["ttft_p95_s"] == pytest.approx(0.01) and s["e2e_p95_s"] == pytest.approx(1.0)
    # 150 tokens from the first arrival (0 s) to the stop (1.505 s)
    assert s["tokens_per_s"] == pytest.approx(150 / 1.505) and s["sim_time_s"] == 1.505
    # the report's card says so too
    html = (out / "report.html").read_text()
    assert "<span>unfinished at the stop</span><b>2</b>" in html


def test_a_run_that_ends_keeps_no_unfinished_rows_and_no_warning(tmp_path, capsys) -> None:
    code, err, out = _simulate(tmp_path, capsys, "sim.max_sim_time_s=10")
    assert code == 0 and "warning" not in err
    s = json.loads((out / "summary.json").read_text())
    assert (s["requests"], s["unfinished_requests"]) == (3, 0)
    assert set(Results.load(out).requests["status"]) == {"finished"}


def test_the_description_follows_the_workload_a_set_changed(tmp_path, capsys) -> None:
    # the file's description ("a family-4 household, one day") no longer says what ran
    code, _, out = _simulate(tmp_path, capsys, "sim.max_sim_time_s=10",
                             "engine.context_tokens=2048")
    assert code == 0
    desc = json.loads((out / "scenario.json").read_text())["scenario"]["description"]
    assert desc == ("trace t.jsonl, cut at 10 s; Llama-3.1-8B q4_k_m on GeForce RTX 4090; "
                    "llama.cpp, unified, context 2048 per session (-c 2048), parallel 1, "
                    "KV f16/f16 (scenario "
                    "three with --set sim.max_sim_time_s=10, engine.context_tokens=2048)")
    html = (out / "report.html").read_text()
    assert "a family-4 household" not in html and "trace t.jsonl, cut at 10 s" in html


def test_a_set_that_leaves_the_description_true_keeps_it(tmp_path, capsys) -> None:
    code, _, out = _simulate(tmp_path, capsys, "sim.sample_interval_s=0.5", "seed=3")
    assert code == 0
    desc = json.loads((out / "scenario.json").read_text())["scenario"]["description"]
    assert desc == "a family-4 household, one day"
