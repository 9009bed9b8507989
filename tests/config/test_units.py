"""Unit strings → SI (kvsim.config.units)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsim.config.units import (
    format_bytes,
    parse_bandwidth,
    parse_bytes,
    parse_count,
    parse_duration,
)
from kvsim.errors import InputError


@pytest.mark.parametrize("text,value", [
    ("24 GiB", 24 * 2**30), ("512 MB", 512_000_000), ("17.00 MiB", 17 * 2**20), (1024, 1024),
    ("1.5kB", 1500), ("0", 0), ("8192 MiB", 8 * 2**30)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text,value", [("25 GB/s", 25e9), ("1.5 TB/s", 1.5e12),
                                        ("12.5GB/s", 12.5e9), (1e9, 1e9)])
def test_parse_bandwidth(text, value):
    assert parse_bandwidth(text) == value


@pytest.mark.parametrize("text,value", [("5 ms", 0.005), ("2s", 2.0), ("30 min", 1800.0),
                                        ("7.5 us", 7.5e-6), (3, 3.0)])
def test_parse_duration(text, value):
    assert parse_duration(text) == pytest.approx(value)


@pytest.mark.parametrize("text,value", [("32k", 32768), ("32Ki", 32768), ("1M", 2**20), ("8k", 8192), (4096, 4096)])
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("fn,bad", [
    (parse_bytes, "24 GiBs"), (parse_bytes, "lots"), (parse_bytes, "-1 GiB"),
    (parse_bandwidth, "25 GB"), (parse_duration, "5 parsecs"), (parse_count, "1.5"),
    (parse_count, "12q"), (parse_bytes, True)])
def test_malformed_units_are_input_errors(fn, bad):
    with pytest.raises(InputError) as err:
        fn(bad, "field")
    assert err.value.field == "field" and "\n" not in err.value.one_line()


def test_format_bytes_as_engines_print():
    assert format_bytes(17 * 2**20) == "17.00 MiB"
    assert format_bytes(24 * 2**30) == "24.00 GiB"


@given(st.integers(0, 2**50))
def test_bytes_roundtrip_integers(n):
    assert parse_bytes(f"{n} B") == n


@pytest.mark.parametrize(("text", "binary", "decimal"), [
    ("16G", "16 GiB", "16 GB"), ("512 m", "512 MiB", "512 MB"), ("4k", "4 KiB", "4 KB")])
def test_a_bare_prefix_is_refused_with_both_readings(text, binary, decimal):
    # llama.cpp, Ollama and nvidia-smi mean GiB by "G"; other tools mean 10^9
    with pytest.raises(InputError) as e:
        parse_bytes(text, "engine.cache_ram_bytes")
    line = e.value.one_line()
    assert e.value.field == "engine.cache_ram_bytes" and binary in line and decimal in line


def test_kubernetes_style_binary_units():
    assert parse_bytes("16Gi") == 16 * 2**30 and parse_bytes("512 Mi") == 512 * 2**20
