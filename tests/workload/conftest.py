"""Shared fixtures: the real public traces (imported once per test session)."""

from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
MOONCAKE = (TRACES / "mooncake-fast25" / "synthetic_trace.jsonl").resolve()
AZURE = (TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv").resolve()


@pytest.fixture(scope="session")
def mooncake_sessions():
    if not MOONCAKE.is_file():
        pytest.skip("shared Mooncake trace not present")
    from kvsim.workload.importers import import_mooncake
    return list(import_mooncake(MOONCAKE)[1])


@pytest.fixture(scope="session")
def azure_sessions():
    if not AZURE.is_file():
        pytest.skip("shared Azure trace not present")
    from kvsim.workload.importers import import_azure
    return list(import_azure(AZURE)[1])


@pytest.fixture(scope="session")
def mooncake_path():
    if not MOONCAKE.is_file():
        pytest.skip("shared Mooncake trace not present")
    return MOONCAKE


@pytest.fixture(scope="session")
def azure_path():
    if not AZURE.is_file():
        pytest.skip("shared Azure trace not present")
    return AZURE
