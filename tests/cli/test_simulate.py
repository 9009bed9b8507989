"""`kvsim simulate`: a bundled scenario end to end, and one-line errors with exit code 2."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from kvsim.cli import cli, main

TRACE_LINE = {"session_id": "a", "kind": "chat", "member": "", "system_prompt_id": None,
              "system_prompt_tokens": 0, "history": "full",
              "turns": [{"start_s": 0.0, "think_s": 0.0, "prefix": [], "tool_tokens": 0,
                         "input_tokens": 10, "output_tokens": 3, "references": []}]}


def _run_main(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _trace(tmp_path: Path, **turn) -> Path:
    line = json.loads(json.dumps(TRACE_LINE))
    line["turns"][0].update(turn)
    p = tmp_path / "trace.jsonl"
    p.write_text(json.dumps({"trace_meta": {"source": "test", "schema_version": 1}}) + "\n"
                 + json.dumps(line) + "\n")
    return p


def _scenario(tmp_path: Path, trace: Path, engine: str = "llama.cpp") -> Path:
    p = tmp_path / "sc.yaml"
    p.write_text(f"gpu: rtx-4090\nmodel: llama-3.1-8b\nengine: {engine}\n"
                 f"workload:\n  trace: {trace}\n")
    return p


def test_simulate_bundled_scenario_writes_results(tmp_path) -> None:
    out = tmp_path / "res"
    r = CliRunner().invoke(cli, ["simulate", "quickstart", "--set", "workload.max_sessions=6",
                                 "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("verdict: ")
    assert "latency over" in r.output and "peak device memory" in r.output
    names = {p.name for p in out.iterdir()}
    assert {"requests.parquet", "itl.parquet", "steps.parquet", "memory.parquet",
            "events.parquet", "summary.json", "scenario.json", "meta.json"} <= names
    # what the CLI wrote is the API's run of the same scenario, whole
    from kvsim.api import simulate
    from kvsim.metrics.results import Results
    from kvsim.scenario import load_scenario
    from kvsim.workload.loader import load_workload
    sc = load_scenario("quickstart", ["workload.max_sessions=6"])
    expected = simulate(sc)
    written = Results.load(out)
    # one request per turn of the 6 sampled sessions (all finish within the day)
    turns = sum(len(s.turns) for s in load_workload(sc.workload, sc.seed))
    assert written.summary["requests"] == len(written.requests) == turns > 6
    assert written.summary.keys() == expected.summary.keys()
    for k, v in expected.summary.items():
        w = written.summary[k]
        assert w == v or (isinstance(v, float) and (
            math.isnan(v) and math.isnan(w) or math.isclose(w, v, rel_tol=1e-15))), (k, w, v)
    pd.testing.assert_frame_equal(written.requests, expected.requests, check_dtype=False)


@pytest.mark.parametrize("args, needle", [
    (["--set", "engine=vllm", "--set", "model=llama-3.1-70b", "--set", "weights=bf16"],
     "cannot load on rtx-4060-ti-16gb: needs"),
    (["--set", "engine.block_tokens=32"], "engine.block_tokens"),
    # max_model_len unset = the model's 131,072 (docs/reference/engines.md §1.1): vLLM refuses to
    # start; the pool is 3,928 blocks of 16 = 62,848 tokens (Llama-3.1-8B q4_k_m on the 4060 Ti,
    # tests/validation/test_monotonic.py BLOCKS)
    (["--set", "engine=vllm"], "set engine.context_tokens (max_model_len; unset, it is the "
     "model's maximum) to at most 62848"),
])
def test_bad_scenarios_exit_2_without_output(tmp_path, capsys, args, needle) -> None:
    out = tmp_path / "res"
    code, _, err = _run_main(["simulate", "quickstart", "-o", str(out), *args], capsys)
    assert code == 2
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1
    assert "Traceback" not in err and not out.exists()


def test_prompt_longer_than_model_context_and_zero_output(tmp_path, capsys) -> None:
    # llama-3.1-8b max 131,072: llama-server rejects that one request (HTTP 400) and the
    # run goes on, as the real server does (kvsim.core.sessions)
    long_trace = _trace(tmp_path, input_tokens=200_000)
    code, out, err = _run_main(["simulate", str(_scenario(tmp_path, long_trace)), "--set",
                                "engine.context_tokens=16384", "-o", str(tmp_path / "o1")],
                               capsys)
    assert code == 0, err
    from kvsim.metrics.results import Results
    req = Results.load(tmp_path / "o1").requests
    assert list(req.failure_reason) == ["exceed_context_size_error"]
    assert list(req.prompt_tokens) == [200_000]
    # the user reads why: too long for the context, not out of memory — and that no
    # context serves it (the model's maximum is 131,072)
    assert "1 prompt_exceeds_context (prompt longer than the context" in out
    assert "kv_exhausted" not in out
    assert out.startswith("verdict: misses — binding: prompt_exceeds_context (prompt longer "
                          "than the context)\n")
    assert ("no change found: the longest request needs 200,000 tokens, more than "
            "llama-3.1-8b's maximum context (131,072): no context serves it") in out
    summary = json.loads((tmp_path / "o1" / "summary.json").read_text())
    assert (summary["failed_too_long_requests"], summary["failed_memory_requests"],
            summary["failed_busy_requests"]) == (1, 0, 0)
    zero = _trace(tmp_path, output_tokens=0)
    code, _, err = _run_main(["simulate", str(_scenario(tmp_path, zero)), "-o",
                              str(tmp_path / "o2")], capsys)
    assert code == 2 and "output_tokens" in err and err.count("\n") == 1
    assert not (tmp_path / "o2").exists()


def test_module_entry_point_reports_one_line(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "kvsim", "simulate", "no-such-scenario", "-o",
                        str(tmp_path / "o")], capture_output=True, text=True, check=False)
    assert r.returncode == 2
    assert "unknown; one of: " in r.stderr and "quickstart" in r.stderr
    assert "or a path to a scenario .yaml file" in r.stderr and "Traceback" not in r.stderr


def _many_sessions(tmp_path: Path, n: int, gap_s: float = 10.0) -> Path:
    """``n`` one-turn sessions, ``gap_s`` apart (each ends long before the next)."""
    lines = [json.dumps({"trace_meta": {"source": "test", "schema_version": 1}})]
    for i in range(n):
        line = json.loads(json.dumps(TRACE_LINE))
        line["session_id"] = f"s{i}"
        line["turns"][0]["start_s"] = i * gap_s
        lines.append(json.dumps(line))
    p = tmp_path / "many.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_a_run_over_the_request_cap_keeps_its_results_and_exits_2(tmp_path, capsys,
                                                                  monkeypatch) -> None:
    # 6 sessions at 0, 10, ..., 50 s against a cap of 4 requests, cut by time so the trace
    # is not refused up front: the 5th submission (at 40 s) stops the run there
    monkeypatch.setattr("kvsim.metrics.records.MAX_REQUESTS", 4)
    sc = _scenario(tmp_path, _many_sessions(tmp_path, 6))
    out = tmp_path / "res"
    code, _, err = _run_main(["simulate", str(sc), "--set", "sim.max_sim_time_s=1000",
                              "-o", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "more than 4 requests" in err and "stopped at 40.0 s" in err and str(out) in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 4 and summary["stopped_at_s"] == 40.0
    assert "more than 4 requests" in summary["stopped_reason"]
    assert (out / "requests.parquet").is_file() and (out / "report.html").is_file()


def test_a_trace_with_more_sessions_than_the_cap_is_refused_at_once(tmp_path, capsys,
                                                                     monkeypatch) -> None:
    monkeypatch.setattr("kvsim.metrics.records.MAX_REQUESTS", 4)
    trace = _many_sessions(tmp_path, 5)
    sc = _scenario(tmp_path, trace)
    out = tmp_path / "res"
    code, _, err = _run_main(["simulate", str(sc), "-o", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "workload.trace" in err and "over 4 sessions" in err and "at most 4 requests" in err
    assert not out.exists()
    # down-sampled to the cap, the same trace runs
    code, _, _ = _run_main(["simulate", str(sc), "--set", "workload.max_sessions=4",
                            "--no-report", "-o", str(out)], capsys)
    assert code == 0 and json.loads((out / "summary.json").read_text())["requests"] == 4


def test_a_run_past_its_memory_limit_stops_with_its_results(tmp_path, capsys) -> None:
    # memory is read every 500 requests, once the request is in: with a 1 MiB limit the
    # 500th submission stops the run (at 499 x 10 s = 4,990 s, sessions 10 s apart); the
    # 499 finished before are kept, and the 500th, just arrived, as unfinished
    sc = _scenario(tmp_path, _many_sessions(tmp_path, 520))
    out = tmp_path / "res"
    code, _, err = _run_main(["simulate", str(sc), "--set", "sim.max_rss_bytes=1MiB",
                              "--no-report", "-o", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "sim.max_rss_bytes" in err and "after 500 requests" in err and "1 MiB" in err
    assert "1 of 500 requests were still running or waiting then" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 500 and summary["stopped_at_s"] == 4990.0
    assert summary["unfinished_requests"] == 1
    req = pd.read_parquet(out / "requests.parquet")
    assert req["status"].value_counts().to_dict() == {"finished": 499, "unfinished": 1}
    last = req.iloc[-1]
    assert (last.request_id, last.status, last.arrival_s) == ("s499#0", "unfinished", 4990.0)
    # llama-server gives it its slot on arrival; its prompt's step had not run yet
    assert last.first_scheduled_s == 4990.0 and last.output_tokens == 0
    assert math.isnan(last.ttft_s) and math.isnan(last.e2e_s)


def test_set_workload_trace_on_a_bundled_scenario_replaces_its_preset(tmp_path, capsys):
    # quickstart names the family-4 preset; --set workload.trace=… means "run this trace
    # instead", not "give either preset or trace, not both"
    trace = _trace(tmp_path, input_tokens=40, output_tokens=5)
    code, _, err = _run_main(["simulate", "quickstart", "--set", f"workload.trace={trace}",
                              "-o", str(tmp_path / "o"), "--no-report"], capsys)
    assert code == 0, err
    from kvsim.metrics.results import Results
    req = Results.load(tmp_path / "o").requests
    assert len(req) == 1 and list(req.prompt_tokens) == [40]
