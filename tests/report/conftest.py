"""Fixtures for the report tests; the hand-built runs live in report_helpers.py."""

from __future__ import annotations

import pytest
from report_helpers import Run, make_run


@pytest.fixture
def run() -> Run:
    return make_run()
