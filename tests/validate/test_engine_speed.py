"""Serving engines' own speed figures (kvsim.validate.engine_speed): the layout is
detected, every row is replayed or skipped with its reason, and a replay through the
simulator lands where the latency model's own steps say."""
import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvsim.api import simulate
from kvsim.cli import cli
from kvsim.config.catalog import load_gpu, load_model
from kvsim.latency.base import BatchShape
from kvsim.latency.factory import make_latency_model
from kvsim.scenario import resolve_scenario
from kvsim.validate.engine_speed import EngineSpeed, engine_speed_row, read_engine_speed
from kvsim.validate.names import with_file_format
from kvsim.validate.records import Skipped
from kvsim.validate.run import read_files, validate
from kvsim.validate.shared import layout, read_shared_csv

FILE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "vllm-speed" / \
    "vllm-speed.csv"


def _replay(scenario, sessions):
    return simulate(scenario, sessions=sessions).summary


@pytest.fixture(scope="module")
def checked():
    meas, skipped = read_shared_csv(FILE.read_text(encoding="utf-8"), FILE.name)
    v = validate(meas, replay=_replay)
    return v, skipped + v.skipped


def test_the_layout_is_told_from_speed_vs_load():
    head = ["id", "engine", "gpu", "model", "metric", "value", "unit"]
    assert layout(head) == "speed-vs-load"
    assert layout([*head, "input_len", "output_len", "batch_or_concurrency"]) == "engine-speed"


def test_every_published_row_is_replayed_or_skipped_with_its_reason(checked):
    v, skipped = checked
    reasons = {s.id: s.reason for s in skipped}
    assert len(v.rows) + len(reasons) == 40 and {r["kind"] for r in v.rows} == {"serving"}
    assert "GPTQ-INT8, which kvsim does not model" in reasons["VS006"]
    assert "--enforce-eager" in reasons["VS025"]
    # "300 prompts, request rate inf, max concurrency 4": a closed loop of 4 streams
    closed = {r["id"]: r for r in v.rows}["VS036"]
    assert (closed["metric"], closed["batch"], closed["unit"]) == ("output_tps_total", 4,
                                                                   "tokens/s")
    assert "6144-token prompt's prefill" in reasons["VS009"]
    # an unstated H100 variant: no row in the summary, kvsim's answer on each candidate
    assert reasons["VS001"].startswith("ambiguous: 'H100 (variant not stated)'")
    assert " as h100-sxm5-80gb" in reasons["VS001"] and "measured 0.236 s" in reasons["VS001"]
    a6000 = {r["id"]: r for r in v.rows}["VS027"]
    assert (a6000["gpu"], a6000["batch"], a6000["unit"]) == ("rtx-a6000", 1, "ms")
    assert a6000["notes"] == ["input length not printed: 40 tokens taken"]


def _step_s(gpu: str, model: str, fmt: str, batch: BatchShape) -> float:
    """One step of the vLLM preset's latency model on that card (kvsim.latency.factory)."""
    sc = resolve_scenario({"name": "t", "gpu": gpu, "model": model, "weights": fmt,
                           "engine": {"preset": "vllm"}, "workload": {}})
    return make_latency_model(sc).step_time_s(batch)


def test_a_replay_lands_on_the_latency_models_own_steps():
    # one stream: the median gap is a one-sequence decode step mid-answer
    one = EngineSpeed("t1", "vllm", "rtx-a6000", "qwen2.5-7b", "bf16", 40, True, 53, 1,
                      "tpot_ms_median", 21.9)
    row = engine_speed_row(one, _replay)
    step = _step_s("rtx-a6000", "qwen2.5-7b", "bf16", BatchShape(decode_context=(66,)))
    assert row["predicted"] == pytest.approx(1000 * step, rel=0.01)
    # a bench-latency batch: its prompts in one step, then 31 decode steps of the batch
    lat = EngineSpeed("t2", "vllm", "rtx-4090", "llama-3.1-8b", "bf16", 256, True, 32, 4,
                      "avg_latency_s", 0.3)
    prefill = _step_s("rtx-4090", "llama-3.1-8b", "bf16",
                      BatchShape(prefill_tokens=(256,) * 4, prefill_context=(0,) * 4))
    decode = _step_s("rtx-4090", "llama-3.1-8b", "bf16", BatchShape(decode_context=(272,) * 4))
    assert engine_speed_row(lat, _replay)["predicted"] == pytest.approx(prefill + 31 * decode,
                                                                         rel=0.03)
    # without a simulator (validate's own callers: calibrate, the fit) it is skipped
    assert "replays it through the simulator" in engine_speed_row(lat, None).reason


@pytest.mark.parametrize(("change", "said"), [
    ({"batch_or_concurrency": "0"}, "output_len and batch_or_concurrency must be counts"),
    ({"batch_or_concurrency": "100000"}, "batch_or_concurrency 100000: at most 4096"),
    ({"value": "fast"}, "value 'fast': a positive number expected"),
    ({"unit": "s"}, "unit 's' of tpot_ms_median: 'ms' expected"),
    ({"gpu": "2x NVIDIA GeForce RTX 3090"}, "2 GPUs: kvsim replays one card's rows"),
    ({"engine": "TensorRT-LLM"}, "names none of kvsim's presets"),
    ({"model": "Some-Unknown-Model-7B"}, "not in the catalogue"),
    ({"metric": "output_tps_total", "unit": "tokens/s"},
     "output_tps_total of a run whose number of requests is not stated"),
    ({"settings": "1,000,000 prompts"}, "1000000 requests in all: at most 65536"),
])
def test_a_bad_row_is_skipped_naming_what_is_wrong(change, said):
    row = {"id": "x", "engine": "vllm bench serve", "gpu": "RTX 4090",
           "model": "Qwen/Qwen2.5-7B-Instruct", "weight_format": "bf16", "input_len": "128",
           "output_len": "128", "batch_or_concurrency": "4", "metric": "tpot_ms_median",
           "value": "20", "unit": "ms", "settings": ""}
    assert isinstance(read_engine_speed(row), EngineSpeed)
    got = read_engine_speed({**row, **change})
    assert isinstance(got, Skipped) and said in got.reason


def test_calibrate_bench_leaves_engine_rows_out_with_the_reason():
    speed, skipped, problems = read_files([FILE])
    assert speed == [] and problems == []
    assert any("serving engine's speed figure" in s.reason for s in skipped)


def test_the_command_prints_the_serving_table_and_json():
    out = CliRunner().invoke(cli, ["validate", str(FILE)])
    assert out.exit_code == 0 and "predicted vs measured (serving engines, replayed)" in out.output
    js = json.loads(CliRunner().invoke(cli, ["validate", str(FILE), "--json"]).output)
    assert {(s["kind"], s["backend"]) for s in js["summary"]} == {("serving", "vllm")}


def test_naming_the_card_replays_a_row_whose_variant_is_not_stated():
    meas, _ = read_shared_csv(FILE.read_text(encoding="utf-8"), FILE.name)
    h100 = [m for m in meas if m.id == "VS001"]
    v = validate(h100, gpu=load_gpu("h100-sxm5-80gb"), replay=_replay)
    assert v.skipped == [] and v.rows[0]["gpu"] == "h100-sxm5-80gb"
    # the answer the ambiguous row's reason gave for that candidate
    unnamed = validate(h100, replay=_replay).skipped[0].reason
    assert f"{v.rows[0]['predicted']:,.3g} s as h100-sxm5-80gb" in unnamed


def test_a_closed_loop_sends_each_stream_s_next_request_as_its_last_one_ends():
    seen = {}

    def spy(scenario, sessions):
        seen["sessions"], seen["summary"] = sessions, _replay(scenario, sessions)
        return seen["summary"]

    m = EngineSpeed("t3", "vllm", "rtx-4090", "llama-3.1-8b", "bf16", 64, True, 16, 3,
                    "output_tps_total", 100.0, requests=10)
    row = engine_speed_row(m, spy)
    ss, summary = seen["sessions"], seen["summary"]
    assert [len(s.turns) for s in ss] == [4, 3, 3] and {s.history for s in ss} == {"none"}
    assert all(t.start_s is None and t.think_s == 0 for s in ss for t in s.turns[1:])
    # every one of the ten requests answered, over the run's whole time
    assert (summary["requests"], summary["output_tokens"]) == (10, 160)
    assert row["predicted"] == pytest.approx(160 / summary["sim_time_s"], rel=1e-9)


def test_a_row_naming_no_card_or_model_takes_them_from_the_flags():
    # VS001 with its gpu and model cells left empty: kept, and replayed on what --gpu and
    # --model name (the model's format from --model where the row has none either)
    text = FILE.read_text(encoding="utf-8").splitlines()
    head, row = text[0], next(r for r in text if r.startswith("VS001,"))
    cells = next(csv.reader([row]))
    cells[3] = cells[4] = cells[5] = ""  # gpu, model, weight_format
    buf = io.StringIO()
    csv.writer(buf).writerow(cells)
    meas, skipped = read_shared_csv(head + "\n" + buf.getvalue(), "mine.csv")
    assert skipped == [] and (meas[0].gpu, meas[0].model, meas[0].weights) == ("", "", "")
    v = validate(meas, replay=_replay)
    assert v.rows == [] and v.skipped[0].reason.startswith("no card printed: name it with --gpu")
    named = with_file_format(meas, "llama-3.1-8b-bf16")
    v = validate(named, gpu=load_gpu("h100-sxm5-80gb"), model=load_model("llama-3.1-8b"),
                 replay=_replay)
    assert v.skipped == [] and (v.rows[0]["gpu"], v.rows[0]["model"], v.rows[0]["weights"]) == \
        ("h100-sxm5-80gb", "llama-3.1-8b", "bf16")
