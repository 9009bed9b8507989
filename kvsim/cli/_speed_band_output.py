"""The speed model's band as commands say it (kvsim.latency.speed_band): the note a
fitted-roofline ``simulate`` prints (:func:`speed_note`) and ``plan`` / ``compare --gpus``
print per backend (:func:`bands_note`), and ``simulate --speed-band``: the scenario rerun
at both ends (:func:`band_runs`), a verdict line, a table and speed_band.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kvsim.cli._output import output_errors
from kvsim.errors import InputError
from kvsim.latency.speed_band import ENDS, SHARE, speed_band

if TYPE_CHECKING:
    from kvsim.latency.speed_band import SpeedBand

# (summary key, label, kind): what the band's runs are compared on
BAND_METRICS = (("ttft_p95_s", "TTFT p95", "latency"), ("itl_p95_s", "ITL p95", "latency"),
                ("e2e_p95_s", "E2E p95", "latency"), ("failed_requests", "failed", "count"),
                ("preemptions", "preemptions", "count"))


def speed_note(sc: Any) -> str:
    """How far the scenario's speed model ran from cards it did not see, in one line
    (``""`` where it has no band: kvsim.latency.speed_band)."""
    band = speed_band(sc)
    if band is None:
        return ""
    end = sc.latency.speed_band
    if end != "none":
        decode, prompt = band.factors(end)
        return (f"speed model: this run is at the {end} end of its {band.backend} band "
                f"(latency.speed_band): decode steps x{decode:.3g}, prompt steps "
                f"x{prompt:.3g} the predicted time")
    return (f"speed model: cards left out of its {band.backend} fit ran, {SHARE} of "
            f"{band.decode_rows} decode and {band.prompt_rows} prompt measurements, at "
            f"{band.speed_words()} (hardware_profiles/speed/constants.yaml)"
            f"{engine_caveat([sc])}{dp4a_caveat(sc, band.backend)}"
            f"{loop_caveat(sc, band.backend)}; --speed-band reruns "
            "this scenario at both ends, kvsim "
            f"calibrate {_calibrator(sc)} on your card replaces the estimate with "
            "measurements")


def _calibrator(sc: Any) -> str:
    """The ``kvsim calibrate`` command that measures this scenario's engine's speed:
    llama-bench for llama.cpp and Ollama, torch kernels for the paged engines."""
    from kvsim.engines.config import SlotEngineConfig

    return "bench" if isinstance(sc.engine, SlotEngineConfig) else "kernels"


def engine_caveat(scenarios: Any) -> str:
    """``""``, or what the band leaves out for engines other than llama.cpp and Ollama:
    the constants are fitted on llama.cpp measurements (kvsim.latency.backend)."""
    from kvsim.engines.config import SlotEngineConfig

    other = sorted({sc.engine.preset for sc in scenarios
                    if not isinstance(sc.engine, SlotEngineConfig)})
    if not other:
        return ""
    return (f"; those measurements are llama.cpp's: {' and '.join(other)}'s own kernels are "
            "in none of them (published vLLM runs decoded 16-bit weights 15-26 % faster than "
            "kvsim prices them on an A6000 and A100, within 6 % on an RTX 4090; 4-bit and "
            "FP8 within 16 %: docs/design/vllm-speed.md)")


def on_dp4a_path(sc: Any, backend: str) -> bool:
    """Whether ``sc``'s card multiplies its quantized weights on Pascal's dp4a path."""
    from kvsim.latency.backend import format_family
    from kvsim.latency.dp4a import dp4a_path

    return dp4a_path(sc.gpu, backend, format_family(sc.weights))


def dp4a_words() -> str:
    """What the band leaves out on Pascal's dp4a path: its one constant rests on a
    single card (kvsim.latency.dp4a)."""
    from kvsim.latency.dp4a import HELD_OUT_MEDIAN_ABS_ERR

    return ("priced from one card (Tesla P40): held-out Pascal prompts ran "
            f"{HELD_OUT_MEDIAN_ABS_ERR * 100:.0f} % off (median), but the band holds no second "
            "Pascal card")


def dp4a_caveat(sc: Any, backend: str) -> str:
    """``""``, or :func:`dp4a_words` for a card whose quantized layers take Pascal's dp4a
    path."""
    if not on_dp4a_path(sc, backend):
        return ""
    return "; this card's quantized layers take Pascal's dp4a path, " + dp4a_words()


def loop_caveat(sc: Any, backend: str) -> str:
    """``""``, or, for a card whose MoE layers loop over their experts on the host
    (kvsim.latency.expert_loop), from how many tokens and what its price rests on."""
    from kvsim.latency.backend import format_family
    from kvsim.latency.expert_loop import loop_tokens

    start = loop_tokens(sc.gpu, backend, format_family(sc.weights), sc.model)
    if not start:
        return ""
    return (f"; this card runs a step of {start}+ tokens through the MoE layers' host loop "
            "over the experts, priced from two Volta prompts of one source, outside the band")


def bands_note(scenarios: dict[str, Any]) -> str:
    """The speed model's band for each backend among ``scenarios`` (name → scenario: the
    cards a plan or a comparison ran on), in one line; ``""`` when none has one.  Where
    the scenarios run at an end of it (``latency.speed_band``), the line says that."""
    groups: dict[tuple[str, str], tuple[SpeedBand, list[str]]] = {}
    pascal: list[str] = []  # NOTE: the scenarios whose card is on Pascal's dp4a path
    for name, sc in scenarios.items():
        band = speed_band(sc)
        if band is not None:
            key = (band.backend, sc.latency.speed_band)
            groups.setdefault(key, (band, []))[1].append(name)
            if on_dp4a_path(sc, band.backend):
                pascal.append(name)
    if not groups:
        return ""
    if all(end != "none" for _, end in groups):
        return "speed model: run at " + "; ".join(
            f"the {end} end of its band on {backend} ({', '.join(names)}: decode steps "
            f"x{band.factors(end)[0]:.3g}, prompt steps x{band.factors(end)[1]:.3g} the "
            "predicted time)" for (backend, end), (band, names) in groups.items())
    parts = [f"{band.ratio_words()} on {backend} ({', '.join(names)})"
             for (backend, _), (band, names) in groups.items()]
    dp4a = (f"; {', '.join(pascal)}: quantized layers on Pascal's dp4a path, "
            + dp4a_words()) if pascal else ""
    return (f"speed model: cards left out of its fit ran, {SHARE}, at " + "; ".join(parts)
            + f" of kvsim's speed{engine_caveat(scenarios.values())}{dp4a}: a p95 near its "
            "target may land on either side (kvsim simulate --speed-band reruns a setting "
            "at both ends; --set latency.speed_band=slow plans for the slow one)")


def check_band(sc: Any) -> SpeedBand:
    """The scenario's band for ``--speed-band``; InputError (before any run) without one."""
    band = speed_band(sc)
    if band is not None and sc.latency.speed_band != "none":
        raise InputError("--speed-band", f"latency.speed_band {sc.latency.speed_band}",
                         "latency.speed_band none: the flag reruns a scenario as "
                         "predicted at both ends")
    if band is None:
        lat = sc.latency
        what = (f"latency.kind {lat.kind}" if lat.kind != "roofline" else
                f"latency.rates {lat.rates}" if lat.rates != "backend" else
                "a backend whose fitted constants carry no error percentiles")
        raise InputError("--speed-band", what,
                         "needs a roofline with fitted backend constants (latency.kind "
                         "roofline, rates backend on CUDA, ROCm, Vulkan or Metal); a "
                         "calibrated model is the card's own measurements, with no band")
    return band


def _text(value: Any, kind: str) -> str:
    from kvsim.config.units import format_latency

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format_latency(float(value)) if kind == "latency" else f"{int(value):,}"


def at_end(sc: Any, end: str) -> Any:
    """``sc`` at one end of its speed band (``latency.speed_band``)."""
    return sc.model_copy(update={"latency": sc.latency.model_copy(
        update={"speed_band": end})})


def band_runs(sc: Any) -> dict[str, dict[str, Any]]:
    """The scenario's summary at each end of its band, only the compared metrics."""
    from kvsim.api import simulate as run

    out = {}
    for end in ENDS:
        summary = run(at_end(sc, end)).summary
        out[end] = {key: summary.get(key) for key, _, _ in BAND_METRICS}
    return out


def band_doc(band: SpeedBand, main: dict[str, Any], runs: dict[str, dict[str, Any]]
             ) -> dict[str, Any]:
    """speed_band.json: the band's factors and each metric as predicted and at each end."""
    factors = {end: dict(zip(("decode", "prompt"), band.factors(end))) for end in ENDS}
    return {"backend": band.backend, "step_time_factors": factors,
            "rows": {"decode": band.decode_rows, "prompt": band.prompt_rows},
            "metrics": {key: {"predicted": main.get(key), **{e: runs[e][key] for e in ENDS}}
                        for key, _, _ in BAND_METRICS}}


def band_line(band: SpeedBand, runs: dict[str, dict[str, Any]]) -> str:
    """The verdict's line for a run's band (its report shows it too): TTFT and ITL p95
    and failures at the fast and the slow end."""
    def ends(key: str, kind: str) -> str:
        return " … ".join(_text(runs[end][key], kind) for end in ENDS)
    return (f"speed band ({SHARE} cards left out of the {band.backend} fit: "
            f"{band.ratio_words()} kvsim's speed): TTFT p95 {ends('ttft_p95_s', 'latency')}, "
            f"ITL p95 {ends('itl_p95_s', 'latency')}, failed "
            f"{ends('failed_requests', 'count')} from the fast end to the slow one")


def report_speed_band(band: SpeedBand, res: Any, out_dir: Path,
                      runs: dict[str, dict[str, Any]]) -> None:
    """Print each metric of a run (``res``) as predicted and at each end of its ``band``
    (``runs``: :func:`band_runs`), and write ``out_dir/speed_band.json``."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"speed band: cards left out of the {band.backend} fit ran at "
                  f"{band.speed_words()} ({SHARE})")
    for col in ("metric", "as predicted", "fast end", "slow end"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for key, label, kind in BAND_METRICS:
        table.add_row(label, _text(res.summary.get(key), kind),
                      *(_text(runs[end][key], kind) for end in ENDS))
    Console().print(table)
    path = out_dir / "speed_band.json"
    with output_errors("--output", path):
        path.write_text(json.dumps(band_doc(band, dict(res.summary), runs), indent=2) + "\n",
                        encoding="utf-8")
    click.echo(f"speed band: {path}")
