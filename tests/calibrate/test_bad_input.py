"""Bad flags of ``kvsim replay`` and ``kvsim calibrate`` are one line and exit code 2,
refused before anything connects (audit B17, C24, C25, D35, D40)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim.engines.startup_log import read_log_text
from kvsim.errors import InputError

# nothing listens on port 9 (discard): a check that passes would fail to connect, with
# another message, so each case below proves the flag is refused first
URL = "http://127.0.0.1:9"
URL_HELP = "an http:// or https:// base URL with a host, e.g. http://127.0.0.1:8080"


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    from kvsim.workload.generator import generate
    from kvsim.workload.io import write_trace
    from kvsim.workload.preset import load_preset
    from kvsim.workload.schema import TraceMeta

    p = tmp_path / "t.jsonl"
    write_trace(p, generate(load_preset("family-4"), 1.0, 0), TraceMeta(source="test"))
    return p


@pytest.mark.parametrize("url, why", [("http://[::1", f"not a valid URL; {URL_HELP}"),
                                      ("ftp://host", URL_HELP), ("localhost:8080", URL_HELP)])
def test_a_bad_url_is_refused_by_replay_and_calibrate(tmp_path, trace, kvsim_cli, url, why):
    for argv in (["replay", trace, "--url", url, "-o", tmp_path / "o"],
                 ["calibrate", "engine", "--url", url, "-o", tmp_path / "e.json"]):
        rc, err, _ = kvsim_cli(*argv)
        assert (rc, err) == (2, f"error: --url: '{url}' — {why}")


@pytest.mark.parametrize("flag, value, why", [
    ("--time-scale", "nan", "a finite number > 0"),
    ("--time-scale", "inf", "a finite number > 0"),
    ("--time-scale", "0", "a finite number > 0"),
    ("--max-sessions", "-3", "an integer >= 1 (omit it to replay every session)"),
    ("--max-sessions", "0", "an integer >= 1 (omit it to replay every session)"),
])
def test_replay_numbers(tmp_path, trace, kvsim_cli, flag, value, why):
    rc, err, _ = kvsim_cli("replay", trace, "--url", URL, flag, value, "-o", tmp_path / "o")
    assert rc == 2 and err.startswith(f"error: {flag}: ") and err.endswith(f" — {why}")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags, expected", [
    (["--contexts", "1,-5"], "--contexts: '1,-5' — a comma-separated list of integers >= 0"),
    (["--contexts", "a"], "--contexts: 'a' — a comma-separated list of integers >= 0"),
    (["--prompts", "0"], "--prompts: '0' — a comma-separated list of integers >= 1"),
    (["--cache-type", "q9"], ("--cache-type: 'q9' — the server's -ctk, one of f32, f16, bf16, "
                             "q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1")),
    (["--cache-type", ""], ("--cache-type: '' — the server's -ctk, one of f32, f16, bf16, "
                           "q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1")),
])
def test_calibrate_engine_flags(tmp_path, kvsim_cli, flags, expected):
    rc, err, _ = kvsim_cli("calibrate", "engine", "--url", URL, *flags,
                           "-o", tmp_path / "e.json")
    assert (rc, err) == (2, f"error: {expected}")


def test_calibrate_kernels_with_no_cache_type(tmp_path, kvsim_cli):
    rc, err, _ = kvsim_cli("calibrate", "kernels", "--model", "llama-3.2-1b",
                           "--cache-types", " , ", "-o", tmp_path / "k.json")
    assert (rc, err) == (2, ("error: --cache-types: ' , ' — an empty list; give one or more "
                            "of f16, q8_0, q4_0"))


VLLM = "INFO GPU KV cache size: 1,000 tokens\n"
LLAMA = "llama_context: n_ctx = 4096\n"
BUF = "llama_kv_cache: CUDA0 KV buffer size = 512.00 MiB\n"


def test_a_log_of_two_engines_is_refused(tmp_path, kvsim_cli):
    log = tmp_path / "mix.log"
    log.write_text(VLLM + LLAMA + BUF)
    rc, err, _ = kvsim_cli("calibrate", "from-log", log)
    assert (rc, err) == (2, (f"error: log: '{log}' — holds both vLLM and llama.cpp startup "
                            "lines (vLLM: kv_cache_tokens); give one engine's log"))


def test_a_log_of_several_startups_reads_the_last_not_the_sum():
    """Ollama's server.log keeps every model load; an appended llama-server log every
    start: the facts are the last startup's, never a sum over startups."""
    build = "build: 6002 (a1b2c3d4) with cc for x86_64-linux-gnu\n"
    facts = read_log_text(build + LLAMA + BUF + build + LLAMA.replace("4096", "8192")
                          + BUF.replace("512.00", "1024.00"), "two.log")
    assert (facts.n_ctx, facts.kv_buffers) == (8192, {"CUDA0": 1024 * 2**20})
    ollama = (Path(__file__).parent / "fixtures" / "ollama.log").read_text()
    assert read_log_text(ollama + ollama) == read_log_text(ollama)


def test_a_second_context_of_one_startup_is_not_added():
    # a draft model's context prints its own buffer after the served model's
    facts = read_log_text(LLAMA + BUF + BUF.replace("512.00", "64.00"))
    assert facts.kv_buffers == {"CUDA0": 512 * 2**20}


def test_one_buffer_per_device_and_cache_is_summed():
    # an SWA model: the non-SWA and the SWA cache each print the device's buffer
    swa = "llama_kv_cache_iswa: creating     SWA KV cache, size = 1024 cells\n"
    facts = read_log_text(LLAMA + BUF + swa + BUF.replace("512.00", "128.00"))
    assert facts.kv_buffers == {"CUDA0": 640 * 2**20}
    two_devices = read_log_text(LLAMA + BUF + BUF.replace("CUDA0", "CUDA1"))
    assert two_devices.kv_buffer_bytes == 1024 * 2**20


def test_replay_options_check_their_fields_without_the_cli():
    """The library refuses what the CLI refuses (nothing connects)."""
    from kvsim.calibrate.replay import ReplayOptions
    with pytest.raises(InputError, match="--url: 'http://\\[::1' — not a valid URL"):
        ReplayOptions(url="http://[::1")
    for bad in (0.0, float("nan"), float("inf")):
        with pytest.raises(InputError, match="--time-scale: .* — a finite number > 0"):
            ReplayOptions(url="http://127.0.0.1:9", time_scale=bad)
    assert ReplayOptions(url="http://127.0.0.1:9/").url == "http://127.0.0.1:9"
