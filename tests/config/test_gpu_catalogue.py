"""The GPU catalogue: size, provenance, the new speed-model fields, spec-sheet spot checks."""

import pytest

from kvsim.config.catalog import list_names, load_gpu, load_link, load_raw
from kvsim.config.specs import GpuSpec

ARCHITECTURES = {
    "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell", "gcn5", "cdna1",
    "cdna2", "cdna3", "rdna1", "rdna2", "rdna3", "rdna3.5", "rdna4", "xe-lp", "xe-hpg", "xe2",
    "apple-m1", "apple-m2", "apple-m3", "apple-m4"}
GPUS = [load_gpu(n) for n in list_names("gpus")]
GB = 1e9
T = 1e12


def test_at_least_120_profiles_load_as_gpu_specs():
    assert len(GPUS) >= 120
    assert all(isinstance(g, GpuSpec) for g in GPUS)


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_every_profile_has_a_source_and_the_speed_model_fields(gpu):
    assert gpu.source.strip()
    assert gpu.architecture in ARCHITECTURES
    assert gpu.fp32_flops and gpu.fp32_flops > 0
    assert gpu.compute_units and gpu.boost_clock_hz
    assert gpu.aliases, "every profile names what a tool prints for it"


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_fp32_rate_is_units_times_lanes_times_clock(gpu):
    """fp32 = shader lanes x 2 x boost clock, and lanes per SM / CU / core are fixed by
    the architecture: a typo in a core count or clock breaks this."""
    per_unit = gpu.fp32_flops / (gpu.compute_units * gpu.boost_clock_hz)
    allowed = {"turing": {128}, "volta": {128}, "xe-lp": {16},  # GA100 and GP100: 64 lanes
               "ampere": {128, 256}, "pascal": {128, 256}}.get(
        gpu.architecture, {256} if gpu.vendor in ("NVIDIA", "Apple", "Intel") else {128})
    assert round(per_unit) in allowed
    assert per_unit == pytest.approx(round(per_unit), rel=2e-3)


def test_no_alias_is_claimed_by_two_profiles():
    owner: dict[str, str] = {}
    for g in GPUS:
        for name in {g.display_name.lower(), *(a.lower() for a in g.aliases)}:
            assert owner.setdefault(name, g.name) == g.name, f"{name!r}: {owner[name]}, {g.name}"


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_fp32_accumulate_never_beats_fp16_accumulate(gpu):
    assert gpu.fp16_fp32acc_tensor_flops <= gpu.fp16_tensor_flops


def test_geforce_turing_to_blackwell_halve_the_fp32_accumulate_rate():
    geforce = [g for g in GPUS if "GeForce" in g.display_name
               and g.architecture in ("turing", "ampere", "ada", "blackwell")]
    assert len(geforce) >= 40
    for g in geforce:
        assert g.fp16_fp32acc_tensor_flops == pytest.approx(g.fp16_tensor_flops / 2, rel=3e-3), \
            g.name


def test_workstation_and_datacenter_tensor_cores_run_fp32_accumulate_at_full_rate():
    for name in ("quadro-rtx-6000", "rtx-a5000", "rtx-4000-ada", "rtx-pro-4500-blackwell",
                 "tesla-t4", "a10", "a30", "a100-80gb-pcie", "h100-nvl"):
        g = load_gpu(name)
        assert g.fp16_fp32acc_tensor_flops == g.fp16_tensor_flops, name
    l40 = load_gpu("l40")  # datasheet: 181.05 BF16/FP16 (FP32 acc) against L40S's 362
    assert (l40.fp16_tensor_flops, l40.fp16_fp32acc_tensor_flops) == (362.1 * T, 181.05 * T)


@pytest.mark.parametrize("name, memory_gib, bandwidth_gbs", [
    ("rtx-3090", 24, 936),            # NVIDIA GA102 whitepaper
    ("tesla-p40", 24, 347.1),         # 7.2 Gbps GDDR5 x 384-bit
    ("apple-m1-pro-14c", 32, 200),    # Apple newsroom
    ("apple-m3-max-30c", 96, 300),
    ("apple-m3-pro-18c", 36, 150),
    ("apple-m4-pro-20c", 64, 273),
    ("apple-m3-ultra-80c", 512, 819),
    ("instinct-mi100", 32, 1228.8),   # AMD: 1.2288 TB/s
    ("instinct-mi300x", 192, 5300),
    ("rx-7900-xtx", 24, 960),
    ("rtx-2080-ti", 11, 616),
    ("tesla-v100-sxm2-32gb", 32, 900),
    ("a100-80gb-pcie", 80, 1935),
    ("h100-nvl", 94, 3900),
    ("rtx-4060", 8, 272),
])
def test_memory_and_bandwidth_match_the_spec_sheet(name, memory_gib, bandwidth_gbs):
    g = load_gpu(name)
    assert g.memory_bytes == memory_gib * 2**30
    assert g.memory_bandwidth_bytes_per_s == pytest.approx(bandwidth_gbs * GB)


@pytest.mark.parametrize("name, fp16_tflops, int8_tops", [
    ("quadro-rtx-6000", 130.5, 261.0),   # NVIDIA datasheet: 130.5 tensor TFLOPS
    ("tesla-t4", 65.1, 130.3),           # 65 FP16, 130 INT8
    ("tesla-v100-sxm2-16gb", 125.3, None),  # 125 tensor TFLOPS (INT8 only via DP4A)
    ("a30", 165.2, 330.3),               # 165 FP16, 330 INT8
    ("a100-40gb-pcie", 312.0, 624.0),
    ("instinct-mi100", 184.6, 184.6),
    ("instinct-mi300x", 1307.4, 2614.9),
    ("rtx-3070", 81.3, 162.5),           # GA102 whitepaper: 81.3 FP16-acc dense
])
def test_tensor_rates_match_the_spec_sheet(name, fp16_tflops, int8_tops):
    g = load_gpu(name)
    assert g.fp16_tensor_flops == pytest.approx(fp16_tflops * T, rel=2e-3)
    if int8_tops is not None:
        assert g.int8_tensor_ops == pytest.approx(int8_tops * T, rel=2e-3)


def test_parts_without_matrix_units_carry_their_vector_fp16_rate():
    p40, m2 = load_gpu("tesla-p40"), load_gpu("apple-m2-max-38c")
    assert p40.fp16_tensor_flops < p40.fp32_flops / 50  # GP102: FP16 at 1/64 rate
    assert p40.int8_tensor_ops == pytest.approx(47.0 * T)  # NVIDIA: 47 INT8 TOPS (DP4A)
    assert m2.fp16_tensor_flops == m2.fp32_flops == pytest.approx(13.6 * T, rel=2e-3)
    rdna2 = load_gpu("rx-6800-xt")
    assert rdna2.fp16_tensor_flops == pytest.approx(2 * rdna2.fp32_flops, rel=2e-3)
    for g in (p40, m2, rdna2):
        assert "no matrix units" in g.notes


def test_every_apple_m1_to_m4_variant_has_its_own_profile():
    apple = [g for g in GPUS if g.vendor == "Apple"]
    variants = {(g.architecture, g.display_name.split(" (")[0], g.compute_units) for g in apple}
    assert len(variants) == len(apple) == 30  # 15 chips x 2 GPU-core counts
    for chip in ("M1", "M1 Pro", "M1 Max", "M1 Ultra", "M2", "M2 Pro", "M2 Max", "M2 Ultra",
                 "M3", "M3 Pro", "M3 Max", "M3 Ultra", "M4", "M4 Pro", "M4 Max"):
        assert sum(1 for _, c, _ in variants if c == f"Apple {chip}") == 2, chip
    for g in apple:
        assert g.unified_memory and g.default_link is None
        assert g.gpu_memory_limit_bytes == int(0.70 * g.memory_bytes)  # §4: ~65-75 %


def test_binned_apple_chips_have_their_own_bandwidth():
    assert load_gpu("apple-m3-max-30c").memory_bandwidth_bytes_per_s == 300 * GB
    assert load_gpu("apple-m3-max").memory_bandwidth_bytes_per_s == 400 * GB
    assert load_gpu("apple-m4-max-32c").memory_bandwidth_bytes_per_s == 410 * GB
    assert load_gpu("apple-m4-max").memory_bandwidth_bytes_per_s == 546 * GB


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_a_discrete_card_links_at_its_own_pcie_width(gpu):
    if gpu.unified_memory:
        assert gpu.default_link is None and gpu.pcie_gen is None
    else:
        assert gpu.default_link == f"pcie{gpu.pcie_gen}-x{gpu.pcie_lanes}"
        load_link(gpu.default_link)


def test_x8_cards_get_the_x8_link():
    for name in ("rtx-4060", "rtx-5060", "rx-7600", "rx-6600-xt", "arc-b570", "rtx-2000-ada"):
        assert load_gpu(name).default_link.endswith("-x8"), name


def test_reference_rows_keep_their_numbers():
    """The 39 reference profiles gained fields only: spot values from docs/reference/gpus.csv."""
    raw = load_raw("gpus", "rtx-4090")
    assert (raw["memory_bandwidth_bytes_per_s"], raw["fp16_tensor_flops"]) == (1008e9, 330.3e12)
    assert raw["architecture"] == "ada" and raw["compute_units"] == 128
    assert load_gpu("apple-m3-max").fp16_tensor_flops == pytest.approx(16.4 * T)


def test_l20_from_its_spec_page():
    # NVIDIA L20 (engine-memory-logs rows sglang-003..005 run 8 and 2 x 8 of them):
    # 48 GB GDDR6 on 384 bits at 864 GB/s, PCIe 4.0 x16, 275 W, 11,776 shaders at 2,520 MHz
    # = 92 SMs, FP32 11,776 x 2 x 2.52 GHz = 59.35 TFLOPS (technical.city / TechPowerUp).
    # Tensor rates DERIVED from the L40 row's Ada SM: 1,024 FLOP/clk/SM x 92 x 2.52 GHz
    from kvsim.config.gpu_names import resolve_gpu
    g = load_gpu("l20")
    assert (g.memory_bytes, g.memory_bandwidth_bytes_per_s, g.compute_units,
            g.default_link) == (48 * 2**30, 864e9, 92, "pcie4-x16")
    assert g.fp32_flops == pytest.approx(59.35e12, rel=1e-3)
    assert g.fp16_tensor_flops == 237.4 * T and "DERIVED" in g.notes
    m = resolve_gpu("2 nodes x 8x NVIDIA L20 (PCIe 4.0)")
    assert (m.slug, m.count) == ("l20", 16)
