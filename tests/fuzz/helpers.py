"""Settings shared by the fuzz tests (tests/fuzz/conftest.py has the CLI fixture)."""

from hypothesis import HealthCheck, settings

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
"""The settings of every fuzz test; each adds its own ``max_examples``."""
