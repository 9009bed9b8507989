"""Every shipped profile loads, and the catalogue matches docs/reference."""

import csv
from pathlib import Path

import pytest

from kvsim.config.catalog import (
    KINDS,
    find_any,
    list_names,
    load_gpu,
    load_gpu_link,
    load_host,
    load_link,
    load_model,
    load_raw,
)
from kvsim.engines.resolve import resolve_engine
from kvsim.errors import InputError

REFERENCE = Path(__file__).parents[2] / "docs" / "reference"  # the repository copy
LOADERS = {"gpus": load_gpu, "models": load_model, "links": load_link,
           "gpu_links": load_gpu_link, "hosts": load_host, "engines": resolve_engine}


@pytest.mark.parametrize("kind", KINDS)
def test_every_catalogue_file_loads(kind):
    names = list_names(kind)
    assert names
    for name in names:
        obj = LOADERS[kind](name)
        raw = load_raw(kind, name)
        assert raw.get("source"), f"{kind}/{name} has no source"
        if kind != "engines":
            assert obj.name == name


def test_catalogue_sizes():
    assert len(list_names("gpus")) == 166  # 39 reference rows + scripts/data/gpus-added.csv
    # 31 from docs/reference/models.csv + 33 from scripts/gen_models_added.py + qwen2.5-coder-7b by
    # hand
    assert len(list_names("models")) == 65
    assert {"pcie3-x8", "pcie3-x16", "pcie4-x8", "pcie4-x16", "pcie5-x8", "pcie5-x16",
            "unified"} <= set(list_names("links"))
    assert {"desktop-32gb", "desktop-64gb", "desktop-128gb", "strix-halo-128gb",
            "dgx-spark-128gb", "apple-m4-max-128gb"} <= set(list_names("hosts"))
    assert list_names("engines") == ["llama.cpp", "ollama", "sglang", "vllm"]


def test_gpus_match_csv():
    with open(REFERENCE / "gpus.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    by_display = {load_gpu(n).display_name: load_gpu(n) for n in list_names("gpus")}
    with open(Path(__file__).parents[2] / "scripts" / "data" / "gpus-added.csv",
              encoding="utf-8") as fh:
        added = [r["name"] for r in csv.DictReader(fh)]
    assert sorted(by_display) == sorted([r["name"] for r in rows] + added)
    for r in rows:
        g = by_display[r["name"]]
        assert g.memory_bytes == int(float(r["memory_gib"]) * 2**30)
        assert g.memory_bandwidth_bytes_per_s == float(r["memory_bandwidth_gbps"]) * 1e9
        assert g.fp16_tensor_flops == pytest.approx(float(r["fp16_tensor_tflops_dense"]) * 1e12)
        if g.unified_memory:
            assert g.default_link is None
        else:
            assert g.default_link == f"pcie{r['pcie_gen']}-x{r['pcie_lanes']}"
            load_link(g.default_link)


def test_known_slugs_and_links():
    assert load_gpu("rtx-4060-ti-16gb").default_link == "pcie4-x8"
    assert load_gpu("rtx-5090").default_link == "pcie5-x16"
    assert load_gpu("titan-rtx").default_link == "pcie3-x16"
    assert load_gpu("strix-halo").unified_memory
    # docs/reference/hardware-and-models.md §3: midpoints of the measured ranges
    assert load_link("pcie4-x16").h2d_bytes_per_s == 25e9
    assert load_link("pcie5-x16").h2d_bytes_per_s == 55e9
    assert load_link("pcie3-x16").h2d_bytes_per_s == 12.5e9


def test_model_layer_patterns():
    g3 = load_model("gemma-3-4b")
    full = next(g for g in g3.layer_groups if g.kind == "full")
    assert full.layer_indices == (5, 11, 17, 23, 29)
    scout = load_model("llama-4-scout-17b-16e")
    assert {g.kind: g.layers for g in scout.layer_groups} == {"full": 12, "chunked": 36}
    qn = load_model("qwen3-next-80b-a3b")
    assert {g.kind: g.layers for g in qn.layer_groups} == {"full": 12, "recurrent": 36}


def test_model_weights_and_experts_follow_the_catalogue_notes():
    # docs/reference/models.csv notes: Gemma-3 params include the SigLIP vision tower; "text weights
    # for planning" are 3.88B / 11.77B / 27.0B.  MoE rows name their experts.
    assert [load_model(f"gemma-3-{s}").params_total for s in ("4b", "12b", "27b")] == [
        3.88e9, 11.77e9, 27.0e9]
    experts = {n: (load_model(n).num_experts, load_model(n).num_experts_active) for n in (
        "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v2-lite", "llama-3.1-8b")}
    assert experts == {"qwen3-30b-a3b": (128, 8), "gpt-oss-20b": (32, 4),
                       "deepseek-v2-lite": (64, 6), "llama-3.1-8b": (None, None)}


def test_unknown_names_give_closest():
    with pytest.raises(InputError, match="closest: rtx-4090"):
        load_gpu("rtx-4091")
    with pytest.raises(InputError, match="llama-3.1-8b"):
        load_model("llama-3.1-9b")
    with pytest.raises(InputError, match=r"^name: 'nothing-like-this' — unknown; closest: "):
        find_any("nothing-like-this")


def test_profile_from_yaml_path(tmp_path):
    import yaml
    raw = dict(load_raw("gpus", "rtx-4090"))
    raw["name"] = "my-card"
    p = tmp_path / "my-card.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert load_gpu(str(p)).name == "my-card"


def test_small_catalogues_are_listed_whole_large_ones_closest_three():
    from kvsim.errors import unknown_name
    # up to 10 names: all of them, closest first, then the rest sorted
    e = unknown_name("engine.preset", "nosuch", ["vllm", "sglang", "ollama", "llama.cpp"])
    assert e.allowed.startswith("unknown; one of: ")
    assert sorted(e.allowed.removeprefix("unknown; one of: ").split(", ")) == [
        "llama.cpp", "ollama", "sglang", "vllm"]
    assert unknown_name("x", "vllmm", ["vllm", "sglang", "ollama", "llama.cpp"]).allowed \
        .startswith("unknown; one of: vllm, ")
    # more than 10: the three closest only
    with pytest.raises(InputError, match=r"unknown; closest: rtx-4090, [^,]+, [^,]+$"):
        load_gpu("rtx-4091")
    assert unknown_name("x", "a", [], also="or a path").allowed == \
        "unknown; none are available (or a path)"


def test_unknown_scenario_mentions_yaml_paths():
    from kvsim.scenario import load_scenario
    with pytest.raises(InputError, match=r"scenario: 'nosuch' — unknown; one of: .*quickstart"
                       r".* \(or a path to a scenario \.yaml file\)$"):
        load_scenario("nosuch")
