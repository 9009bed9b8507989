"""Issue 4 acceptance: an imported real trace and a generated household week both
simulate end to end through the CLI, and every request in the trace is accounted for."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from kvsim.cli import cli

AZURE = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "azure-llm-2023" / \
    "AzureLLMInferenceTrace_conv.csv"


def _invoke(*args: str) -> None:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output


def test_imported_azure_trace_simulates(tmp_path: Path) -> None:
    full = tmp_path / "azure.jsonl"
    small = tmp_path / "azure-200.jsonl"
    _invoke("trace", "import", "azure", str(AZURE), "-o", str(full))
    _invoke("trace", "sample", str(full), "--sessions", "200", "-o", str(small))
    out = tmp_path / "run"
    _invoke("simulate", "family-4-vllm", "--set", "workload.preset=null",
            "--set", f"workload.trace={small}", "-o", str(out), "--no-report")
    requests = pd.read_parquet(out / "requests.parquet")
    summary = json.loads((out / "summary.json").read_text())
    # Azure conversation rows are single-turn sessions: one request per sampled session.
    assert len(requests) == 200 == summary["requests"]
    assert requests["session_id"].nunique() == 200
    done = requests[~requests["failed"]]
    assert (done["ttft_s"] > 0).all() and (done["e2e_s"] >= done["ttft_s"]).all()


def test_generated_household_week_simulates(tmp_path: Path) -> None:
    trace = tmp_path / "week.jsonl"
    _invoke("trace", "generate", "family-2", "--days", "7", "--seed", "5", "-o", str(trace))
    sessions = [json.loads(line) for line in trace.read_text().splitlines()[1:]]
    turns = sum(len(s["turns"]) for s in sessions)
    out = tmp_path / "run"
    _invoke("simulate", "quickstart", "--set", "workload.preset=null",
            "--set", f"workload.trace={trace}", "-o", str(out), "--no-report")
    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == turns
    span_days = (requests["arrival_s"].max() - requests["arrival_s"].min()) / 86400
    assert span_days > 5  # activity on most days of the week
    # History grows turn by turn inside a chat: a prompt shrinks only where its session
    # started a new chat after a failed request (workload.after_failure: new_chat)
    events = pd.read_parquet(out / "events.parquet")
    restarts = set(events.request_id[events.kind == "new_chat"])
    for _, grp in requests.sort_values("turn").groupby("session_id"):
        tokens, rids = list(grp["prompt_tokens"]), list(grp["request_id"])
        for k in range(1, len(tokens)):
            assert tokens[k] >= tokens[k - 1] or rids[k] in restarts, rids[k]
