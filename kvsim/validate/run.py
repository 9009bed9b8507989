"""``kvsim validate``: read measurement files, predict every row, summarise the errors.

:func:`read_inputs` reads each file in whatever layout it is (the three of
``docs/reference/measurements``, llama-bench's json/jsonl/csv/markdown, llama-batched-bench's
table, ``ollama ps`` as its table or JSON, an engine's own start-up log); a file that
cannot be read is a problem line, not the end of the run.
:func:`validate` predicts each speed measurement (:mod:`kvsim.validate.predict`) and each
start-up memory log (:mod:`kvsim.validate.memlog_predict`) and each engine speed figure
(:mod:`kvsim.validate.engine_speed`: kind ``serving``, replayed through the simulator)
and returns a :class:`Validation`: one row per prediction, one per skipped measurement
with the reason, and the summary per (kind, backend, metric) — kind ``memory`` for the
memory logs, backend the engine, metric ``kv_tokens``, ``kv_bytes``, … or ``startup``.

NOTE: relative error = (predicted − measured) / measured; the summary's ``median`` and
``p90`` are of its absolute value, ``median_rel_err`` keeps the sign (negative: kvsim
predicts too slow, or too little memory).  A ``startup`` row's error is 0 (kvsim agrees
whether the engine started) or 1 (it does not).
NOTE: :func:`read_files` (``kvsim calibrate bench``, ``scripts/fit_speed.py``) keeps the
llama-bench speed measurements only and lists memory-log and engine-speed rows as
skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kvsim.config.catalog import load_gpu
from kvsim.config.gpu_names import resolve_gpu
from kvsim.config.specs import GpuSpec, ModelSpec
from kvsim.errors import InputError
from kvsim.latency.backend import SpeedConstants
from kvsim.validate.bench_printout import read_bench_printout
from kvsim.validate.box_predict import BoxSetup, box_setup, box_tps, several_gpus
from kvsim.validate.engine_speed import (
    EngineSpeed,
    Replay,
    engine_speed_row,
    read_engine_speed_rows,
)
from kvsim.validate.llamabench import read_bench
from kvsim.validate.memlog_predict import memory_rows
from kvsim.validate.memlogs import MemoryMeasurement
from kvsim.validate.ollama_ps import read_ollama_ps
from kvsim.validate.predict import Setup, predicted_tps, setup_for
from kvsim.validate.records import Measurement, Skipped
from kvsim.validate.shared import read_shared_csv
from kvsim.validate.startup_paste import read_startup_paste


@dataclass
class Validation:
    """Predicted-vs-measured rows, skipped rows with reasons, problems reading files."""

    rows: list[dict[str, object]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> list[dict[str, object]]:
        """Per (kind, backend, metric): n, median and p90 |rel err|, median rel err."""
        groups: dict[tuple[str, str, str], list[float]] = {}
        for r in self.rows:
            key = (str(r["kind"]), str(r["backend"]), str(r["metric"]))
            groups.setdefault(key, []).append(float(r["rel_err"]))  # type: ignore[arg-type]
        out = []
        for (kind, backend, metric), errs in sorted(groups.items()):
            e = np.asarray(errs)
            a = np.abs(e)
            out.append({"kind": kind, "backend": backend, "metric": metric, "n": len(e),
                        "median_abs_rel_err": _quantile(a, 0.5),
                        "p90_abs_rel_err": _quantile(a, 0.9),
                        "median_rel_err": _quantile(e, 0.5)})
        return out

    def to_json(self) -> dict[str, object]:
        return {"rows": self.rows, "summary": self.summary(),
                "skipped": [{"id": s.id, "reason": s.reason} for s in self.skipped],
                "problems": self.problems}


Read = Measurement | MemoryMeasurement | EngineSpeed
"""What a measurement file holds, row by row."""


def read_file(path: Path) -> tuple[list[Read], list[Skipped]]:
    """The measurements in one file (InputError when it is in no known layout)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("FILE", str(path), f"a readable text file ({exc.__class__.__name__})")
    got = read_shared_csv(text, path.name)
    if got is not None:
        return got
    if (ps := read_ollama_ps(text, path.name)) is not None:
        return list(ps), []
    if (printout := read_bench_printout(text, path.name)) is not None:
        speed, skipped = read_engine_speed_rows(printout[0], path.name)
        return list(speed), printout[1] + skipped
    try:
        meas, skipped = read_bench(text, origin=path.name)
    except InputError:
        if (log := read_startup_paste(text, path.name)) is not None:
            return list(log), []
        raise
    return list(meas), skipped


def read_inputs(paths: list[Path]) -> tuple[list[Read], list[Skipped], list[str]]:
    """Every measurement of every file, skipped rows, and one problem line per file that
    could not be read."""
    meas: list[Read] = []
    skipped: list[Skipped] = []
    problems: list[str] = []
    for p in paths:
        try:
            m, s = read_file(p)
        except InputError as exc:
            problems.append(exc.one_line())
            continue
        meas += m
        skipped += s
    return meas, skipped, problems


def read_files(paths: list[Path]) -> tuple[list[Measurement], list[Skipped], list[str]]:
    """The speed measurements of :func:`read_inputs` (module NOTE)."""
    got, skipped, problems = read_inputs(paths)
    speed = [m for m in got if isinstance(m, Measurement)]
    skipped += [Skipped(m.id, "start-up memory figures, not speeds: `kvsim validate` "
                        "compares them with kvsim's load-time memory layout")
                for m in got if isinstance(m, MemoryMeasurement)]
    skipped += [Skipped(m.id, "a serving engine's speed figure, not llama-bench's: `kvsim "
                        "validate` replays it through the simulator")
                for m in got if isinstance(m, EngineSpeed)]
    return speed, skipped, problems


def prediction_row(m: Measurement, s: Setup | BoxSetup, pred: float) -> dict[str, object]:
    """One predicted row; a box's kind is ``box``, ``box-depth`` or ``box-parallel``, so
    the summary keeps several-GPU rows apart from one card's."""
    box = isinstance(s, BoxSetup)
    kind = ("box" if m.kind == "single" else f"box-{m.kind}") if box else m.kind
    return {"id": m.id, "kind": kind, "backend": m.backend, "metric": m.metric,
            "gpu": s.gpu_label if box else s.gpu.name, "model": s.model.name, "weights": s.weight_format,
            "n_prompt": m.n_prompt, "n_gen": m.n_gen, "depth": m.depth, "batch": m.batch,
            "n_ubatch": m.n_ubatch, "flash_attn": s.flash_attn, "measured_tps": m.value, "predicted_tps": pred,
            "rel_err": (pred - m.value) / m.value}


def validate(measurements: list[Read], *,
             gpu: GpuSpec | None = None, model: ModelSpec | None = None,
             constants: SpeedConstants | None = None, replay: Replay | None = None
             ) -> Validation:
    """Predict every measurement (``gpu``/``model`` replace the names the rows carry;
    ``constants`` the shipped speed constants; ``replay`` runs the simulator for a
    serving engine's figures, which are skipped without it)."""
    v = Validation()
    for m in measurements:
        if isinstance(m, MemoryMeasurement):
            rows, skipped = memory_rows(m, gpu=gpu, model=model)
            v.rows += rows
            v.skipped += skipped
            continue
        if isinstance(m, EngineSpeed):
            if gpu is not None:   # the card named: an ambiguous one no longer is
                m = replace(m, gpu=gpu.name, ambiguous="", candidates=())
            got = engine_speed_row(m if model is None else replace(m, model=model.name), replay)
            (v.skipped if isinstance(got, Skipped) else v.rows).append(got)  # type: ignore
            continue
        if gpu is None and several_gpus(m):
            _on_a_box(v, m, model, constants)
            continue
        s = setup_for(m, gpu=gpu, model=model)
        if isinstance(s, Skipped):
            v.skipped.append(_with_candidates(s, m, model, constants) if gpu is None else s)
            continue
        v.rows.append(prediction_row(m, s, predicted_tps(m, s, constants)))
    return v


def _on_a_box(v: Validation, m: Measurement, model: ModelSpec | None,
              constants: SpeedConstants | None) -> None:
    """A several-GPU measurement's row (kvsim.validate.box_predict), or why not."""
    s = box_setup(m, model=model)
    if isinstance(s, Skipped):
        v.skipped.append(s)
        return
    try:
        v.rows.append(prediction_row(m, s, box_tps(m, s, constants)))
    except InputError as e:
        v.skipped.append(Skipped(m.id, f"kvsim cannot lay this box out: {e.one_line()}"))


def _with_candidates(s: Skipped, m: Measurement, model: ModelSpec | None,
                     constants: SpeedConstants | None) -> Skipped:
    """An ambiguous card's skipped row with what kvsim predicts on each profile the name
    fits ("…: name which one; kvsim predicts 3,247.9 t/s as tesla-v100-pcie-32gb,
    3,647.3 t/s as tesla-v100-sxm2-32gb; measured 3,042.6"): the row stays out of the
    summary, since which card ran is not known."""
    if not s.reason.startswith("ambiguous"):
        return s
    preds = []
    for slug in resolve_gpu(m.gpu).candidates:
        c = setup_for(m, gpu=load_gpu(slug), model=model)
        if not isinstance(c, Skipped):
            preds.append(f"{predicted_tps(m, c, constants):,.1f} t/s as {slug}")
    if not preds:
        return s
    return Skipped(s.id, f"{s.reason}; kvsim predicts {', '.join(preds)}; measured "
                         f"{m.value:,.1f}")


def _quantile(values: np.ndarray, q: float) -> float:
    """kvsim's one percentile definition (kvsim.metrics.summary.PERCENTILE_METHOD: the
    smallest value with at least ``q`` of them at or below it)."""
    from kvsim.metrics.summary import PERCENTILE_METHOD

    return float(np.quantile(values, q, method=PERCENTILE_METHOD))
