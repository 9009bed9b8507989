"""Shared fixtures: the real public traces (imported once per test session).

The traces live in ../shared/traces beside the repo and are always present (CI clones
shared/ beside it): a missing file is a broken checkout and fails, never skips.
"""

from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
MOONCAKE = (TRACES / "mooncake-fast25" / "synthetic_trace.jsonl").resolve()
AZURE = (TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv").resolve()


@pytest.fixture(scope="session")
def mooncake_sessions():
    assert MOONCAKE.is_file(), f"shared trace missing: {MOONCAKE}"
    from kvsim.workload.importers import import_mooncake
    return list(import_mooncake(MOONCAKE)[1])


@pytest.fixture(scope="session")
def azure_sessions():
    assert AZURE.is_file(), f"shared trace missing: {AZURE}"
    from kvsim.workload.importers import import_azure
    return list(import_azure(AZURE)[1])


@pytest.fixture(scope="session")
def mooncake_path():
    assert MOONCAKE.is_file(), f"shared trace missing: {MOONCAKE}"
    return MOONCAKE


@pytest.fixture(scope="session")
def azure_path():
    assert AZURE.is_file(), f"shared trace missing: {AZURE}"
    return AZURE
