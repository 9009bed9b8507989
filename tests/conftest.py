"""Fixtures shared by every test folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture()
def kvsim_cli(capsys) -> Callable[..., tuple[int, str, str]]:
    """Run ``kvsim ARGV...`` in-process: (exit code, the stderr error line or "", stdout).

    Asserts the user-error contract on the way: no traceback, at most one ``error:``
    line on stderr, and it is the last line.  ``run.stderr`` keeps the whole stderr.
    """
    from kvsim.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main([str(a) for a in argv])
        out, err = capsys.readouterr()
        run.stderr = err  # type: ignore[attr-defined]
        errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert "Traceback" not in err and len(errors) <= 1, err
        if errors:
            assert err.strip().splitlines()[-1] == errors[0], err
        return exc.value.code, errors[0] if errors else "", out

    return run


@pytest.fixture()
def make_results() -> Callable[..., Path]:
    """``make_results(path, ids, source="simulated")``: a small valid results folder,
    one request per id (TTFT 1 s, E2E 2 s)."""
    return _make_results


def _make_results(path: Path, ids: list[str], source: str = "simulated") -> Path:
    import pandas as pd

    from kvsim.metrics.records import REQUEST_COLUMNS
    from kvsim.metrics.results import COLUMNS, Results

    frames = {name: pd.DataFrame([], columns=list(cols)) for name, cols in COLUMNS.items()}
    rows = [{c: 0 for c in REQUEST_COLUMNS} | {"request_id": r, "session_id": r, "member": "m",
            "kind": "chat", "ttft_s": 1.0, "e2e_s": 2.0, "failed": False,
            "failure_reason": ""} for r in ids]
    frames["requests"] = pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))
    res = Results(**frames, summary={"requests": len(ids)}, scenario={"name": "t"},
                  scenario_hash="abc", source=source)
    return res.save(path)
