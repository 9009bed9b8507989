"""Several GPUs in a scenario: how they are named, the default link, and the refusals."""

from __future__ import annotations

import pytest

from kvsim.config.catalog import list_names, load_gpu, load_gpu_link
from kvsim.config.gpu_set import default_gpu_link, gpu_items, gpu_set_display, gpu_set_label
from kvsim.errors import InputError
from kvsim.scenario import load_scenario, scenario_hash


@pytest.mark.parametrize(("text", "names"), [
    ("rtx-3090", ["rtx-3090"]),
    ("2x rtx-3090", ["rtx-3090", "rtx-3090"]),
    ("2X rtx-3090", ["rtx-3090", "rtx-3090"]),
    ("rtx-3090+rtx-3060-12gb", ["rtx-3090", "rtx-3060-12gb"]),
    ("2x rtx-3090+rtx-3060-12gb", ["rtx-3090", "rtx-3090", "rtx-3060-12gb"]),
    (["rtx-3090", "2x rtx-4090"], ["rtx-3090", "rtx-4090", "rtx-4090"]),
])
def test_gpu_items_in_device_order(text, names):
    assert gpu_items(text) == names


@pytest.mark.parametrize(("text", "allowed"), [
    ("0x rtx-3090", "a GPU count from 1 to 16"),
    ("17x rtx-3090", "a GPU count from 1 to 16"),
    ("rtx-3090+", "joined by '+'"),
    ([], "at least one GPU"),
    (["rtx-3090"] * 17, "at most 16 GPUs"),
])
def test_bad_sets_name_the_field_and_what_is_allowed(text, allowed):
    with pytest.raises(InputError) as e:
        gpu_items(text)
    assert e.value.field == "gpu" and allowed in e.value.one_line()


def test_label_round_trips():
    names = gpu_items("rtx-3090+rtx-3090+rtx-3060-12gb")
    assert gpu_set_label(names) == "2x rtx-3090+rtx-3060-12gb"
    assert gpu_items(gpu_set_label(names)) == names
    assert gpu_set_display([load_gpu(n) for n in names]) == \
        "2 × GeForce RTX 3090 + GeForce RTX 3060 12GB"


def test_default_link_is_the_slowest_cards_pcie_staged_on_geforce():
    # GeForce: P2P off in stock drivers -> staged through host; the 4060 Ti is x8
    assert default_gpu_link((load_gpu("rtx-4090"), load_gpu("rtx-4090"))) == "pcie4-x16-host"
    assert default_gpu_link((load_gpu("rtx-4090"), load_gpu("rtx-4060-ti-16gb"))) \
        == "pcie4-x8-host"
    assert default_gpu_link((load_gpu("rtx-a6000"), load_gpu("rtx-a6000"))) == "pcie4-x16-p2p"
    assert default_gpu_link((load_gpu("rtx-3090"),)) is None


def test_measured_links_carry_the_measured_rates():
    # docs/reference/measurements/speed-vs-load.csv SL0388-SL0399: bidirectional / 2
    assert load_gpu_link("pcie4-x16-host").bytes_per_s == pytest.approx(25.84e9 / 2, rel=1e-3)
    assert load_gpu_link("pcie4-x16-p2p").bytes_per_s == pytest.approx(41.37e9 / 2, rel=1e-3)
    for name in list_names("gpu_links"):
        link = load_gpu_link(name)
        assert link.source and (link.kind == "nvlink") == name.startswith("nvlink")


def test_scenario_resolves_a_set_and_a_one_gpu_scenario_keeps_its_hash():
    one = load_scenario("quickstart")
    assert one.gpus == (one.gpu,) and one.gpu_link is None
    same = load_scenario("quickstart", [f"gpu=1x {one.gpu.name}"])
    assert scenario_hash(same) == scenario_hash(one)
    two = load_scenario("quickstart", ["gpu=2x rtx-3090"])
    assert [g.name for g in two.gpus] == ["rtx-3090", "rtx-3090"]
    assert two.gpu_link is not None and two.gpu_link.name == "pcie4-x16-host"
    assert scenario_hash(two) != scenario_hash(load_scenario("quickstart", ["gpu=rtx-3090"]))
    again = load_scenario("quickstart", ["gpu=2x rtx-3090", "gpu_link=nvlink3-bridge"])
    assert again.gpu_link is not None and again.gpu_link.kind == "nvlink"


@pytest.mark.parametrize(("sets", "field", "allowed"), [
    (["gpu=2x rtx-4090", "gpu_link=nvlink3-bridge"], "gpu_link",
     "no NVLink connector on rtx-4090"),
    (["gpu=2x rtx-3090", "gpu_link=pcie5-x16-p2p"], "gpu_link", "PCIe 4.0 x16 or slower"),
    (["gpu=rtx-3090", "gpu_link=pcie4-x16-p2p"], "gpu_link", "needs two or more GPUs"),
    (["gpu=2x rtx-3090", "engine.tensor_split=[1]"], "engine.tensor_split",
     "one share per GPU"),
    (["gpu=2x rtx-3090", "engine.tensor_split=[0,0]"], "engine.tensor_split",
     "summing to more"),
    (["gpu=2x rtx-3090", "engine.main_gpu=2"], "engine.main_gpu", "from 0 to 1"),
    (["gpu=2x rtx-3090", "engine=vllm", "engine.tensor_parallel_size=1"],
     "engine.tensor_parallel_size", "must equal the scenario's GPUs (2)"),
    (["gpu=3x rtx-3090", "engine=vllm", "engine.pipeline_parallel_size=2"],
     "engine.tensor_parallel_size", "(1 x 2 = 2) must equal the scenario's GPUs (3)"),
    (["gpu=2x rtx-3090", "engine=vllm", "engine.tensor_parallel_size=4"],
     "engine.tensor_parallel_size", "(4 x 1 = 4)"),
    (["gpu=2x rtx-3090", "engine=ollama", "engine.tensor_split=[1,1]"],
     "engine.tensor_split", "not a knob of the ollama preset"),
])
def test_knobs_that_disagree_with_the_gpus_are_refused(sets, field, allowed):
    with pytest.raises(InputError) as e:
        load_scenario("quickstart", sets)
    assert e.value.field == field and allowed in e.value.one_line()


def test_paged_ranks_match_the_gpus():
    s = load_scenario("quickstart", ["gpu=4x rtx-3090", "engine=vllm",
                                     "engine.tensor_parallel_size=2",
                                     "engine.pipeline_parallel_size=2"])
    assert len(s.gpus) == 4


@pytest.mark.parametrize(("sets", "tp", "pp"), [
    (["gpu=2x rtx-3090", "engine=vllm"], 2, 1),
    (["gpu=4x rtx-3090", "engine=sglang", "engine.pipeline_parallel_size=2"], 2, 2),
    (["gpu=rtx-3090", "engine=vllm"], 1, 1),
])
def test_unset_tensor_parallel_is_one_rank_per_gpu(sets, tp, pp):
    e = load_scenario("quickstart", sets).engine
    assert (e.tensor_parallel_size, e.pipeline_parallel_size) == (tp, pp)
