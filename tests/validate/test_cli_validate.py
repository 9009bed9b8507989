"""``kvsim validate``: the JSON contract, every row predicted or skipped with a reason,
the fidelity it reaches on the published scoreboard, bad input and the report."""
import csv
import json
from pathlib import Path

import pytest

from kvsim.report.data_validate import validation_points

HERE = Path(__file__).resolve().parent
MEAS = HERE.parents[1] / "docs" / "reference" / "measurements"
SUMMARY_KEYS = {"kind", "backend", "metric", "n", "median_abs_rel_err", "p90_abs_rel_err",
                "median_rel_err"}

# A llama-bench markdown table as printed on an RTX 5090 (the published format; the
# values are the 5090's scoreboard row: llama.cpp discussion #15013 via
# docs/reference/measurements/llamabench-scoreboard.csv, SB001, CUDA Llama 2 7B Q4_0)
PASTED_5090 = """\
ggml_cuda_init: found 1 CUDA devices:
  Device 0: NVIDIA GeForce RTX 5090, compute capability 12.0, VMM: yes
| model                          |       size |     params | backend    | ngl |            test |                  t/s |
| ------------------------------ | ---------: | ---------: | ---------- | --: | --------------: | -------------------: |
| llama 7B Q4_0                  |   3.56 GiB |     6.74 B | CUDA       |  99 |           pp512 |     {pp} ± 20.00 |
| llama 7B Q4_0                  |   3.56 GiB |     6.74 B | CUDA       |  99 |           tg128 |        {tg} ± 0.50 |
"""


def _scoreboard_row(gpu: str) -> dict[str, str]:
    with open(MEAS / "llamabench-scoreboard.csv", encoding="utf-8") as fh:
        return next(r for r in csv.DictReader(fh)
                    if r["gpu"] == gpu and r["backend"] == "CUDA" and r["weight_format"] == "Q4_0")


def test_scoreboard_json_every_row_predicted_or_skipped(kvsim_cli):
    code, err, out = kvsim_cli("validate", MEAS / "llamabench-scoreboard.csv", "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert set(doc) >= {"rows", "summary", "skipped"}
    # 99 csv rows x (pp512, tg128): each one is a prediction or a skipped row with a reason
    assert len(doc["rows"]) + len(doc["skipped"]) == 198
    assert all(s["reason"] and s["id"] for s in doc["skipped"])
    ids = [r["id"] for r in doc["rows"]] + [s["id"] for s in doc["skipped"]]
    assert len(set(ids)) == len(ids)
    for r in doc["rows"]:
        assert r["rel_err"] == pytest.approx(
            (r["predicted_tps"] - r["measured_tps"]) / r["measured_tps"], rel=1e-9)
    for s in doc["summary"]:
        assert set(s) == SUMMARY_KEYS and s["n"] >= 1
        assert 0 <= s["median_abs_rel_err"] <= s["p90_abs_rel_err"]
    # the figures the shipped constants reach on the rows they were fitted on (the
    # leave-one-device-out ones are in hardware_profiles/speed/constants.yaml)
    summ = {(s["kind"], s["backend"], s["metric"]): s for s in doc["summary"]}
    tg = summ[("single", "CUDA", "tg_tps")]
    assert tg["n"] >= 14 and tg["median_abs_rel_err"] < 0.10 and tg["p90_abs_rel_err"] < 0.20
    metal = summ[("single", "Metal", "tg_tps")]
    assert metal["n"] >= 40 and metal["median_abs_rel_err"] < 0.05


def test_skipped_rows_say_why(kvsim_cli):
    _, _, out = kvsim_cli("validate", MEAS / "engine-memory-logs.csv",
                          MEAS / "llamabench-scoreboard.csv", "--json")
    reasons = [s["reason"] for s in json.loads(out)["skipped"]]
    assert any("empty" in r for r in reasons)                # SB056 has no pp512 figure
    assert "model not shown in the log" in reasons             # e.g. memory-log vllm-016


def test_pasted_llama_bench_table_names_its_card(kvsim_cli, tmp_path):
    row = _scoreboard_row("NVIDIA GeForce RTX 5090")
    f = tmp_path / "mine.md"
    f.write_text(PASTED_5090.format(pp=row["pp512_tps"], tg=row["tg128_tps"]),
                 encoding="utf-8")
    code, err, out = kvsim_cli("validate", f, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["skipped"] == []
    by_metric = {r["metric"]: r for r in doc["rows"]}
    assert set(by_metric) == {"pp_tps", "tg_tps"}
    assert by_metric["tg_tps"]["gpu"] == "rtx-5090" and by_metric["tg_tps"]["model"] == "llama-2-7b"
    # decode within 10 %, prefill within 25 % (the fit saw this row: in-sample figures)
    assert abs(by_metric["tg_tps"]["rel_err"]) < 0.10
    assert abs(by_metric["pp_tps"]["rel_err"]) < 0.25


def test_table_without_a_card_needs_gpu(kvsim_cli, tmp_path):
    f = tmp_path / "nocard.md"
    f.write_text("\n".join(PASTED_5090.format(pp="14000.00", tg="180.00").splitlines()[2:]),
                 encoding="utf-8")
    _, _, out = kvsim_cli("validate", f, "--json")
    doc = json.loads(out)
    assert doc["rows"] == [] and len(doc["skipped"]) == 2
    assert all("gpu" in s["reason"].lower() for s in doc["skipped"])
    _, _, out = kvsim_cli("validate", f, "--json", "--gpu", "RTX 4090")
    assert [r["gpu"] for r in json.loads(out)["rows"]] == ["rtx-4090", "rtx-4090"]


def test_unreadable_file_is_a_warning_beside_a_good_one(kvsim_cli, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("hello, this is no benchmark\n", encoding="utf-8")
    code, err, out = kvsim_cli("validate", bad, HERE / "data" / "bench.json", "--json")
    assert (code, err) == (0, "")
    warnings = [ln for ln in kvsim_cli.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "bad.txt" in warnings[0]
    doc = json.loads(out)
    # the CPU rows of the fixture are skipped with the reason, not dropped
    assert len(doc["skipped"]) == 8 and all("CPU" in s["reason"] for s in doc["skipped"])


def test_nothing_readable_exits_2(kvsim_cli, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("a,b\n1,2\n", encoding="utf-8")
    code, err, _ = kvsim_cli("validate", bad, tmp_path / "missing.csv")
    assert code == 2 and err.startswith("error: FILE") and "llama-bench" in err


@pytest.mark.parametrize("args, field", [
    (["--gpu", "rtx-9999-ultra"], "--gpu"),
    (["--constants", "no-such.yaml"], "--constants"),
    (["--calibration", "no-such.json"], "--calibration"),
])
def test_bad_options_exit_2_naming_the_option(kvsim_cli, args, field):
    code, err, _ = kvsim_cli("validate", HERE / "data" / "bench.json", *args)
    assert code == 2 and field in err, err


def test_report_has_predicted_vs_measured(kvsim_cli, tmp_path):
    out_html = tmp_path / "v.html"
    code, err, out = kvsim_cli("validate", MEAS / "llamabench-scoreboard.csv", "--no-rows",
                               "--report", out_html)
    assert (code, err) == (0, "")
    assert "summary per kind, backend and metric" in out
    assert "predicted vs measured (tokens/s)" not in out       # --no-rows
    html = out_html.read_text(encoding="utf-8")
    assert "Predicted vs measured throughput" in html and "Metal" in html


def test_validation_points_group_by_backend():
    rows = [{"id": "a", "backend": "Metal", "gpu": "apple-m2-ultra-76c", "model": "llama-2-7b",
             "weights": "q4_0", "metric": "tg_tps", "n_prompt": 0, "n_gen": 128, "depth": 0,
             "batch": 1, "measured_tps": 100.0, "predicted_tps": 90.0, "rel_err": -0.1},
            {"id": "b", "backend": "CUDA", "gpu": "rtx-4090", "model": "llama-2-7b",
             "weights": "q4_0", "metric": "pp_tps", "n_prompt": 512, "n_gen": 0, "depth": 0,
             "batch": 1, "measured_tps": 1000.0, "predicted_tps": 1200.0, "rel_err": 0.2}]
    pts = validation_points(rows)
    assert list(pts) == ["CUDA", "Metal"]
    assert pts["CUDA"] == {"measured": [1000.0], "predicted": [1200.0], "label": [
        "b: rtx-4090 · llama-2-7b q4_0 · pp512 d0 ×1 · +20.0 %"]}
    assert pts["Metal"]["label"] == ["a: apple-m2-ultra-76c · llama-2-7b q4_0 · tg128 d0 ×1 · -10.0 %"]


def test_bad_rows_and_columns_of_a_shared_layout_are_named(kvsim_cli, tmp_path):
    """One line per problem naming the row and the field; the good rows still validated."""
    src = MEAS / "llamabench-scoreboard.csv"
    with open(src, encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    head = list(rows[0]) + ["tokens_per_joule"]
    good = dict(rows[0], tokens_per_joule="3")
    slow = dict(good, id="SBX1", pp512_tps="fast")
    alien = dict(good, id="SBX2", gpu="NVIDIA GeForce RTX 9999")
    f = tmp_path / "sb.csv"
    with open(f, "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, head)
        w.writeheader()
        w.writerows([good, slow, alien])
    code, err, out = kvsim_cli("validate", f, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert sorted(r["id"] for r in doc["rows"]) == [f"{good['id']}:pp", f"{good['id']}:tg",
                                                     "SBX1:tg"]
    why = {s["id"]: s["reason"] for s in doc["skipped"]}
    assert why["SBX1:pp512_tps"] == "pp512_tps is empty or not a number ('fast')"
    assert why["SBX2:pp"].startswith("unknown GPU 'NVIDIA GeForce RTX 9999' (closest: ")
    assert why["sb.csv:column tokens_per_joule"].startswith(
        "unknown column 'tokens_per_joule' of a scoreboard CSV, not read")


def test_speed_vs_load_rows_with_other_units_or_metrics(kvsim_cli, tmp_path):
    with open(MEAS / "speed-vs-load.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    base = next(r for r in rows if r["id"] == "SL0004")
    f = tmp_path / "sl.csv"
    with open(f, "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, list(base))
        w.writeheader()
        w.writerows([dict(base, id="U1", unit="furlongs"),
                     dict(base, id="U2", metric="energy_j"),
                     dict(base, id="U3", value="n/a"), base])
    doc = json.loads(kvsim_cli("validate", f, "--json")[2])
    assert [r["id"] for r in doc["rows"]] == ["SL0004"]
    why = {s["id"]: s["reason"] for s in doc["skipped"]}
    assert why == {
        "U1": "unit 'furlongs' of metric 'tg32_tps' is not a token throughput (the unit must "
              "be tok/s)",
        "U2": "metric 'energy_j': not a prefill or decode throughput kvsim predicts",
        "U3": "value 'n/a' is not a number"}


def test_a_micro_batch_sweep_names_each_rows_micro_batch(kvsim_cli, tmp_path):
    # llama-bench -ub 64,512 prints an n_ubatch column; rows that differ only in it are
    # told apart: "n_ubatch" in the JSON, "ub64" in the table's test (the default 512
    # is not written)
    f = tmp_path / "sweep.md"
    f.write_text("""\
  Device 0: NVIDIA GeForce RTX 5090, compute capability 12.0, VMM: yes
| model                          |       size |     params | backend    | ngl | n_ubatch |            test |                  t/s |
| ------------------------------ | ---------: | ---------: | ---------- | --: | -------: | --------------: | -------------------: |
| llama 7B Q4_0                  |   3.56 GiB |     6.74 B | CUDA       |  99 |       64 |           pp512 |      8000.00 ± 20.00 |
| llama 7B Q4_0                  |   3.56 GiB |     6.74 B | CUDA       |  99 |      512 |           pp512 |     14000.00 ± 20.00 |
""", encoding="utf-8")
    code, err, out = kvsim_cli("validate", f, "--json")
    assert (code, err) == (0, "")
    rows = json.loads(out)["rows"]
    assert [r["n_ubatch"] for r in rows] == [64, 512]
    assert rows[0]["predicted_tps"] < rows[1]["predicted_tps"]   # a tile a 64-token step
    code, _, table = kvsim_cli("validate", f)
    assert code == 0 and "pp512 ub64" in table and "pp512 ub512" not in table


def test_an_experts_only_format_on_a_dense_model_skips_that_row_only(kvsim_cli, tmp_path):
    """MXFP4 quantises routed experts: a dense model's row under it is skipped with the
    reason, the other rows still validated (it ended the whole run with exit 2 before)."""
    with open(MEAS / "speed-vs-load.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    oss = next(r for r in rows if r["id"] == "SL0012")  # gpt-oss-20b tg32, 11.27 GiB
    dense = dict(oss, id="D1", model="Llama 3.1 8B (llama 8B MXFP4 MoE, 4.50 GiB)")
    f = tmp_path / "sl.csv"
    with open(f, "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, list(oss))
        w.writeheader()
        w.writerows([oss, dense])
    code, err, out = kvsim_cli("validate", f, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert [(r["id"], r["weights"]) for r in doc["rows"]] == [("SL0012", "mxfp4_moe")]
    assert doc["skipped"] == [{"id": "D1", "reason": (
        "weight format 'mxfp4_moe': quantises MoE experts only, and llama-3.1-8b has none; "
        "use a whole-model format (bf16, q8_0, q4_k_m, ...)")}]


def test_rows_that_cannot_be_priced_are_skipped_with_the_field(kvsim_cli, tmp_path):
    """A measured speed of 0 divided the run by zero (a traceback); a count outside its
    range, a test of more engine steps than kvsim prices or a file size more than 2x from
    the model's is one skipped row naming it, the good row still validated."""
    with open(MEAS / "speed-vs-load.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    tg = next(r for r in rows if r["id"] == "SL0004")   # qwen2.5-coder-7b tg32 @ d4096
    pp = next(r for r in rows if r["id"] == "SL0003")   # pp2048 @ d4096, -ub 2048
    oss = next(r for r in rows if r["id"] == "SL0012")  # gpt-oss-20b, 11.27 GiB
    bad = [dict(tg, id="V0", value="0"), dict(tg, id="VN", value="-5"),
           dict(tg, id="DN", context_or_depth="-100"),
           dict(pp, id="PB", metric="pp99999999_tps"),
           dict(pp, id="ST", metric="pp4000000_tps", settings="llama-bench -ub 1"),
           dict(oss, id="FS", model="gpt-oss-20b (MoE, 0.01 GiB)")]
    f = tmp_path / "sl.csv"
    with open(f, "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, list(tg))
        w.writeheader()
        w.writerows([tg, *bad])
    code, err, out = kvsim_cli("validate", f, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert [r["id"] for r in doc["rows"]] == ["SL0004"]
    assert {s["id"]: s["reason"] for s in doc["skipped"]} == {
        "V0": "measured value 0.0: a finite number of tokens/s above 0",
        "VN": "measured value -5.0: a finite number of tokens/s above 0",
        "DN": "depth -100: 0 to 16,777,216 tokens",
        "PB": "n_prompt 99999999: 0 to 16,777,216 tokens",
        "ST": "a test of 4,000,001 engine steps: at most 1,048,576",
        "FS": "model file 0.01 GiB: more than 2x from gpt-oss-20b in mxfp4_moe (11.23 GiB)"}


def test_a_negative_micro_batch_is_skipped_not_an_endless_loop(kvsim_cli, tmp_path):
    """llama-bench JSON with ``n_ubatch`` -1 split its prompt into steps forever (the
    step loop never ran out of room); 0 and -1 are skipped rows naming the field."""
    base = {"gpu_info": "NVIDIA GeForce RTX 3090", "backends": "CUDA",
            "model_filename": "llama-2-7b.Q4_0.gguf", "model_type": "llama 7B Q4_0",
            "model_size": 3825065984, "model_n_params": 6738415616, "n_batch": 2048,
            "n_ubatch": 512, "type_k": "f16", "type_v": "f16", "n_gpu_layers": 99,
            "flash_attn": True, "n_prompt": 512, "n_gen": 0, "n_depth": 0,
            "avg_ts": 4000.0, "build_commit": "abc1234"}
    f = tmp_path / "bench.jsonl"
    f.write_text("\n".join(json.dumps(dict(base, n_ubatch=u)) for u in (512, 0, -1)) + "\n",
                 encoding="utf-8")
    code, err, out = kvsim_cli("validate", f, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert [r["id"] for r in doc["rows"]] == ["bench.jsonl:1"]
    assert doc["skipped"] == [
        {"id": "bench.jsonl:2", "reason": "n_ubatch 0: at least 1 token"},
        {"id": "bench.jsonl:3", "reason": "n_ubatch -1: at least 1 token"}]


def test_batched_bench_rows_take_the_weight_format_of_the_model_gguf(kvsim_cli, tmp_path):
    """llama-batched-bench prints no model: a ``--model`` GGUF's header names the file
    type (``general.file_type`` ALL_F32 here), which its rows take, as they take one a
    model name carries; a bare profile name gives none, and the rows say so."""
    from kvsim.calibrate.tiny_gguf import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    bench = HERE / "data" / "batched_pps.jsonl"
    code, err, out = kvsim_cli("validate", bench, "--gpu", "rtx-4090", "--model", gguf,
                               "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["rows"] and doc["skipped"] == []
    assert {r["weights"] for r in doc["rows"]} == {"f32"}
    _, _, out = kvsim_cli("validate", bench, "--gpu", "rtx-4090", "--model", "llama-3.1-8b",
                          "--json")
    doc = json.loads(out)
    assert doc["rows"] == [] and doc["skipped"]
    assert {s["reason"] for s in doc["skipped"]} == {
        "weight format not shown (llama-batched-bench prints no model): give --model a GGUF "
        "file, or a name that carries it (llama-3.1-8b-Q4_K_M)"}
    _, _, out = kvsim_cli("validate", bench, "--gpu", "rtx-4090", "--model",
                          "llama-3.1-8b-Q4_K_M", "--json")
    doc = json.loads(out)
    assert doc["rows"] and {r["weights"] for r in doc["rows"]} == {"q4_k_m"}
