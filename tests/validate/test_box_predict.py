"""llama-bench tests that ran on several GPUs, laid out and timed as `kvsim simulate` lays
out and times a llama.cpp box (kvsim.validate.box_predict)."""

from dataclasses import replace

import pytest

from kvsim.errors import InputError
from kvsim.validate.box_predict import BoxSetup, box_setup, box_tps, several_gpus
from kvsim.validate.llamabench import read_bench
from kvsim.validate.predict import predicted_tps, setup_for
from kvsim.validate.records import Measurement, parse_tensor_split
from kvsim.validate.run import validate
from kvsim.validate.shared import read_shared_csv

TWO_3090 = """\
ggml_cuda_init: found 2 CUDA devices:
  Device 0: NVIDIA GeForce RTX 3090, compute capability 8.6, VMM: yes
  Device 1: NVIDIA GeForce RTX 3090, compute capability 8.6, VMM: yes
| model                          |       size |     params | backend    | ngl | fa |            test |                  t/s |
| ------------------------------ | ---------: | ---------: | ---------- | --: | -: | --------------: | -------------------: |
| llama 8B Q4_K - Medium         |   4.58 GiB |     8.03 B | CUDA       |  99 |  1 |           pp512 |       4800.00 ± 3.00 |
| llama 8B Q4_K - Medium         |   4.58 GiB |     8.03 B | CUDA       |  99 |  1 |           tg128 |        120.00 ± 0.10 |
| llama 70B Q4_K - Medium        |  39.59 GiB |    70.55 B | CUDA       |  99 |  1 |           tg128 |         16.00 ± 0.10 |
"""  # hand-made: llama-bench's markdown layout and device lines, numbers invented


def _m(gpu: str, metric: str = "tg_tps", **kw) -> Measurement:
    shape = {"n_gen": 128} if metric == "tg_tps" else {"n_prompt": 512}
    given = {"id": "x", "backend": "CUDA", "model": "llama-3.1-8b", "weight_format": "q4_k_m",
             "flash_attn": True, **shape, **kw}
    return Measurement(gpu=gpu, metric=metric, value=100.0, **given)


def _box(gpu: str, **kw) -> float:
    m = _m(gpu, **kw)
    s = box_setup(m)
    assert isinstance(s, BoxSetup), s
    return box_tps(m, s)


def _one(gpu: str, **kw) -> float:
    m = _m(gpu, **kw)
    return predicted_tps(m, setup_for(m))


def test_a_pasted_two_card_table_is_predicted_on_the_box():
    ms, skipped = read_bench(TWO_3090, origin="box")
    assert skipped == [] and all(several_gpus(m) for m in ms)
    v = validate(ms)
    assert v.skipped == []
    assert [(r["gpu"], r["model"], r["metric"], r["kind"]) for r in v.rows] == [
        ("2x rtx-3090", "llama-3.1-8b", "pp_tps", "box"),   # one shape: the longer context
        ("2x rtx-3090", "llama-3.1-8b", "tg_tps", "box"),
        ("2x rtx-3090", "llama-3.1-70b", "tg_tps", "box")]
    # the summary keeps a box's rows apart from one card's
    assert {(x["kind"], x["metric"]) for x in v.summary()} == {("box", "pp_tps"),
                                                               ("box", "tg_tps")}
    # a 70B Q4_K_M (39.6 GiB) is half on each card: its decode reads 20 GiB a card in
    # turn, at most one card's bandwidth over the whole file
    tg70 = float(v.rows[2]["predicted_tps"])
    assert 10 < tg70 < 936e9 / (39.59 * 2**30)


def test_two_like_cards_decode_as_one_card_less_the_copy_between_them():
    # a layer split reads each card's half of the weights in turn: one card's time, plus
    # an activation copy at the stage boundary
    one, two = _one("rtx-3090"), _box("2x rtx-3090")
    assert 0.9 * one < two < one


def test_a_slower_card_paces_its_layers_and_the_split_moves_them():
    fast = _box("2x rtx-3090")
    mixed = _box("NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX 3060 12GB")
    slow = _box("2x rtx-3060-12gb")
    assert slow < mixed < fast
    # -ts 1/3 puts three quarters of the layers on the slower card
    assert _box("rtx-3090, rtx-3060-12gb", tensor_split=(1.0, 3.0)) < mixed \
        < _box("rtx-3090, rtx-3060-12gb", tensor_split=(3.0, 1.0))


def test_split_mode_none_runs_on_the_main_gpu_alone():
    none = _box("rtx-3090, rtx-3060-12gb", split_mode="none", main_gpu=1)
    assert none == pytest.approx(_one("rtx-3060-12gb"), rel=0.02)


@pytest.mark.parametrize(("kw", "reason"), [
    ({"tensor_split": (3.0, 1.0, 1.0)}, "tensor split 3/1/1: one share per GPU (2)"),
    ({"split_mode": "graph"}, "split mode 'graph': kvsim lays out llama.cpp's layer, row, none"),
    ({"main_gpu": 2}, "main GPU 2: 0 to 1"),
])
def test_split_knobs_that_disagree_with_the_box_skip_the_row(kw, reason):
    s = box_setup(_m("2x rtx-3090", **kw))
    assert (s.id, s.reason) == ("x", reason)


def test_a_card_the_catalogue_cannot_pin_down_skips_the_row():
    s = box_setup(_m("NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX 3060"))
    assert s.reason.startswith("ambiguous: 'NVIDIA GeForce RTX 3060' is sold with 8 or 12 GB")
    # a remark in the printed list names no device: one card, the single-card path
    assert not several_gpus(_m("NVIDIA DGX Spark (GB10, 128 GB LPDDR5x unified)"))


def test_readers_take_the_split_knobs():
    md = TWO_3090.replace("| fa |", "| sm | ts | mg | fa |").replace(
        "| -: |", "| --: | --: | --: | -: |").replace("|  99 |  1 |", "|  99 | row | 3.00/1.00 | 1 |  1 |")
    ms, skipped = read_bench(md, origin="md")
    assert skipped == [] and {(m.split_mode, m.tensor_split, m.main_gpu) for m in ms} == {
        ("row", (3.0, 1.0), 1)}
    head = ("id,engine,gpu,model,weight_format,kv_type,settings,context_or_depth,"
            "batch_or_concurrency,metric,value,unit,source,notes\n")
    row = ('B1,llama.cpp llama-bench (CUDA),"NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX '
           '3090",Llama 3.1 8B,Q4_K_M,f16,-ngl 99 -fa 1 -sm layer -ts 3/1 -mg 0,0,1,'
           'tg128_tps,118.5,tok/s,made up,\n')
    (m,), skipped = read_shared_csv(head + row, "long.csv")
    assert skipped == [] and (m.split_mode, m.tensor_split, m.main_gpu) == ("layer", (3.0, 1.0), 0)
    ms, skipped = read_shared_csv(head + row.replace("-ts 3/1", "-ts 3/x"), "bad.csv")
    assert ms == [] and [s.id for s in skipped] == ["B1"]
    assert skipped[0].reason.startswith("settings '-ngl 99 -fa 1 -sm layer -ts 3/x")
    assert parse_tensor_split("0.00") is None and parse_tensor_split("0.6/0.4") == (0.6, 0.4)


def test_a_layer_split_pipelines_a_batchs_ubatches_on_cuda_not_on_vulkan():
    # llama.cpp pipelines only where every device has async compute and events
    # (kvsim.latency.box.PIPELINE_BACKENDS): a 2048-token prompt in 512-token ubatches over
    # two 3090s takes its first ubatch through both cards, then one card's time each
    cuda = _box("2x NVIDIA GeForce RTX 3090", metric="pp_tps", n_prompt=2048, n_ubatch=512)
    serial = sum(_box("2x NVIDIA GeForce RTX 3090", metric="pp_tps", n_prompt=512,
                      n_ubatch=512) ** -1 * 512 for _ in range(4))
    assert 2048 / cuda < 0.8 * serial
    vk = _box("2x NVIDIA GeForce RTX 3090", metric="pp_tps", n_prompt=2048, n_ubatch=512,
              backend="Vulkan")
    one = _box("2x NVIDIA GeForce RTX 3090", metric="pp_tps", n_prompt=512, n_ubatch=512,
               backend="Vulkan")
    # four ubatches one after another, the later ones attending to more of the prompt
    assert 0.9 * one < vk < one


def test_ngl_99_keeps_every_layer_on_the_cards_and_minus_one_fits_them():
    # Llama 3.1 70B Q4_K_M over two 3090s at 32K of context without flash attention: the
    # f32 attention scores (64 heads x 512 x 32K x 4 B = 4 GiB a card) leave no room for
    # every layer; llama-bench's -ngl 99 would not load, -ngl -1 fits layers to memory
    m = _m("2x NVIDIA GeForce RTX 3090", model="llama 70B Q4_K_M (Llama 3.1 70B)",
           depth=32768, flash_attn=False)
    for ngl in (None, 99):
        with pytest.raises(InputError, match="cudaMalloc failed: out of memory"):
            box_tps(replace(m, gpu_layers=ngl), box_setup(m))
    assert box_tps(replace(m, gpu_layers=-1), box_setup(m)) > 0
    head = ("id,engine,gpu,model,weight_format,kv_type,settings,context_or_depth,"
            "batch_or_concurrency,metric,value,unit,source,notes\n")
    row = ('B1,llama.cpp llama-bench (CUDA),"NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX '
           '3090",Llama 3.1 8B,Q4_K_M,f16,-ngl -1 -fa 1 -ub 1,0,1,tg128_tps,118.5,tok/s,x,\n')
    (m,), _ = read_shared_csv(head + row, "ngl.csv")
    assert (m.gpu_layers, m.flash_attn, m.n_ubatch) == (-1, True, 1)
