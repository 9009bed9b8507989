"""resolve_gpu: published device strings -> catalogue slugs, or why not."""

import csv
from pathlib import Path

import pytest

from kvsim.config.catalog import list_names, load_gpu
from kvsim.config.gpu_names import GpuMatch, resolve_gpu

MEASUREMENTS = Path(__file__).parents[2] / "docs" / "reference" / "measurements"

# Every `gpu` string of docs/reference/measurements that names one catalogued device, as printed.
PUBLISHED = {
    # llamabench-scoreboard.csv
    "AMD Instinct MI100": "instinct-mi100",
    "AMD Instinct MI50 32GB": "instinct-mi50-32gb",
    "AMD Radeon 780M iGPU": "radeon-780m",
    "AMD Radeon 8060S iGPU (Ryzen AI Max+ 395, Strix Halo)": "strix-halo",
    "AMD Radeon AI PRO R9700": "radeon-ai-pro-r9700",
    "AMD Radeon PRO V620": "radeon-pro-v620",
    "AMD Radeon RX 5700 XT": "rx-5700-xt",
    "AMD Radeon RX 7900 XTX": "rx-7900-xtx",
    "AMD Radeon RX 9070": "rx-9070",
    "AMD Radeon RX 9070 XT": "rx-9070-xt",
    "Apple M1 Max (24-core GPU)": "apple-m1-max-24c",
    "Apple M1 Max (32-core GPU)": "apple-m1-max-32c",
    "Apple M1 Pro (14-core GPU)": "apple-m1-pro-14c",
    "Apple M1 Pro (16-core GPU)": "apple-m1-pro-16c",
    "Apple M1 Ultra (48-core GPU)": "apple-m1-ultra-48c",
    "Apple M1 Ultra (64-core GPU)": "apple-m1-ultra-64c",
    "Apple M2 (10-core GPU)": "apple-m2-10c",
    "Apple M2 (8-core GPU)": "apple-m2-8c",
    "Apple M2 Pro (16-core GPU)": "apple-m2-pro-16c",
    "Apple M2 Pro (19-core GPU)": "apple-m2-pro-19c",
    "Apple M3 Max (30-core GPU)": "apple-m3-max-30c",
    "Apple M3 Max (40-core GPU)": "apple-m3-max",
    "Apple M3 Ultra (60-core GPU)": "apple-m3-ultra-60c",
    "Apple M3 Ultra (80-core GPU)": "apple-m3-ultra-80c",
    "Apple M4 (10-core GPU)": "apple-m4-10c",
    "Apple M4 Max (32-core GPU)": "apple-m4-max-32c",
    "Apple M4 Max (40-core GPU)": "apple-m4-max",
    "Apple M4 Pro (16-core GPU)": "apple-m4-pro-16c",
    "Apple M4 Pro (20-core GPU)": "apple-m4-pro-20c",
    "Intel Arc A770": "arc-a770-16gb",
    "Intel Arc A770 (Windows)": "arc-a770-16gb",
    "Intel Iris Xe iGPU (Tiger Lake)": "iris-xe-96eu",
    "NVIDIA A30": "a30",
    "NVIDIA DGX Spark": "dgx-spark",
    "NVIDIA GeForce RTX 3060 12GB": "rtx-3060-12gb",
    "NVIDIA GeForce RTX 4060 Ti 16GB": "rtx-4060-ti-16gb",
    "NVIDIA GeForce RTX 4070": "rtx-4070",
    "NVIDIA GeForce RTX 4070 SUPER": "rtx-4070-super",
    "NVIDIA GeForce RTX 4080": "rtx-4080",
    "NVIDIA GeForce RTX 4080 SUPER": "rtx-4080-super",
    "NVIDIA GeForce RTX 4090 D": "rtx-4090-d",
    "NVIDIA GeForce RTX 5060 Ti 16GB": "rtx-5060-ti-16gb",
    "NVIDIA GeForce RTX 5080": "rtx-5080",
    "NVIDIA GeForce RTX 5090": "rtx-5090",
    "NVIDIA Quadro RTX 6000": "quadro-rtx-6000",
    "NVIDIA RTX 6000 Ada Generation": "rtx-6000-ada",
    "NVIDIA RTX A5000": "rtx-a5000",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition (500 W limit)": "rtx-pro-6000-blackwell",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition (600 W limit)": "rtx-pro-6000-blackwell",
    # speed-vs-load.csv
    "A100 PCIe 80GB": "a100-80gb-pcie",
    "A100 SXM 80GB": "a100-80gb-sxm4",
    "H100 PCIe 80GB": "h100-pcie-80gb",
    "L40S 48GB": "l40s",
    "NVIDIA DGX Spark (GB10, 128 GB LPDDR5x unified)": "dgx-spark",
    **{f"NVIDIA GeForce RTX 5090 (GPU {i} of 8)": "rtx-5090" for i in range(8)},
    "3x NVIDIA GeForce RTX 4090, all slots PCIe Gen4 x16": "rtx-4090",
    "RTX 3070 8GB": "rtx-3070",
    "RTX 3080 10GB": "rtx-3080-10gb",
    "RTX 3080 Ti 12GB": "rtx-3080-ti",
    "RTX 4000 Ada 20GB": "rtx-4000-ada",
    "RTX 4080 16GB": "rtx-4080",
    "RTX 5000 Ada 32GB": "rtx-5000-ada",
    "RTX 6000 Ada 48GB": "rtx-6000-ada",
    # engine-memory-logs.csv
    "1x NVIDIA GeForce RTX 3090": "rtx-3090",
    "1x NVIDIA GeForce RTX 4090D (SM89)": "rtx-4090-d",
    "1x NVIDIA GeForce RTX 5060 Ti 16GB (Windows, headless)": "rtx-5060-ti-16gb",
    "NVIDIA GeForce RTX 4090 (4 workers -> TP=4 inferred)": "rtx-4090",
    "8x NVIDIA L20": "l20",
}
# Published strings that name no single catalogued device, and the start of the reason.
NOT_ONE = {
    "NVIDIA Tesla V100 32 GB": "ambiguous: 'NVIDIA Tesla V100 32 GB' matches tesla-v100-pcie-32gb",
    "NVIDIA H100 80GB": "ambiguous: 'NVIDIA H100 80GB' matches h100-pcie-80gb",
    "1x NVIDIA A100": "ambiguous: 'NVIDIA A100' matches a100-40gb-pcie",
    "8x NVIDIA H20": "unknown GPU 'NVIDIA H20' (closest: ",
    "not shown": "unknown GPU 'not shown'",
    "1x NVIDIA GPU (model not seen)": "unknown GPU 'NVIDIA GPU (model not seen)': no device",
}
# Tool-printed names (nvidia-smi / CUDA, ROCm / Vulkan, Metal, Intel) and loose spellings.
PRINTED = {
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA A100-SXM4-80GB": "a100-80gb-sxm4",
    "NVIDIA A100 80GB PCIe": "a100-80gb-pcie",
    "NVIDIA H100 80GB HBM3": "h100-sxm5-80gb",
    "NVIDIA H100 PCIe": "h100-pcie-80gb",
    "Tesla V100-PCIE-32GB": "tesla-v100-pcie-32gb",
    "Tesla V100-SXM2-16GB": "tesla-v100-sxm2-16gb",
    "Radeon RX 7900 XTX": "rx-7900-xtx",
    "AMD Radeon RX 7900 XTX (RADV NAVI31)": "rx-7900-xtx",
    "Intel(R) Arc(TM) A770 Graphics": "arc-a770-16gb",
    "Intel(R) Arc(TM) B580 Graphics": "arc-b580",
    "NVIDIA GeForce RTX 4090 Laptop GPU": "rtx-4090-laptop",
    "RTX 4090 Mobile": "rtx-4090-laptop",
    "rx7900xtx": "rx-7900-xtx",
    "rtx-4070-TI": "rtx-4070-ti",
    "apple-m3-max-40c": "apple-m3-max",
    "Apple M2 Max 96GB": "apple-m2-max-38c",  # only the 38-core M2 Max was sold with 96 GB
    "RTX 3090 FE": "rtx-3090",                 # "FE" is no word of any profile
    "Arc A770 8GB": "arc-a770-8gb",
}


@pytest.mark.parametrize("text, slug", PUBLISHED.items())
def test_published_strings_resolve(text, slug):
    m = resolve_gpu(text)
    assert (m.slug, m.reason) == (slug, "")


@pytest.mark.parametrize("text, slug", PRINTED.items())
def test_tool_printed_names_and_loose_spellings_resolve(text, slug):
    assert resolve_gpu(text).slug == slug


def test_every_scoreboard_and_speed_string_is_in_the_tables():
    if not MEASUREMENTS.is_dir():
        pytest.skip("docs/reference/measurements not beside the checkout")
    seen = set()
    for name in ("llamabench-scoreboard.csv", "speed-vs-load.csv"):
        with open(MEASUREMENTS / name, encoding="utf-8") as fh:
            seen |= {r["gpu"] for r in csv.DictReader(fh)}
    assert seen <= set(PUBLISHED) | set(NOT_ONE)


@pytest.mark.parametrize("text, reason", NOT_ONE.items())
def test_published_strings_that_name_no_single_profile_say_why(text, reason):
    m = resolve_gpu(text)
    assert m.slug is None and m.reason.startswith(reason), m.reason


def test_every_slug_display_name_and_alias_resolves_to_its_own_profile():
    for slug in list_names("gpus"):
        g = load_gpu(slug)
        for text in (slug, slug.upper(), g.display_name, *g.aliases):
            assert resolve_gpu(text) == GpuMatch(slug, 1), text


@pytest.mark.parametrize("text, slug", [
    ("RTX 4070", "rtx-4070"), ("RTX 4070 Ti", "rtx-4070-ti"),
    ("RTX 4070 SUPER", "rtx-4070-super"), ("RTX 4070 Ti SUPER", "rtx-4070-ti-super"),
    ("RX 7900 XT", "rx-7900-xt"), ("RX 7900 XTX", "rx-7900-xtx"),
    ("RTX 4090", "rtx-4090"), ("RTX 4090 D", "rtx-4090-d"),
    ("L40", "l40"), ("L40S", "l40s"), ("A10", "a10"), ("A100 PCIe 40GB", "a100-40gb-pcie"),
])
def test_a_near_miss_never_resolves_to_the_neighbouring_card(text, slug):
    assert resolve_gpu(text).slug == slug


@pytest.mark.parametrize("text", ["RTX 5090 D", "RTX 5070 Ti SUPER", "GTX 1660 Ti", "RX 7950 XTX"])
def test_a_card_kvsim_lacks_is_unknown_not_its_neighbour(text):
    m = resolve_gpu(text)
    assert m.slug is None and m.reason.startswith(f"unknown GPU {text!r} (closest: ")


@pytest.mark.parametrize("text, slug", [
    ("RTX 3060 12GB", "rtx-3060-12gb"), ("RTX 3060 8GB", "rtx-3060-8gb"),
    ("Tesla V100 PCIe 16GB", "tesla-v100-pcie-16gb"),
    ("Tesla V100 PCIe 32GB", "tesla-v100-pcie-32gb"),
    ("MI50 16GB", "instinct-mi50-16gb"), ("AMD Instinct MI50 32GB", "instinct-mi50-32gb"),
    ("RTX 4060 Ti 8GB", "rtx-4060-ti-8gb"), ("RTX 3090 23.58GiB", "rtx-3090"),
])
def test_memory_in_the_name_picks_the_variant(text, slug):
    assert resolve_gpu(text).slug == slug


def test_apple_family_names_need_the_core_count():
    m = resolve_gpu("Apple M2 Max")
    assert m == GpuMatch(None, 1, "ambiguous: 'Apple M2 Max' is sold with 30- or 38-core "
                         "GPUs; name the core count, e.g. 'Apple M2 Max (38-core GPU)'",
                         ("apple-m2-max-30c", "apple-m2-max-38c"))
    assert resolve_gpu("Apple M2 Max (30-core GPU)").slug == "apple-m2-max-30c"
    assert resolve_gpu("Apple M4 Max (36-core GPU)").reason.startswith(
        "unknown GPU 'Apple M4 Max (36-core GPU)': kvsim has apple-m4-max")


def test_a_name_sold_with_several_memory_sizes_needs_the_size():
    assert resolve_gpu("NVIDIA GeForce RTX 3060").reason == (
        "ambiguous: 'NVIDIA GeForce RTX 3060' is sold with 8 or 12 GB; name the memory, "
        "e.g. 'NVIDIA GeForce RTX 3060 12GB'")
    # only the 12 GB RTX 2060 is catalogued; the plain (6 GB) card must not become it
    assert resolve_gpu("RTX 2060").reason == (
        "ambiguous: 'RTX 2060' also names cards kvsim does not have; kvsim has the 12 GB "
        "one (rtx-2060-12gb): name the memory, e.g. 'RTX 2060 12GB'")
    # the GTX 1060 3GB is a cut-down chip of its own: only the 6 GB card is catalogued
    assert resolve_gpu("GTX 1060").reason == (
        "ambiguous: 'GTX 1060' also names cards kvsim does not have; kvsim has the 6 GB "
        "one (gtx-1060-6gb): name the memory, e.g. 'GTX 1060 6GB'")
    assert resolve_gpu("NVIDIA GeForce GTX 1060 6GB").slug == "gtx-1060-6gb"
    assert resolve_gpu("NVIDIA GeForce GTX 1060 3GB").slug is None
    assert resolve_gpu("RTX 4090 48GB").reason == (
        "unknown GPU 'RTX 4090 48GB': kvsim has rtx-4090 (GeForce RTX 4090), not a 48 GB "
        "variant")


@pytest.mark.parametrize("text, candidates", [
    ("4x NVIDIA H100", ("h100-nvl", "h100-pcie-80gb", "h100-sxm5-80gb")),
    ("NVIDIA A100 80GB", ("a100-80gb-pcie", "a100-80gb-sxm4")),
    ("NVIDIA GeForce RTX 3060", ("rtx-3060-12gb", "rtx-3060-8gb")),
    ("RTX 2060", ()),                       # the 6 GB card is not catalogued
    ("2x NVIDIA H100, 1x RTX 3090", ()),    # not one kind of device
    ("NVIDIA H20", ()),                     # unknown
    ("RTX 3090", ()),                       # resolved
])
def test_an_ambiguous_name_lists_the_profiles_it_fits(text, candidates):
    assert resolve_gpu(text).candidates == candidates


@pytest.mark.parametrize("text, slug, count", [
    ("2x NVIDIA GeForce RTX 3090", "rtx-3090", 2),
    ("NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX 3090", "rtx-3090", 2),  # llama-bench
    ("3x NVIDIA GeForce RTX 4090, all slots PCIe Gen4 x16", "rtx-4090", 3),
    ("6x NVIDIA GeForce RTX 3090 (TP=4 used), VFIO passthrough, 250W cap", "rtx-3090", 6),
    ("4x NVIDIA GeForce GTX 1080 (model on CUDA0 only)", "gtx-1080", 4),
    ("NVIDIA GeForce RTX 5090 (GPU 0 of 8)", "rtx-5090", 1),
])
def test_the_number_of_devices_named_is_counted(text, slug, count):
    assert resolve_gpu(text) == GpuMatch(slug, count)


def test_counts_survive_a_failed_resolution():
    assert resolve_gpu("4x NVIDIA H100").count == 4
    assert resolve_gpu("2 nodes x 8x NVIDIA L20 (PCIe 4.0)").count == 16
    mixed = resolve_gpu("NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX 4090")
    assert mixed == GpuMatch(None, 2, "several kinds of device in 'NVIDIA GeForce RTX 3090, "
                             "NVIDIA GeForce RTX 4090': rtx-3090, rtx-4090")
