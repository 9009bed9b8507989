"""The readers of docs/reference/measurements' three layouts: every row read or skipped with a reason."""
from pathlib import Path

import pytest

from kvsim.errors import InputError
from kvsim.validate.shared import backend_name, layout, number, read_shared_csv

MEAS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "measurements"


def _read(name: str):
    return read_shared_csv((MEAS / name).read_text(encoding="utf-8"), name)


def test_scoreboard_rows_become_pp512_and_tg128():
    meas, skipped = _read("llamabench-scoreboard.csv")
    by_id = {m.id: m for m in meas}
    pp, tg = by_id["SB001:pp"], by_id["SB001:tg"]
    assert (pp.metric, pp.n_prompt, pp.n_gen, pp.value) == ("pp_tps", 512, 0, 14073.41)
    assert (tg.metric, tg.n_gen, tg.value, tg.backend) == ("tg_tps", 128, 290.02, "CUDA")
    assert tg.kind == "single" and pp.flash_attn is False
    # "3890 (rounded)" is read as its number; an empty pp512 is a skipped row with a reason
    assert by_id["SB054:pp"].value == 3890 and by_id["SB054:pp"].flash_attn is True
    assert [s.id for s in skipped] == ["SB056:pp512_tps"]
    assert "empty" in skipped[0].reason
    assert by_id["SB063:tg"].backend == "ROCm"           # "HIP (rocWMMA)"
    assert by_id["SB151:tg"].backend == "Vulkan"         # "Vulkan (RADV)"
    # every csv row is accounted for: 99 rows x 2 metrics
    assert len(meas) + len(skipped) == 2 * 99


def test_speed_vs_load_depth_batched_and_single_stream_rows():
    meas, skipped = _read("speed-vs-load.csv")
    by_id = {m.id: m for m in meas}
    d = by_id["SL0004"]                                   # tg32 after 4096 tokens
    assert (d.metric, d.n_gen, d.depth, d.batch, d.kind) == ("tg_tps", 32, 4096, 1, "depth")
    assert d.n_ubatch == 2048 and d.flash_attn is True
    b = by_id["SL0158"]                                   # S_TG at B=32, PP=8192
    assert (b.metric, b.n_gen, b.depth, b.batch, b.kind) == ("tg_tps", 32, 8192, 32, "parallel")
    p = by_id["SL0157"]
    assert (p.metric, p.n_prompt, p.depth, p.batch) == ("pp_tps", 8192, 0, 32)
    x = by_id["SL0275"]                                   # 1024-token prompt eval
    assert (x.metric, x.n_prompt, x.value) == ("pp_tps", 1024, 2283.62)
    assert by_id["SL0274"].n_gen == 1024
    # link bandwidth rows are not model speeds: skipped, each with the reason
    assert {s.id for s in skipped} >= {"SL0362", "SL0388"}
    assert all("bandwidth" in s.reason for s in skipped)
    assert len(meas) + len(skipped) == 232


def test_long_rows_take_the_backend_their_engine_names():
    """A long-format row names its backend after the engine ("llama.cpp llama-bench
    (ROCm)"); without one it is Metal on an Apple device and CUDA elsewhere."""
    head = ("id,engine,gpu,model,weight_format,kv_type,settings,context_or_depth,"
            "batch_or_concurrency,metric,value,unit,source,notes\n")
    rows = ["R1,llama.cpp llama-bench (ROCm),AMD Radeon RX 7900 XTX,Llama 3.1 8B,Q4_K_M,f16,"
            "-ub 512 -fa 1,4096,1,tg64_tps,98.67,tok/s,s,",
            "R2,llama.cpp llama-bench (HIP),AMD Radeon RX 7900 XTX,Llama 3.1 8B,Q4_K_M,f16,,0,1,"
            "pp512_tps,3000,tok/s,s,",
            "R3,llama.cpp llama-batched-bench (Vulkan),NVIDIA GeForce RTX 4090,Llama 3.1 8B,Q4_0,"
            "f16,PP=512 TG=128,512,8,S_TG_tps,800,tok/s,s,",
            "R4,llama.cpp llama-bench (patched),Apple M2 Max,Llama 2 7B,Q4_0,f16,,0,1,"
            "tg128_tps,60,tok/s,s,",
            "R5,llama.cpp llama-bench,NVIDIA GeForce RTX 4090,Llama 2 7B,Q4_0,f16,,0,1,"
            "tg128_tps,150,tok/s,s,"]
    meas, skipped = read_shared_csv(head + "\n".join(rows) + "\n", "prs.csv")
    assert skipped == []
    got = {m.id: (m.backend, m.kind, m.depth, m.batch, m.n_ubatch) for m in meas}
    assert got == {"R1": ("ROCm", "depth", 4096, 1, 512), "R2": ("ROCm", "single", 0, 1, 512),
                   "R3": ("Vulkan", "parallel", 512, 8, 512),
                   "R4": ("Metal", "single", 0, 1, 512), "R5": ("CUDA", "single", 0, 1, 512)}


def test_pull_request_tables_read_whole_with_their_backends():
    """docs/reference/measurements-prs, -sweeps and -pascal: every row read, named
    backend, resolvable setup."""
    from collections import Counter

    from kvsim.validate.predict import setup_for
    from kvsim.validate.records import Skipped

    path = MEAS.parent / "measurements-prs" / "llamacpp-prs.csv"
    meas, skipped = read_shared_csv(path.read_text(encoding="utf-8"), path.name)
    assert skipped == [] and len(meas) == 355
    assert Counter(m.backend for m in meas) == {"ROCm": 149, "CUDA": 119, "Vulkan": 81,
                                                 "SYCL": 6}
    by_id = {m.id: m for m in meas}
    assert (by_id["PRR001"].n_prompt, by_id["PRV040"].backend) == (2048, "SYCL")
    sweeps = MEAS.parent / "measurements-sweeps" / "llamacpp-depth-sweeps.csv"
    moved, skipped = read_shared_csv(sweeps.read_text(encoding="utf-8"), sweeps.name)
    assert skipped == [] and len(moved) == 13 and {m.backend for m in moved} == {"CUDA"}
    assert not {m.id for m in moved} & set(by_id)   # moved, not copied
    assert {m.n_ubatch for m in moved} == {1, 16, 32, 64, 128, 256, 512}
    p40 = MEAS.parent / "measurements-pascal" / "llamacpp-p40.csv"
    pascal, skipped = read_shared_csv(p40.read_text(encoding="utf-8"), p40.name)
    assert skipped == [] and [m.id for m in pascal] == ["PRC127", "PRC128", "PRC129", "PRC130"]
    assert not {m.id for m in pascal} & set(by_id)  # moved, not copied
    moved += pascal
    r = by_id["PRC010"]                       # RTX 3090, pp512 @ d32768, -ub 2: held out
    assert (r.metric, r.n_prompt, r.depth, r.n_ubatch, r.flash_attn, r.value) == \
        ("pp_tps", 512, 32768, 2, True, 160.48)
    unresolved = [(m.id, s.reason) for m in meas + moved
                  if isinstance(s := setup_for(m), Skipped)]
    assert unresolved == []


def test_memory_logs_are_memory_measurements():
    meas, skipped = _read("engine-memory-logs.csv")
    assert len(meas) == 34 and skipped == []  # kvsim.validate.memlogs (test_memlogs.py)
    assert {m.engine for m in meas} == {"vllm", "sglang", "llama.cpp", "ollama"}


def test_layout_detection_and_helpers():
    assert layout(["id", "gpu", "backend", "model", "pp512_tps", "tg128_tps"]) == "scoreboard"
    assert layout(["name", "value"]) is None
    assert read_shared_csv("a,b\n1,2\n", "x.csv") is None
    with pytest.raises(InputError, match="at least one row"):
        read_shared_csv("id,gpu,backend,model,pp512_tps,tg128_tps\n", "empty.csv")
    assert number("2062 (rounded)") == 2062 and number("n/a") is None
    assert number("1,234.5") == 1234.5
    assert backend_name("Metal,BLAS") == "Metal" and backend_name("CPU") == "CPU"


def test_published_rows_ran_builds_without_cuda_graphs_on_turing():
    """The published files predate llama.cpp PR #25749 (2026-07), which extended CUDA
    graphs to Volta and Turing: their Turing rows are priced without graphs, a build of
    today's (a user's own llama-bench output) with them; Ampere rows with them both."""
    from dataclasses import replace

    from kvsim.validate.predict import latency_for, setup_for

    by_id = {m.id: m for m in _read("llamabench-scoreboard.csv")[0]}
    turing, ampere = by_id["SB028:tg"], by_id["SB036:tg"]   # Quadro RTX 6000, RTX 3060
    assert turing.cuda_graphs_since == "ampere"
    assert setup_for(turing).cuda_graphs is False and setup_for(ampere).cuda_graphs is True
    today = setup_for(replace(turing, cuda_graphs_since="volta"))
    assert today.cuda_graphs is True
    # the one-token step: launched on the published build, a graph on today's
    old, new = latency_for(setup_for(turing)), latency_for(today)
    assert old.overhead(1) == old.overhead(2) > new.overhead(1)


def test_gpt_oss_ggufs_are_sized_as_llama_cpp_writes_them():
    """ggml-org's gpt-oss GGUFs carry q8_0 beside their MXFP4 experts (llama.cpp's
    MXFP4_MOE file type, "MXFP4 MoE" in llama-bench's model type): the shared file's rows
    say "MXFP4" and print the file's size (11.27 / 59.02 GiB), the held-out ones name the
    type. Read with bf16 beside the experts and scaled to 11.27 GiB, a one-token step read
    3.26 GB where the file holds 2.57 to read, and the fitted MXFP4 bandwidth factor rose
    to 1.37 to make up for it (docs/design/speed-model.md)."""
    from dataclasses import replace

    from kvsim.validate.predict import setup_for

    shared = {m.id: m for m in _read("speed-vs-load.csv")[0]}
    for rid in ("SL0011", "SL0012", "SL0021", "SL0088"):  # 20b and 120b, pp and tg
        assert shared[rid].weight_format == "MXFP4"
        assert setup_for(shared[rid]).weight_format == "mxfp4_moe"
    path = MEAS.parent / "measurements-prs" / "llamacpp-prs.csv"
    prs = {m.id: m for m in read_shared_csv(path.read_text(encoding="utf-8"), path.name)[0]}
    assert setup_for(prs["PRC053"]).weight_format == "mxfp4_moe"
    # without a size, the type the model cell names refines the column's "MXFP4"
    unsized = replace(prs["PRC053"], model_size_bytes=None)
    assert (unsized.model, unsized.weight_format) == \
        ("gpt-oss-20b (gpt-oss 20B MXFP4 MoE)", "MXFP4")
    assert setup_for(unsized).weight_format == "mxfp4_moe"
    assert setup_for(replace(unsized, model="gpt-oss-20b")).weight_format == "mxfp4"


def test_an_ambiguous_card_is_skipped_with_each_profiles_prediction():
    # SB044 "NVIDIA H100 80GB": PCIe or SXM5 is not said, so the row stays out of the
    # summary; its reason gives what kvsim predicts on each, beside the measured value
    from dataclasses import replace

    from kvsim.config.catalog import load_gpu
    from kvsim.validate.predict import predicted_tps, setup_for
    from kvsim.validate.run import validate

    meas, _ = _read("llamabench-scoreboard.csv")
    sb044 = [m for m in meas if m.id.startswith("SB044:")]
    v = validate(sb044)
    assert v.rows == [] and [s.id for s in v.skipped] == ["SB044:pp", "SB044:tg"]
    tg = next(m for m in sb044 if m.id == "SB044:tg")
    pcie, sxm5 = (predicted_tps(tg, setup_for(tg, gpu=load_gpu(g))) for g in
                  ("h100-pcie-80gb", "h100-sxm5-80gb"))
    assert v.skipped[1].reason == (
        "ambiguous: 'NVIDIA H100 80GB' matches h100-pcie-80gb (H100 PCIe 80GB), "
        "h100-sxm5-80gb (H100 SXM5 80GB): name which one; kvsim predicts "
        f"{pcie:,.1f} t/s as h100-pcie-80gb, {sxm5:,.1f} t/s as h100-sxm5-80gb; "
        "measured 267.8")
    assert pcie < tg.value < sxm5
    # a name kvsim does not know keeps its reason as it was
    unknown = next(m for m in meas if m.id == "SB001:tg")
    v = validate([replace(unknown, gpu="NVIDIA H20")])
    assert v.skipped[0].reason.startswith("unknown GPU 'NVIDIA H20'")
    assert "kvsim predicts" not in v.skipped[0].reason


@pytest.mark.parametrize(("settings", "fa"), [
    ("llama-bench -ngl 99 -fa auto -p 512", True),        # auto resolves to on (FA_AUTO)
    ("llama-batched-bench n_ubatch 512, flash_attn -1, ngl all", True),  # -1 is auto
    ("llama-bench -ngl 99 -fa 0", False), ("llama-bench -fa off", False),
    ("llama-bench -fa on", True), ("llama-bench -ngl 99 -p 512", None)])  # not shown
def test_flash_attention_flag_in_settings_text(settings: str, fa: bool | None) -> None:
    from kvsim.validate.records import flash_flag
    from kvsim.validate.shared import _flags

    flags = _flags(settings)
    assert flash_flag(flags.get("-fa", flags.get("flash_attn", ""))) is fa
