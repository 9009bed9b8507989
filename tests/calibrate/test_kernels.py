"""CPU kernel harness on a tiny model: KV bytes from tensors equal the formula.

The CPU path runs in CI (torch is in the ``calibrate`` extra that scripts/test.sh
installs); the grid is tiny so the whole module takes seconds.
"""

import pytest
import torch  # calibrate extra, installed by scripts/test.sh: never a skip

from kvsim.calibrate import torch_model as tm
from kvsim.calibrate.kernels import KernelGrid, calibrate_kernels, layer_shape
from kvsim.config.specs import LayerGroup, ModelSpec

# 4 layers, hidden 128, 4 heads, 2 KV heads of 32 → per layer 49152 attention weights
# + 3·128·256 MLP weights; embeddings 2·512·128.
TINY = ModelSpec(
    name="tiny", display_name="tiny", params_total=4 * (49152 + 98304) + 2 * 512 * 128,
    params_active=1, num_layers=4, hidden_size=128, num_attention_heads=4, num_kv_heads=2,
    head_dim=32, vocab_size=512, max_context_tokens=4096, source="test",
    layer_groups=(LayerGroup(kind="full", layers=4, n_kv_heads=2, head_dim_k=32,
                             head_dim_v=32),))
GRID = KernelGrid(batches=(1, 2), contexts=(64, 256), prefill_tokens=(32, 64),
                  repeats=2, warmup=1, vocab_slice=512, bandwidth_bytes=2**20)


def test_layer_shape_derives_the_ffn_width() -> None:
    assert layer_shape(TINY).intermediate == 256


def test_quantize_round_trip_bytes_and_error() -> None:
    x = torch.randn(2, 3, 5, 64, generator=torch.Generator().manual_seed(1))
    for kind, per_value in (("f16", 2), ("q8_0", 34 / 32), ("q4_0", 18 / 32)):
        stored = tm.quantize(x, kind)
        assert tm.stored_bytes(stored) == x.numel() * per_value
        back = tm.dequantize(stored, kind, torch.float32)
        assert back.shape == x.shape
    # q8_0 step is amax/127 per block: error at most half a step, plus the f16 rounding
    # of the scale (relative 2^-11) times at most 127 steps
    stored = tm.quantize(x, "q8_0")
    step = x.reshape(2, 3, 5, 2, 32).abs().amax(-1, keepdim=True) / 127
    err = (tm.dequantize(stored, "q8_0", torch.float32) - x).reshape(2, 3, 5, 2, 32).abs()
    assert bool((err <= step * (0.5 + 127 * 2**-11)).all())


def test_cpu_calibration_artifact() -> None:
    art = calibrate_kernels(TINY, "cpu", layers=2, grid=GRID)
    assert (art.layers_built, art.layers_total, art.source) == (2, 4, "kernels")
    # docs/reference/engines.md §0: 4 layers · 2 heads · (32 + 32) values · bytes/value
    want = {"f16": 4 * 2 * 64 * 2, "q8_0": 4 * 2 * 64 * 34 / 32, "q4_0": 4 * 2 * 64 * 18 / 32}
    got = {k.cache_type: k.tensor_bytes_per_token for k in art.kv_bytes}
    assert got == want
    assert all(k.formula_bytes_per_token == want[k.cache_type] for k in art.kv_bytes)
    # decode points: 3 dtypes × 2 batches × 2 contexts; prefill where tokens ≤ context
    # (32 and 64 both fit in contexts 64 and 256)
    assert sum(p.kind == "decode" for p in art.points) == 12
    assert sum(p.kind == "prefill" for p in art.points) == 3 * 2 * 2 * 2
    assert set(art.fits) == {"f16", "q8_0", "q4_0"}
    assert all(f.max_context == 256 and f.max_batch == 2 for f in art.fits.values())
    err = {q.cache_type: q.attention_rel_error for q in art.quant}
    assert err["f16"] < err["q8_0"] < err["q4_0"] < 0.5
    assert [b.direction for b in art.bandwidth] == ["memcpy"]


def test_exhausted_memory_is_recorded_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tm.KvCache.__init__

    def fake(self, kind, batch, n_kv, capacity, head_dim, device):  # type: ignore[no-untyped-def]
        if capacity > 100:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        real(self, kind, batch, n_kv, capacity, head_dim, device)

    monkeypatch.setattr(tm.KvCache, "__init__", fake)
    art = calibrate_kernels(TINY, "cpu", layers=1,
                            grid=GRID.__class__(**{**GRID.__dict__, "cache_types": ("f16",)}))
    assert [l.what for l in art.limits_reached][:2] == ["f16 batch 1 context 256",
                                                        "f16 batch 2 context 256"]
    assert {p.context for p in art.points if p.kind == "decode"} == {64}
