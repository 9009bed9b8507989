"""Interactive, self-contained Plotly reports (docs/design/DESIGN.md §3.7).

Pure data functions (:mod:`.data_run`, :mod:`.data_plan`, :mod:`.card`), one Plotly
function per figure (:mod:`.figures_run`, :mod:`.figures_plan`), peak-preserving
down-sampling (:mod:`.downsample`) and the page (:mod:`.page`).
"""

from kvsim.report.page import build_report, write_report

__all__ = ["build_report", "write_report"]
