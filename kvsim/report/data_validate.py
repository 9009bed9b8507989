"""Data for the predicted-vs-measured figure of ``kvsim validate`` (no Plotly here).

:func:`validation_points` groups prediction rows (kvsim.validate.run) by backend:
measured and predicted tokens/s, and a hover label per point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvsim.validate.records import test_name


def validation_points(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    """Backend -> {"measured", "predicted", "label"} lists, backends in sorted order."""
    out: dict[str, dict[str, list[Any]]] = {}
    for r in rows:
        g = out.setdefault(str(r["backend"]), {"measured": [], "predicted": [], "label": []})
        g["measured"].append(float(r["measured_tps"]))
        g["predicted"].append(float(r["predicted_tps"]))
        test = test_name(str(r["metric"]), int(r["n_prompt"]), int(r["n_gen"]))
        g["label"].append(f"{r['id']}: {r['gpu']} · {r['model']} {r['weights']} · {test}"
                          f" d{r['depth']} ×{r['batch']} · {100 * float(r['rel_err']):+.1f} %")
    return dict(sorted(out.items()))
