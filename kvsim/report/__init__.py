"""Interactive, self-contained Plotly reports (docs/design/DESIGN.md §3.7).

Pure data functions (:mod:`.data_run`, :mod:`.data_plan`, :mod:`.card`), one Plotly
function per figure (:mod:`.figures_run`, :mod:`.figures_plan`), peak-preserving
down-sampling (:mod:`.downsample`) and the page (:mod:`.page`).
"""

from typing import Any

__all__ = ["build_report", "write_report"]


def __getattr__(name: str) -> Any:
    """``build_report`` and ``write_report``, imported on first use.

    NOTE: lazily, so the pure data modules (:mod:`.card`: a run's description for
    ``kvsim simulate --set``) do not import Plotly with the package."""
    if name in __all__:
        from kvsim.report import page

        return getattr(page, name)
    raise AttributeError(f"module 'kvsim.report' has no attribute {name!r}")
