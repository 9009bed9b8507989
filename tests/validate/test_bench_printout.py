"""Serving benchmarks' printouts pasted into ``kvsim validate`` (kvsim.validate.
bench_printout): vLLM's ``bench serve`` block (vllm-project/vllm issue #9722), SGLang's
``bench_serving`` block (sgl-project/sglang PR #8552), ``bench latency``, several runs in
one paste, and what cannot be replayed."""
import json
from pathlib import Path

from kvsim.validate.bench_printout import read_bench_printout
from kvsim.validate.engine_speed import read_engine_speed_rows

DATA = Path(__file__).resolve().parent / "data"
VLLM = (DATA / "vllm_bench_serve.txt").read_text(encoding="utf-8")
SGLANG = (DATA / "sglang_bench_serving.txt").read_text(encoding="utf-8")


def _by_metric(text: str, origin: str = "p") -> dict[str, dict[str, str]]:
    got = read_bench_printout(text, origin)
    assert got is not None
    rows, skipped = got
    assert skipped == []
    return {r["metric"]: r for r in rows}


def test_vllms_serving_block_is_its_closed_loop():
    # 100 requests at most 10 at once; 77,700 prompt and 746 answer tokens in all
    by = _by_metric(VLLM)
    assert set(by) == {"ttft_ms_median", "tpot_ms_median", "itl_ms_median", "output_tps_total"}
    r = by["tpot_ms_median"]
    assert (r["engine"], r["input_len"], r["output_len"], r["batch_or_concurrency"]) == \
        ("vllm", "777", "7", "10")
    assert r["settings"] == "100 prompts, max concurrency 10" and r["value"] == "73.6"
    assert by["output_tps_total"]["unit"] == "tokens/s"


def test_sglangs_block_names_its_backend():
    by = _by_metric(SGLANG)
    assert set(by) == {"ttft_ms_median", "itl_ms_median", "output_tps_total"}  # no TPOT
    r = by["itl_ms_median"]
    assert (r["engine"], r["input_len"], r["output_len"], r["batch_or_concurrency"],
            r["value"]) == ("sglang", "1000", "1000", "1", "8.47")


def test_several_runs_in_one_paste_and_what_is_not_replayed():
    second = VLLM.replace("concurrency: 10", "concurrency: 20").replace("73.60", "80.00")
    rows, skipped = read_bench_printout(VLLM + "\n" + second, "p")  # type: ignore[misc]
    tpot = [r for r in rows if r["metric"] == "tpot_ms_median"]
    assert [(r["id"], r["batch_or_concurrency"], r["value"]) for r in tpot] == [
        ("p:run1:tpot_ms_median", "10", "73.6"), ("p:run2:tpot_ms_median", "20", "80.0")]
    rows, skipped = read_bench_printout(  # type: ignore[misc]
        VLLM.replace("request rate: inf", "request rate: 4.0"), "p")
    assert rows == [] and "request rate 4.0/s (Poisson arrivals)" in skipped[0].reason
    assert read_bench_printout("no benchmark here", "p") is None


def test_the_model_and_its_format_from_the_printed_arguments():
    args = "Namespace(backend='vllm', model='{}', num_prompts=100, max_concurrency=10)\n"
    plain = _by_metric(args.format("meta-llama/Llama-3.1-8B-Instruct") + VLLM)["ttft_ms_median"]
    assert (plain["model"], plain["weight_format"]) == ("meta-llama/Llama-3.1-8B-Instruct",
                                                        "bf16 (dtype auto)")
    awq = _by_metric(args.format("Qwen/Qwen2.5-7B-Instruct-AWQ") + VLLM)["ttft_ms_median"]
    assert awq["weight_format"] == ""  # the name states it: AWQ
    (meas,), skipped = read_engine_speed_rows([plain], "p")
    assert skipped == [] and (meas.model, meas.weights, meas.gpu) == ("llama-3.1-8b", "bf16", "")


def test_bench_latency_takes_its_shape_from_the_arguments():
    text = ("Namespace(model='meta-llama/Llama-3.1-8B-Instruct', input_len=32, output_len=128, "
            "batch_size=8, num_iters=10)\nAvg latency: 1.2345 seconds\n"
            "10% percentile latency: 1.2000 seconds\n")
    (r,), skipped = read_bench_printout(text, "lat")  # type: ignore[misc]
    assert skipped == [] and (r["metric"], r["value"], r["input_len"], r["output_len"],
                              r["batch_or_concurrency"]) == ("avg_latency_s", "1.2345", "32",
                                                             "128", "8")
    # vllm-project/vllm issue #1805's command: four GPUs
    tp = "python3 benchmark_latency.py --input-len 2000 --output-len 128 -tp 4 " \
         "--batch-size 1\nAvg latency: 0.462 seconds\n"
    assert read_bench_printout(tp, "lat")[1][0].reason == \
        "tensor_parallel_size 4: kvsim replays one card's rows"  # type: ignore[index]
    _, (bare,) = read_bench_printout("Avg latency: 0.5 seconds\n", "lat")  # type: ignore[misc]
    assert bare.reason.startswith("input_len, output_len, batch_size not printed")


def test_the_cli_replays_a_pasted_block_on_the_card_and_model_named(kvsim_cli, tmp_path):
    f = tmp_path / "sglang.txt"
    f.write_text(SGLANG, encoding="utf-8")
    code, _, out = kvsim_cli("validate", str(f), "--json")
    assert code == 0 and all(s["reason"].startswith("no card printed: name it with --gpu")
                             for s in json.loads(out)["skipped"])
    code, _, out = kvsim_cli("validate", str(f), "--gpu", "rtx-4090", "--model",
                             "llama-3.1-8b-bf16", "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and {r["metric"] for r in rows} == {"ttft_ms_median", "itl_ms_median",
                                                          "output_tps_total"}
    assert all(r["kind"] == "serving" and r["backend"] == "sglang" and r["gpu"] == "rtx-4090"
               and r["batch"] == 1 for r in rows)
