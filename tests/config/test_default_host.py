"""The host a scenario gets when it names none follows its GPU.

A discrete card sits in the ``desktop-64gb`` default; a unified-memory GPU (Apple
M-series, Strix Halo, DGX Spark, Jetson) has no separate RAM, so its host is the GPU's
own memory (``<gpu>-unified``: memory and bandwidth from the GPU profile).  A named host
is kept, unless its ``unified_with_gpu`` contradicts the GPU (one-line InputError).
"""

import pytest
import yaml

from kvsim.config.catalog import (
    DEFAULT_HOST,
    default_host,
    list_names,
    load_gpu,
    load_host,
    load_raw,
)
from kvsim.errors import InputError
from kvsim.scenario import load_scenario, resolve_scenario, scenario_hash

GIB = 2**30
ONE_SESSION = "workload.max_sessions=1"


def test_discrete_gpu_without_host_gets_the_desktop_default() -> None:
    s = load_scenario("quickstart", [ONE_SESSION])  # rtx-4060-ti-16gb, no host
    assert (s.host.name, s.host.memory_bytes, s.host.unified_with_gpu) == (
        "desktop-64gb", 64 * GIB, False)
    assert s.host_default is True and DEFAULT_HOST == "desktop-64gb"


def test_unified_gpu_without_host_gets_its_own_memory() -> None:
    # docs/reference/gpus.csv 'NVIDIA DGX Spark (GB10)': 128 GB unified, 273 GB/s
    s = load_scenario("quickstart", [ONE_SESSION, "gpu=dgx-spark"])
    h = s.host
    assert (h.name, h.memory_bytes, h.memory_bandwidth_bytes_per_s) == (
        "dgx-spark-unified", 137_438_953_472, 273e9)
    assert h.unified_with_gpu is True and s.host_default is True and s.link is None
    assert "gpu profile 'dgx-spark'" in h.source


@pytest.mark.parametrize("gpu, shipped, memory_bytes, bandwidth", [
    ("apple-m2-ultra", "apple-m2-ultra-192gb", 192 * GIB, 800e9),
    ("apple-m3-max", "apple-m3-max-128gb", 128 * GIB, 400e9),
    ("apple-m4-max", "apple-m4-max-128gb", 128 * GIB, 546e9),
    ("dgx-spark", "dgx-spark-128gb", 128 * GIB, 273e9),
    ("strix-halo", "strix-halo-128gb", 128 * GIB, 256e9),
    ("jetson-agx-orin-64gb", "jetson-agx-orin-64gb", 64 * GIB, 204.8e9),
])
def test_derived_host_matches_the_shipped_unified_profile(gpu, shipped, memory_bytes,
                                                           bandwidth) -> None:
    got, ship = default_host(load_gpu(gpu)), load_host(shipped)
    assert (got.memory_bytes, got.memory_bandwidth_bytes_per_s) == (memory_bytes, bandwidth)
    assert (ship.memory_bytes, ship.memory_bandwidth_bytes_per_s) == (memory_bytes, bandwidth)
    assert got.cpu_flops == ship.cpu_flops == 0.5e12
    assert got.unified_with_gpu and ship.unified_with_gpu and got.name == f"{gpu}-unified"


def test_every_catalogue_gpu_gets_a_host_of_its_own_kind() -> None:
    kinds = {n: load_gpu(n).unified_memory for n in list_names("gpus")}
    # docs/reference/gpus.csv: six unified-memory SoC rows; gpus-added.csv: 27 Apple, the 780M, Iris
    # Xe
    assert sum(kinds.values()) == 35
    for name, unified in kinds.items():
        host = default_host(load_gpu(name))
        assert host.unified_with_gpu is unified
        assert host.name == (f"{name}-unified" if unified else "desktop-64gb")


def test_a_users_own_unified_gpu_file_gets_its_host_from_that_file(tmp_path) -> None:
    raw = load_raw("gpus", "strix-halo") | {"name": "my-halo-64", "memory_bytes": 64 * GIB,
                                            "gpu_memory_limit_bytes": 48 * GIB}
    path = tmp_path / "my-halo-64.yaml"
    path.write_text(yaml.safe_dump(raw))
    s = load_scenario("quickstart", [ONE_SESSION, f"gpu={path}"])
    assert (s.host.name, s.host.memory_bytes) == ("my-halo-64-unified", 68_719_476_736)


def test_a_named_host_is_kept_and_marked_named() -> None:
    s = load_scenario("quickstart", [ONE_SESSION, "gpu=dgx-spark", "host=dgx-spark-128gb"])
    assert (s.host.name, s.host_default) == ("dgx-spark-128gb", False)
    d = load_scenario("quickstart", [ONE_SESSION, "host=desktop-32gb"])
    assert (d.host.name, d.host.memory_bytes, d.host_default) == ("desktop-32gb", 32 * GIB, False)


@pytest.mark.parametrize("gpu, host, allowed", [
    ("dgx-spark", "desktop-64gb",
     ("the host of dgx-spark's own memory (unified: its host RAM is the GPU's 137438953472 "
      "bytes at 2.73e+11 B/s): one of dgx-spark-128gb, or leave it unset (the GPU's own "
      "memory)")),
    # another SoC's memory of the same size (128 GiB) is not this one's: M4 Max 546 GB/s
    ("dgx-spark", "apple-m4-max-128gb",
     ("the host of dgx-spark's own memory (unified: its host RAM is the GPU's 137438953472 "
      "bytes at 2.73e+11 B/s): one of dgx-spark-128gb, or leave it unset (the GPU's own "
      "memory)")),
    ("rtx-4060-ti-16gb", "apple-m4-max-128gb",
     ("a host with unified_with_gpu: false (rtx-4060-ti-16gb is a discrete card; a unified "
     "host's memory is its own SoC GPU's, not this card's over PCIe: no host tier): one of "
     "desktop-128gb, desktop-32gb, desktop-64gb, or leave it unset")),
])
def test_a_host_of_the_other_memory_kind_is_one_line_error(gpu, host, allowed) -> None:
    with pytest.raises(InputError) as exc:
        load_scenario("quickstart", [ONE_SESSION, f"gpu={gpu}", f"host={host}"])
    e = exc.value
    assert (e.field, e.value, e.allowed) == ("host", host, allowed)
    assert "\n" not in str(e)


def test_a_default_host_follows_the_gpu_when_resolved_again() -> None:
    # what `kvsim compare --gpus` does: dump the resolved scenario, swap the card
    base = load_scenario("quickstart", [ONE_SESSION])
    doc = base.model_dump(mode="json") | {"gpu": "strix-halo"}
    doc.pop("link")
    halo = resolve_scenario(doc)
    assert (halo.host.name, halo.host.memory_bytes, halo.host_default) == (
        "strix-halo-unified", 128 * GIB, True)
    back = resolve_scenario(halo.model_dump(mode="json") | {"gpu": "rtx-4090"})
    assert (back.host.name, back.host_default) == ("desktop-64gb", True)


def test_a_named_host_stays_pinned_when_resolved_again() -> None:
    named = load_scenario("quickstart", [ONE_SESSION, "gpu=dgx-spark", "host=dgx-spark-128gb"])
    doc = named.model_dump(mode="json")
    assert resolve_scenario(doc) == named
    with pytest.raises(InputError, match="^host: 'dgx-spark-128gb' — a host with "
                                         "unified_with_gpu: false"):
        resolve_scenario(doc | {"gpu": "rtx-4090"})


def test_naming_the_default_host_does_not_change_the_hash() -> None:
    unset = load_scenario("quickstart", [ONE_SESSION])
    named = load_scenario("quickstart", [ONE_SESSION, "host=desktop-64gb"])
    assert (unset.host_default, named.host_default) == (True, False)
    assert scenario_hash(unset) == scenario_hash(named)


def test_results_echo_the_host_used() -> None:
    from kvsim.api import simulate

    res = simulate(load_scenario("quickstart", [ONE_SESSION, "gpu=strix-halo"]))
    echoed = res.scenario
    assert (echoed["host"]["name"], echoed["host"]["memory_bytes"]) == (
        "strix-halo-unified", 137_438_953_472)
    assert echoed["host"]["unified_with_gpu"] is True and echoed["host_default"] is True


def test_offload_on_a_unified_default_host_has_no_host_tier() -> None:
    from kvsim.api import simulate

    s = load_scenario("quickstart", [ONE_SESSION, "gpu=strix-halo",
                                     "policies=[{kind: idle_offload}]"])
    with pytest.raises(InputError, match="strix-halo-unified shares memory with the GPU "
                                         r"\(no host tier\)"):
        simulate(s)


def test_a_unified_machine_holds_the_gpu_part_and_the_cpu_kv_in_one_memory() -> None:
    """hardware-and-models.md §3: on a unified machine offload is a capacity question of
    the one memory.  Llama-3.1-70B f16 KV 2 x 80 x 8 x 128 x 2 = 327,680 B/token; with 10
    of 80 layers on the GPU, 70/80 of it (286,720 B/token) stays on the CPU side:
    -c 400,000 (padded to 400,128) -> 114,724,700,160 B = 106.85 GiB, beyond the Jetson's
    64 GiB whatever the GPU part; -c 32,768 -> 9,395,240,960 B = 8.75 GiB, which fits
    next to the GPU part (about 21 GiB)."""
    from kvsim.api import scenario_budget

    base = [ONE_SESSION, "gpu=jetson-agx-orin-64gb", "model=llama-3.1-70b",
            "engine.gpu_layers=10"]
    with pytest.raises(InputError) as exc:
        scenario_budget(load_scenario("quickstart", [*base, "engine.ctx_size=400000"]))
    assert exc.value.field == "engine.context_tokens"
    assert "106.85 GiB of KV on the CPU, more than the 64.00 GiB that " \
           "jetson-agx-orin-64gb-unified shares between them" in exc.value.allowed
    b = scenario_budget(load_scenario("quickstart", [*base, "engine.ctx_size=32768"]))
    assert b.kv_cpu_bytes == 32_768 * 286_720 == 9_395_240_960
    assert b.total_bytes + b.kv_cpu_bytes <= 64 * 2**30
