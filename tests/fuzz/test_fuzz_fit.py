"""Fuzz: ``kvsim fit`` flags — names, numbers, sizes and switches with good, edge and wrong
values (the fast path: no simulation runs).

Each run must exit 0 or print one ``error:`` line and exit 2 (tests/fuzz/conftest.py).
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz.helpers import FUZZ

NUMBERS = ["0", "-1", "1", "2", "4", "8192", "32Ki", "32k", "131072", "524288", "1e99", "1e9",
           "nan", "inf", "-inf", "1.5", "", " ", "x", "0x10", "1_000", "２", "9" * 40]
SIZES = ["0", "1 GiB", "400 MiB", "100 TiB", "-1 GiB", "nan GiB", "1e99", "x", "1.5 KB", ""]
FLAGS = {
    "--gpu": st.sampled_from(["rtx-4090", "rtx-3060-12gb", "apple-m2-8c", "rtx4090", "", "ü"]),
    "--model": st.sampled_from(["llama-3.1-8b", "gemma-3-4b", "mamba-2-2.7b", "gpt-oss-20b",
                                "deepseek-v2-lite", "config.json", "x.yaml", ""]),
    "--weights": st.sampled_from(["q4_k_m", "bf16", "fp8", "awq", "mxfp4", "q9", ""]),
    "--engine": st.sampled_from(["llama.cpp", "ollama", "vllm", "sglang", "tgi"]),
    "--context": st.sampled_from(NUMBERS), "--parallel": st.sampled_from(NUMBERS),
    "--gpu-layers": st.sampled_from(NUMBERS),
    "--kv": st.sampled_from(["f16", "q8_0", "q4_0", "fp8", "bf16", "q2", ""]),
    "--kv-k": st.sampled_from(["q8_0", "q4_0", "iq4_nl", "x"]),
    "--kv-v": st.sampled_from(["q8_0", "f32", "x"]),
    "--gpu-util": st.sampled_from(["0.9", "0", "1", "1.5", "-0.1", "nan", "inf", "x"]),
    "--ollama-version": st.sampled_from(["0.33.0", "0.1.0", "99.0", "x", ""]),
    "--display-reserve": st.sampled_from(SIZES), "--driver-reserve": st.sampled_from(SIZES),
    "--host": st.sampled_from(["desktop-32gb", "dgx-spark-128gb", "nope"]),
}
SWITCHES = ["--kv-unified", "--no-kv-unified", "--flash-attn", "--no-flash-attn", "--hybrid-kv",
            "--no-hybrid-kv", "--json", "--bogus"]


@st.composite
def fit_argv(draw: st.DrawFn) -> list[str]:
    argv = ["fit"]
    if draw(st.integers(0, 9)) < 9:
        argv += ["--gpu", "rtx-4090"]
    if draw(st.integers(0, 9)) < 9:
        argv += ["--model", "llama-3.1-8b"]
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=4, unique=True)):
        argv += [flag, draw(FLAGS[flag])]
    argv += draw(st.lists(st.sampled_from(SWITCHES), max_size=2))
    return argv


@settings(FUZZ, max_examples=150)
@given(argv=fit_argv())
@example(argv=["fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b", "--context", "1e99"])
@example(argv=["fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b", "--parallel", "nan"])
def test_fit_flags(clean_exit, argv):
    clean_exit(argv)
