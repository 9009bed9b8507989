"""Shared by the fuzz suite: run the real CLI in-process and check the user-error contract.

The contract (docs/cli.md, kvsim.cli.main): a run exits 0, or exits 2 with exactly one
``error: `` line on stderr, its last line; never a traceback, never another exit code.

NOTE: every fuzz test is deterministic (``derandomize=True``) so CI sees the same cases
each run; the examples per test are few enough that the suite stays within ~3 minutes on
two cores.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import pytest
from hypothesis import event
from hypothesis.control import currently_in_test_context


@pytest.fixture()
def clean_exit(capsys) -> Callable[[list[str]], tuple[int, str, str]]:
    """``clean_exit(argv)``: run ``kvsim ARGV`` in-process, assert the contract and return
    (exit code, stdout, stderr).  An exception escaping :func:`kvsim.cli.main` is what a
    user sees as a traceback: it fails the test with that traceback."""
    from kvsim.cli import main

    def run(argv: list[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            main([str(a) for a in argv])
            code = 0
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code
        except BaseException as exc:
            _, err = capsys.readouterr()
            raise AssertionError(f"kvsim {argv!r} raised {type(exc).__name__}: {exc}\n"
                                 f"{traceback.format_exc()}\nstderr: {err}") from exc
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err, (argv, err)
        errors = [ln.strip() for ln in err.splitlines() if ln.startswith("error: ")]
        if code == 0:
            assert not errors, (argv, err)
        else:
            assert code == 2, (argv, code, err)
            assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], (argv, err)
        if currently_in_test_context():  # --hypothesis-show-statistics: cases that ran through
            event(f"exit {code}")
        return code, out, err

    return run
