"""Labels that tell several runs apart in one report (pure; no Plotly here).

Runs with distinct scenario names are labelled by name.  Runs that share a name (the
same scenario run with different ``--set`` overrides) are labelled by what differs
between their resolved scenarios (``scenario.json``): the differing dotted keys,
shortened to their last part (``window_tokens=2048``, ``parallel=2``), after the name.
A profile or policy that differs as a whole is shown by its ``name`` / ``kind``
(``gpu=rtx-4090``, ``policies=sliding_window``, ``policies=none``), followed by the
keys that differ among the runs that have the same one.  Runs whose scenarios are
identical fall back to their results folder name; any label still repeated gets
`` (2)``, `` (3)``…, so labels are always unique.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import PurePath
from typing import Any

from kvsim.report.data_run import run_config

MAX_PARTS_CHARS = 60  # differing keys shown after the name, then ", …"
MAX_VALUE_CHARS = 18
IGNORED = frozenset({"description", "notes", "source", "display_name", "hf_repo"})
SUMMARIZED_BY = ("name", "kind")  # a sub-dict with one of these is shown by its value
_MISSING = object()


def flatten(doc: Any, prefix: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(leaves, summaries)`` of a resolved scenario.

    ``leaves``: dotted key → scalar (or list of scalars), lists of dicts indexed
    (``policies.0.kind``); descriptive text keys (:data:`IGNORED`) and empty lists or
    dicts left out (no policies reads as ``policies=none``).
    ``summaries``: dotted path of each nested dict that has a ``name`` or ``kind``
    → that value (``gpu`` → ``rtx-4090``, ``policies.0`` → ``sliding_window``).
    """
    leaves: dict[str, Any] = {}
    summaries: dict[str, Any] = {}
    items: Any = doc.items() if isinstance(doc, dict) else enumerate(doc)
    for key, value in items:
        if (key in IGNORED and not (prefix == "" and key == "source")) or value in ([], {}):
            continue  # NOTE: a top-level "source" is the run's own (simulated / measured)
        path = f"{prefix}{key}"
        nested = isinstance(value, dict) or (isinstance(value, list) and any(
            isinstance(v, dict | list) for v in value))
        if not nested:
            leaves[path] = value
            continue
        if isinstance(value, dict):
            tag = next((value[k] for k in SUMMARIZED_BY if k in value), _MISSING)
            if tag is not _MISSING:
                summaries[path] = tag
        sub_leaves, sub_summaries = flatten(value, f"{path}.")
        leaves.update(sub_leaves)
        summaries.update(sub_summaries)
    return leaves, summaries


def _differs(values: Sequence[Any]) -> bool:
    return len({_key(v) for v in values}) > 1


def _key(value: Any) -> str:
    return "\0missing" if value is _MISSING else json.dumps(value, sort_keys=True, default=str)


def _under(path: str, root: str) -> bool:
    return path.startswith(root + ".")


def differing_parts(configs: Sequence[dict[str, Any]]) -> list[list[tuple[str, Any]]]:
    """Per config, the ``(dotted key, value)`` pairs that tell it from the others.

    A nested dict whose ``name``/``kind`` differs is one pair (value ``None`` where a
    config lacks it); below it, only keys that differ among the configs with the
    same ``name``/``kind`` are listed.  A key is compared among the configs that hold
    it: scenarios are saved resolved, so under one ``name``/``kind`` a key is missing
    only from a folder an older kvsim wrote (before the key existed), not a difference.
    """
    flat = [flatten(c) for c in configs]
    leaves = [f[0] for f in flat]
    tags = [f[1] for f in flat]
    tag_paths = sorted({p for t in tags for p in t})
    roots = [p for p in tag_paths if _differs([t.get(p, _MISSING) for t in tags])]
    roots = [p for p in roots if not any(_under(p, r) for r in roots)]
    keys = sorted({k for lv in leaves for k in lv})
    out = []
    for i in range(len(configs)):
        parts = [(r, tags[i].get(r)) for r in roots]
        for k in keys:
            root = next((r for r in roots if _under(k, r)), None)
            if root is None:
                peers = list(range(len(configs)))
            elif k in leaves[i] and k.rsplit(".", 1)[1] not in SUMMARIZED_BY:
                peers = [j for j in range(len(configs)) if _key(tags[j].get(root, _MISSING))
                         == _key(tags[i].get(root, _MISSING))]
            else:
                continue
            holding = [j for j in peers if k in leaves[j]]
            if i not in holding:
                continue
            if _differs([leaves[j][k] for j in holding]):
                parts.append((k, leaves[i].get(k, _MISSING)))
        out.append(parts)
    return out


def short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Each dotted key as its shortest ending (list indexes dropped) that no other key
    ends with (``parallel``, ``a.kind``); the whole key where even that is ambiguous."""
    words = {k: [w for w in k.split(".") if not w.isdigit()] or [k] for k in keys}
    out = {}
    for k, w in words.items():
        out[k] = k
        for depth in range(1, len(w) + 1):
            tail = w[-depth:]
            if not any(o[-depth:] == tail for k2, o in words.items() if k2 != k):
                out[k] = ".".join(tail)
                break
    return out


def show_value(key: str, value: Any) -> str:
    """A value in a few characters: bytes in GiB/MiB, floats to 4 digits, unset/none."""
    if value is _MISSING:
        return "unset"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float) and key.endswith("_bytes") and value >= 2**20:
        gib = value / 2**30
        return f"{gib:.3g} GiB" if gib >= 1 else f"{value / 2**20:.3g} MiB"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 1] + "…"


def _text(parts: list[tuple[str, Any]], short: dict[str, str]) -> str:
    """``key=value, …`` up to :data:`MAX_PARTS_CHARS` (at least one pair), then "…"."""
    shown: list[str] = []
    for k, v in parts:
        item = f"{short[k]}={show_value(k, v)}"
        if shown and len(", ".join([*shown, item])) > MAX_PARTS_CHARS:
            return ", ".join([*shown, "…"])
        shown.append(item)
    return ", ".join(shown)


def _folder(run: Any) -> str:
    path = str(getattr(run, "path", "") or "")
    return PurePath(path).name if path else ""


def run_labels(runs: Sequence[Any]) -> list[str]:
    """One unique, short label per run (module doc)."""
    configs = [run_config(r)[0] for r in runs]
    names = [str(c.get("name") or "run") for c in configs]
    labels = list(names)
    for name in dict.fromkeys(names):
        group = [i for i, n in enumerate(names) if n == name]
        if len(group) < 2:
            continue
        docs = [{**configs[i], "source": _source(runs[i])} for i in group]
        parts = differing_parts(docs)
        short = short_keys(sorted({k for p in parts for k, _ in p}))
        for i, p in zip(group, parts):
            labels[i] = f"{name} · {_text(p, short)}" if p else (_folder(runs[i]) or name)
    return _unique(labels)


def _source(run: Any) -> str:
    meta = getattr(run, "meta", None) or {}
    return str(meta.get("source") or getattr(run, "source", "") or "simulated")


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
