"""kvsim.validate.llamabench on real llama-bench / llama-batched-bench output.

The files in tests/validate/data are the tools' unedited output (commands in its
README.md); the strings named HAND_MADE_* below are hand-written examples of the
published formats (GPU tables as posted on GitHub, an older llama-bench's JSON), not
tool output.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvsim.errors import InputError
from kvsim.validate.llamabench import (
    BATCHED_JSONL,
    BATCHED_MD,
    BENCH_CSV,
    BENCH_JSON,
    BENCH_JSONL,
    BENCH_MD,
    FORMATS,
    detect_format,
    read_bench,
    weight_format,
)
from kvsim.validate.records import Measurement

DATA = Path(__file__).parent / "data"
MiB = 2**20

# -p 64,128 -n 16,32 -d 0,256: llama-bench runs the depths outermost
BENCH_TESTS = [("pp_tps", 64, 0, 0), ("pp_tps", 128, 0, 0), ("tg_tps", 0, 16, 0),
               ("tg_tps", 0, 32, 0), ("pp_tps", 64, 0, 256), ("pp_tps", 128, 0, 256),
               ("tg_tps", 0, 16, 256), ("tg_tps", 0, 32, 256)]


def _read(name: str) -> tuple[list[Measurement], list]:
    return read_bench((DATA / name).read_text(), origin=name)


def _shape(m: Measurement) -> tuple:
    return (m.metric, m.n_prompt, m.n_gen, m.depth)


def _setup(m: Measurement) -> tuple:
    """What every format of one llama-bench invocation prints alike."""
    return (_shape(m), m.batch, m.backend, m.gpu, m.weight_format, m.n_batch, m.n_ubatch,
            m.flash_attn, m.kv_type)


def _anonymous(ms: list[Measurement]) -> list[Measurement]:
    return [replace(m, id="", source="") for m in ms]


@pytest.mark.parametrize(("name", "fmt"), [
    ("bench.json", BENCH_JSON), ("bench.jsonl", BENCH_JSONL), ("bench.csv", BENCH_CSV),
    ("bench.md", BENCH_MD), ("bench_fa_ctk.json", BENCH_JSON), ("bench_fa_ctk.md", BENCH_MD),
    ("batched.md", BATCHED_MD), ("batched_pps.md", BATCHED_MD),
    ("batched_pps.jsonl", BATCHED_JSONL)])
def test_detects_each_real_output(name: str, fmt: str) -> None:
    assert detect_format((DATA / name).read_text()) == fmt


def test_bench_json_reads_every_test_as_printed() -> None:
    raw = json.loads((DATA / "bench.json").read_text())
    ms, skipped = _read("bench.json")
    assert skipped == []
    assert [_shape(m) for m in ms] == BENCH_TESTS
    assert [m.id for m in ms] == [f"bench.json:{i}" for i in range(1, 9)]
    assert [m.value for m in ms] == [r["avg_ts"] for r in raw]
    assert ms[0].value == 11734.705303  # the file's first avg_ts
    assert [m.kind for m in ms] == ["single"] * 4 + ["depth"] * 4
    for m in ms:
        assert (m.gpu, m.backend, m.model, m.weight_format) == ("", "CPU", "tiny.gguf", "F32")
        # flash_attn -1 is llama-bench's default -fa auto, which llama.cpp resolves to on
        assert (m.n_batch, m.n_ubatch, m.flash_attn, m.kv_type) == (128, 64, True, "f16")
        assert (m.model_size_bytes, m.model_params, m.batch) == (20984832, 5246208, 1)
        assert m.extra["n_threads"] == "2" and m.extra["n_gpu_layers"] == "-1"
        assert m.extra["model_type"] == "llama ?B all F32"
        assert m.extra["format"] == BENCH_JSON and m.source == "bench.json"


def test_json_and_markdown_of_one_run_agree_to_the_printed_precision() -> None:
    js, _ = _read("bench.json")
    md, skipped = _read("bench.md")
    assert skipped == []
    # the markdown prints no fa column at the default, which was off before llama-bench
    # took -fa auto and is auto (on) since: unknown there, -1 (auto: on) in the json
    assert {m.flash_attn for m in md} == {None} and {m.flash_attn for m in js} == {True}
    assert [_setup(replace(m, flash_attn=True)) for m in md] == [_setup(m) for m in js]
    assert [m.value for m in md] == [round(m.value, 2) for m in js]
    assert md[0].value == 11734.71 and md[0].extra["stddev_ts"] == "526.85"
    for m, j in zip(md, js, strict=True):
        assert m.model == j.extra["model_type"]  # markdown names no file
        assert abs(m.model_size_bytes - j.model_size_bytes) <= 0.005 * MiB
        assert abs(m.model_params - j.model_params) <= 0.005e6


def test_csv_and_jsonl_of_one_run_are_the_same_measurements() -> None:
    csv_rows, s1 = _read("bench.csv")
    jsonl_rows, s2 = _read("bench.jsonl")
    assert s1 == s2 == []
    assert _anonymous(csv_rows) == _anonymous(jsonl_rows)
    assert [m.id for m in csv_rows] == [f"bench.csv:{i}" for i in range(1, 9)]
    assert csv_rows[0].value == 9570.854533


def test_all_four_formats_give_the_same_tests_and_setup() -> None:
    setups = {name: [_setup(m) for m in _read(name)[0]]
              for name in ("bench.json", "bench.jsonl", "bench.csv")}
    setups["bench.md"] = [_setup(replace(m, flash_attn=True))  # no fa column: see above
                          for m in _read("bench.md")[0]]
    first = setups["bench.json"]
    assert [s[0] for s in first] == BENCH_TESTS
    assert all(s == first for s in setups.values())


def test_pp_plus_tg_tests_are_one_pg_rate_and_fa_ctk_read() -> None:
    js, js_skipped = _read("bench_fa_ctk.json")
    md, md_skipped = _read("bench_fa_ctk.md")
    for ms, skipped, origin in ((js, js_skipped, "bench_fa_ctk.json"),
                                (md, md_skipped, "bench_fa_ctk.md")):
        assert skipped == []
        # -fa off,on -ctk f16,q8_0: type_k outermost; -pg 64,16 after -p 64 and -n 16
        assert [(m.kv_type, m.flash_attn, _shape(m)) for m in ms] == [
            (k, fa, shape) for k in ("f16", "q8_0") for fa in (False, True)
            for shape in (("pp_tps", 64, 0, 0), ("tg_tps", 0, 16, 0), ("pg_tps", 64, 16, 0))]
        assert [m.id for m in ms if m.metric == "pg_tps"] == [
            f"{origin}:{i}" for i in (3, 6, 9, 12)]
        assert {m.kind for m in ms} == {"single"}
    assert [m.value for m in md] == [round(m.value, 2) for m in js]
    assert (js[0].n_batch, md[0].n_batch) == (2048, None)  # md prints only non-defaults


# PP, TG, B, S_PP t/s, S_TG t/s as the files print them
BATCHED = [(64, 16, 1, 8722.91, 2121.45), (64, 16, 2, 8957.31, 1597.05),
           (64, 16, 4, 9149.72, 2639.50), (128, 16, 1, 9088.33, 1761.73),
           (128, 16, 2, 8717.56, 1451.18), (128, 16, 4, 9496.61, 2664.22)]
BATCHED_PPS = [(64, 16, 1, 9232.54, 2638.52), (64, 16, 2, 10430.25, 2465.14),
               (64, 16, 4, 10502.13, 3278.52), (128, 16, 1, 9476.57, 2005.52),
               (128, 16, 2, 8698.61, 2026.98), (128, 16, 4, 9598.80, 2757.31)]


def _batched_expected(origin: str, rows: list[tuple]) -> list[tuple]:
    out = []
    for n, (pp, tg, b, s_pp, s_tg) in enumerate(rows, 1):
        out.append((f"{origin}:{n}:pp", "pp_tps", pp, 0, 0, b, s_pp))
        out.append((f"{origin}:{n}:tg", "tg_tps", 0, tg, pp, b, s_tg))
    return out


def _batched_got(ms: list[Measurement]) -> list[tuple]:
    return [(m.id, m.metric, m.n_prompt, m.n_gen, m.depth, m.batch, m.value) for m in ms]


@pytest.mark.parametrize(("name", "rows", "shared"), [("batched.md", BATCHED, "0"),
                                                      ("batched_pps.md", BATCHED_PPS, "1")])
def test_batched_bench_table(name: str, rows: list[tuple], shared: str) -> None:
    ms, skipped = _read(name)
    assert skipped == []
    assert _batched_got(ms) == _batched_expected(name, rows)
    assert [m.kind for m in ms[:6]] == ["single", "depth", "parallel", "parallel",
                                        "parallel", "parallel"]
    for m in ms:
        assert (m.gpu, m.backend, m.model, m.weight_format) == ("", "", "", "")
        assert (m.n_batch, m.n_ubatch, m.flash_attn) == (128, 64, True)  # flash_attn = -1
        assert m.extra["is_pp_shared"] == shared and m.extra["is_tg_separate"] == "0"
        assert m.extra["n_kv_max"] == "2048" and m.extra["n_threads"] == "2"
    assert ms[-1].extra["n_kv"] == "576"  # PP 128 + TG 16, times B 4


def test_batched_bench_jsonl() -> None:
    raw = [json.loads(ln) for ln in (DATA / "batched_pps.jsonl").read_text().splitlines()
           if ln.strip()]
    ms, skipped = _read("batched_pps.jsonl")
    assert skipped == []
    rows = [(r["pp"], r["tg"], r["pl"], r["speed_pp"], r["speed_tg"]) for r in raw]
    assert _batched_got(ms) == _batched_expected("batched_pps.jsonl", rows)
    assert ms[0].value == 9553.665039
    assert all(m.extra["is_pp_shared"] == "1" for m in ms)


HAND_MADE_GPU_MD = """\
ggml_cuda_init: found 1 CUDA devices:
  Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9, VMM: yes
| model                          |       size |     params | backend    | ngl |            test |                  t/s |
| ------------------------------ | ---------: | ---------: | ---------- | --: | --------------: | -------------------: |
| llama 7B Q4_0                  |   3.56 GiB |     6.74 B | CUDA       |  99 |           pp512 |    14073.41 ± 115.16 |
| llama 7B Q4_0                  |   3.56 GiB |     6.74 B | CUDA       |  99 |           tg128 |        187.31 ± 0.64 |
| llama 7B Q4_0                  |   3.56 GiB |     6.74 B | CUDA       |  99 |   pp512 @ d4096 |     11035.12 ± 40.20 |
| llama 7B Q4_0                  |   3.56 GiB |     6.74 B | CUDA       |  99 |   tg128 @ d4096 |        160.58 ± 0.35 |

build: 0c1e570 (6789)
"""  # hand-made: the published format, numbers invented

HAND_MADE_COMPACT_MD = """\
| model | size | params | backend | ngl | n_ubatch | fa | test | t/s |
| --- | ---: | ---: | --- | --: | ---: | -: | ---: | ---: |
| qwen2 7B Q4_K - Medium | 4.36 GiB | 7.62 B | Metal,BLAS | 99 | 256 | 1 | pp 512 | 655.20 ± 1.07 |
| qwen2 7B Q4_K - Medium | 4.36 GiB | 7.62 B | Metal,BLAS | 99 | 256 | 1 | tg 128 | 41.55 |
| qwen2 7B Q4_K - Medium | 4.36 GiB | 7.62 B | Metal,BLAS | 99 | 256 | 1 | pp512+tg128 | 300.00 ± 2.00 |
"""  # hand-made: a pasted table without padding, old "pp 512" names, no "± sd"


def test_hand_made_gpu_markdown_with_sd_and_depth() -> None:
    ms, skipped = read_bench(HAND_MADE_GPU_MD, origin="gh.md")
    assert skipped == []
    assert [(_shape(m), m.value) for m in ms] == [
        (("pp_tps", 512, 0, 0), 14073.41), (("tg_tps", 0, 128, 0), 187.31),
        (("pp_tps", 512, 0, 4096), 11035.12), (("tg_tps", 0, 128, 4096), 160.58)]
    for m in ms:
        assert (m.backend, m.gpu, m.model, m.weight_format) == (
            "CUDA", "NVIDIA GeForce RTX 4090", "llama 7B Q4_0", "Q4_0")  # its Device 0 line
        assert m.model_size_bytes == round(3.56 * 2**30) and m.model_params == 6_740_000_000
        assert m.extra["n_gpu_layers"] == "99" and (m.flash_attn, m.n_batch) == (None, None)
    assert ms[0].extra["stddev_ts"] == "115.16"
    assert [m.kind for m in ms] == ["single", "single", "depth", "depth"]


def test_hand_made_compact_markdown() -> None:
    ms, skipped = read_bench(HAND_MADE_COMPACT_MD, origin="post")
    assert [(m.backend, m.weight_format, m.flash_attn, m.n_ubatch, _shape(m), m.value)
            for m in ms] == [("Metal", "Q4_K_M", True, 256, ("pp_tps", 512, 0, 0), 655.2),
                             ("Metal", "Q4_K_M", True, 256, ("tg_tps", 0, 128, 0), 41.55),
                             ("Metal", "Q4_K_M", True, 256, ("pg_tps", 512, 128, 0), 300.0)]
    assert skipped == []


HAND_MADE_OLD_JSON = json.dumps([{
    # hand-made in the shape of a 2024 llama-bench -o json: one bool per backend, no
    # "backends" and no "n_depth" (no -d yet), flash_attn a bool, "mostly" ftype names
    "build_commit": "abcdef0", "build_number": 2000, "cuda": True, "vulkan": False,
    "metal": False, "sycl": False, "gpu_blas": True, "blas": True,
    "cpu_info": "AMD Ryzen 9 7950X", "gpu_info": "NVIDIA GeForce RTX 3090",
    "model_filename": "models/7B/ggml-model-q4_0.gguf", "model_type": "llama 7B mostly Q4_0",
    "model_size": 3825065984, "model_n_params": 6738415616, "n_batch": 2048,
    "n_ubatch": 512, "n_threads": 16, "type_k": "q8_0", "type_v": "q8_0",
    "n_gpu_layers": 99, "flash_attn": True, "n_prompt": 0, "n_gen": 128,
    "avg_ts": 150.25, "stddev_ts": 0.5}])


def test_hand_made_older_llama_bench_json() -> None:
    (m,), skipped = read_bench(HAND_MADE_OLD_JSON, origin="old.json")
    assert skipped == []
    assert (m.backend, m.gpu, m.weight_format, m.kv_type, m.flash_attn) == (
        "CUDA", "NVIDIA GeForce RTX 3090", "Q4_0", "q8_0", True)
    assert (_shape(m), m.value, m.model) == (("tg_tps", 0, 128, 0), 150.25,
                                            "models/7B/ggml-model-q4_0.gguf")


@pytest.mark.parametrize(("raw", "backend"), [
    ("CUDA", "CUDA"), ("Metal,BLAS", "Metal"), ("ROCm", "ROCm"), ("HIP", "ROCm"),
    ("Vulkan", "Vulkan"), ("SYCL", "SYCL"), ("CPU", "CPU"), ("BLAS", "CPU"),
    ("CUDA,RPC", "CUDA"), ("RPC", "RPC")])
def test_backends_normalise_to_the_gpu_backend(raw: str, backend: str) -> None:
    row = json.loads((DATA / "bench.jsonl").read_text().splitlines()[0])
    (m,), _ = read_bench(json.dumps(row | {"backends": raw}), origin="x")
    assert (m.backend, m.extra["backends"]) == (backend, raw)


@pytest.mark.parametrize(("model_type", "fmt"), [
    ("llama 7B Q4_0", "Q4_0"), ("llama 8B Q4_K - Medium", "Q4_K_M"),
    ("llama 8B Q5_K - Small", "Q5_K_S"), ("llama 8B Q3_K - Large", "Q3_K_L"),
    ("llama 8B Q2_K - Medium", "Q2_K"), ("llama ?B all F32", "F32"), ("llama 8B F16", "F16"),
    ("llama 8B BF16", "BF16"), ("llama 8B IQ2_XXS - 2.0625 bpw", "IQ2_XXS"),
    ("llama 8B IQ3_S mix - 3.66 bpw", "IQ3_M"), ("gpt-oss 20B MXFP4 MoE", "MXFP4_MOE"),
    ("llama 7B mostly Q4_0", "Q4_0"), ("llama 8B (guessed) Q8_0", "Q8_0"),
    ("qwen3moe 30B.A3B Q6_K", "Q6_K"), ("llama 8B TQ1_0 - 1.69 bpw ternary", "TQ1_0"),
    ("", "")])
def test_weight_format_from_model_type(model_type: str, fmt: str) -> None:
    assert weight_format(model_type) == fmt


def test_json_with_fields_removed_skips_only_those_rows() -> None:
    rows = json.loads((DATA / "bench.json").read_text())
    del rows[2]["avg_ts"]
    del rows[4]["n_prompt"]
    rows[5]["avg_ts"] = "fast"
    del rows[6]["backends"]
    ms, skipped = read_bench(json.dumps(rows, indent=2), origin="bench.json")
    assert [(s.id, s.reason) for s in skipped] == [
        ("bench.json:3", "field avg_ts missing"), ("bench.json:5", "field n_prompt missing"),
        ("bench.json:6", "field avg_ts: 'fast' is not a number"),
        ("bench.json:7", "field backends missing")]
    assert [m.id for m in ms] == ["bench.json:1", "bench.json:2", "bench.json:4",
                                  "bench.json:8"]
    assert [m.value for m in ms] == [rows[i]["avg_ts"] for i in (0, 1, 3, 7)]


def test_bad_rows_in_text_formats_are_skipped_by_name() -> None:
    lines = (DATA / "bench.csv").read_text().splitlines()
    csv_text = "\n".join(lines[:2] + [lines[2].rsplit(",", 3)[0]] + lines[3:])
    ms, skipped = read_bench(csv_text, origin="b.csv")
    assert len(ms) == 7 and [s.id for s in skipped] == ["b.csv:2"]
    assert "values, the header has" in skipped[0].reason

    md = (DATA / "bench.md").read_text().replace("pp128 |", "ttft1 |", 1) \
        .replace("2606.79 ± 2.26", "n/a", 1)
    ms, skipped = read_bench(md, origin="b.md")
    assert len(ms) == 6
    assert [s.id for s in skipped] == ["b.md:2", "b.md:3"]
    assert "'ttft1'" in skipped[0].reason and "'n/a' is not a number" in skipped[1].reason

    jsonl = (DATA / "bench.jsonl").read_text().splitlines()
    jsonl[1] = jsonl[1][:50]  # a line cut short
    ms, skipped = read_bench("\n".join(jsonl), origin="b.jsonl")
    assert len(ms) == 7 and [s.id for s in skipped] == ["b.jsonl:2"]
    assert skipped[0].reason.startswith("not a JSON object")


def test_batched_row_without_a_decode_rate_keeps_its_prompt_rate() -> None:
    text = (DATA / "batched.md").read_text().replace("|  2121.45 |", "|      nan |", 1)
    ms, skipped = read_bench(text, origin="bb")
    assert [(s.id, s.reason) for s in skipped] == [
        ("bb:1:tg", "field S_TG t/s: 'nan' is not a finite number")]
    assert ms[0].id == "bb:1:pp" and ms[0].value == 8722.91 and len(ms) == 11


@pytest.mark.parametrize("text", ["", "hello world\nnot a table\n", "[1, 2, 3]",
                                  '{"a": 1}\n', "| a | b |\n|---|---|\n| 1 | 2 |\n",
                                  '[{"avg_ts": 1.0}'])
def test_text_in_no_known_format_is_an_input_error(text: str) -> None:
    assert detect_format(text) is None
    with pytest.raises(InputError) as e:
        read_bench(text, origin="pasted.txt")
    msg = str(e.value)
    assert msg.startswith("pasted.txt: ")
    assert all(fmt in msg for fmt in FORMATS)


@pytest.mark.parametrize("startup, gpu", [
    ("ggml_cuda_init: found 2 CUDA devices:\n"
     "  Device 0: NVIDIA GeForce RTX 3090, compute capability 8.6, VMM: yes\n"
     "  Device 1: NVIDIA GeForce RTX 3060, compute capability 8.6, VMM: yes\n",
     "NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX 3060"),
    ("ggml_cuda_init: found 1 ROCm devices:\n"
     "  Device 0: AMD Radeon RX 7900 XTX, gfx1100 (0x1100), VMM: no, Wave Size: 32\n",
     "AMD Radeon RX 7900 XTX"),
    ("ggml_vulkan: Found 1 Vulkan devices:\n"
     "ggml_vulkan: 0 = AMD Radeon RX 6800 XT (RADV NAVI21) (radv) | uma: 0 | fp16: 1\n",
     "AMD Radeon RX 6800 XT"),
    ("ggml_metal_device_init: GPU name:   Apple M2 Max\n", "Apple M2 Max"),
    ("", ""),
])
def test_pasted_startup_lines_name_the_device(startup, gpu) -> None:
    table = "\n".join(HAND_MADE_GPU_MD.splitlines()[2:])
    ms, _ = read_bench(startup + table, origin="paste.md")
    assert {m.gpu for m in ms} == {gpu}
