"""``kvsim compare --gpus``: candidates that are boxes of several GPUs."""

from __future__ import annotations

import pytest

from kvsim.errors import InputError
from kvsim.plan.compare import parse_gpus, with_gpu
from kvsim.scenario import load_scenario


def test_candidates_may_be_sets_written_back_as_labels():
    assert parse_gpus("rtx-4090, 2x rtx-3090 ,rtx-3090+rtx-3060-12gb,rtx-3090+rtx-3090+rtx-3090") \
        == ["rtx-4090", "2x rtx-3090", "rtx-3090+rtx-3060-12gb", "3x rtx-3090"]


@pytest.mark.parametrize(("text", "allowed"), [
    ("2x rtx-3090,rtx-3090+rtx-3090", "each GPU (or set of GPUs) once"),
    (",", "a comma-separated list of GPU profile names"),
    ("0x rtx-3090", "a GPU count from 1 to 16"),
])
def test_bad_candidates_name_the_flag(text, allowed):
    with pytest.raises(InputError) as e:
        parse_gpus(text)
    assert e.value.field == "--gpus" and allowed in e.value.one_line()


def test_swapping_a_box_for_one_card_drops_the_other_cards_and_their_link():
    two = load_scenario("quickstart", ["gpu=2x rtx-3090"])
    one = with_gpu(two, "rtx-4090")
    assert [g.name for g in one.gpus] == ["rtx-4090"] and one.gpu_link is None
    back = with_gpu(one, "2x rtx-3090")
    assert [g.name for g in back.gpus] == ["rtx-3090"] * 2
    assert back.gpu_link is not None and back.gpu_link.name == "pcie4-x16-host"
