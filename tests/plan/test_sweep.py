"""Sweep expansion, the resumable result store, and executors giving equal results."""


import pytest
from plan_fake_runners import fake_run, fake_summary
from sweep_files import write_sweep

from kvsim.errors import InputError
from kvsim.plan.executor import InlineExecutor, LocalExecutor, make_executor
from kvsim.plan.store import ResultStore
from kvsim.plan.sweep import (
    SweepSpec,
    expand,
    grid,
    key_exists,
    load_sweep,
    run_sweep,
    set_key,
)
from kvsim.scenario import scenario_hash


def _points(tmp_path, base_yaml, **spec):
    s, d = load_sweep(write_sweep(tmp_path, **spec))
    return expand(s, d)


def test_factorial_grid_with_linked_keys():
    spec = SweepSpec(base={}, factors={"engine.context_tokens": [4096, 8192, 16384],
                                       "engine.cache_type_k,engine.cache_type_v":
                                           [["f16", "f16"], ["q8_0", "q8_0"]]})
    pts = grid(spec)
    assert len(pts) == 3 * 2
    assert {"engine.context_tokens": 16384, "engine.cache_type_k": "q8_0",
            "engine.cache_type_v": "q8_0"} in pts


def test_expand_resolves_every_point(tmp_path, base_yaml):
    pts = _points(tmp_path, base_yaml, factors={"engine.parallel": [1, 2, 4],
                                                "engine.cache_type_k": ["f16", "q8_0"]})
    assert len(pts) == 6
    assert {(p.scenario.engine.parallel, p.scenario.engine.cache_type_k) for p in pts} == {
        (1, "f16"), (2, "f16"), (4, "f16"), (1, "q8_0"), (2, "q8_0"), (4, "q8_0")}
    assert len({p.hash for p in pts}) == 6
    # untouched keys keep the base values
    assert all(p.scenario.engine.context_tokens == 8192 for p in pts)


def test_points_resolving_to_the_same_scenario_run_once_and_keep_their_rows(tmp_path,
                                                                            base_yaml):
    # parallel 2 is the base value: {} would be the same scenario as {engine.parallel: 2}
    pts = _points(tmp_path, base_yaml, points=[{"engine.parallel": 2}, {"seed": 0},
                                               {"engine.parallel": 3}])
    assert [p.index for p in pts] == [0, 1, 2]
    assert pts[0].key == pts[1].key != pts[2].key
    with ResultStore(tmp_path / "out") as store:
        out = run_sweep(pts, store, runner=fake_run)
    assert (out.ran, out.skipped) == (2, 0)
    t = out.table
    assert list(t["point"]) == [0, 1, 2]
    # a point that does not set a key shows the value it ran with
    assert list(t["engine.parallel"]) == [2, 2, 3] and list(t["seed"]) == [0, 0, 0]
    assert list(t["status"]) == ["ok", "ok", "ok"]
    assert list(t["ttft_p95_s"]) == [8192 / 1e5 + 0.02, 8192 / 1e5 + 0.02, 8192 / 1e5 + 0.03]


def test_gpu_factor_swaps_profile_and_link(tmp_path, base_yaml):
    pts = _points(tmp_path, base_yaml, factors={"gpu": ["rtx-4060-ti-16gb", "rtx-5090"]})
    gib = {p.scenario.gpu.name: p.scenario.gpu.memory_bytes / 2**30 for p in pts}
    assert gib == {"rtx-4060-ti-16gb": 16, "rtx-5090": 32}
    # the 4060 Ti is a PCIe 4.0 x8 card, the 5090 PCIe 5.0 x16 (reference/gpus.csv:
    # pcie_gen,pcie_lanes = 4,8 and 5,16): each point carries its own card's link
    assert {p.scenario.gpu.name: p.scenario.link.name for p in pts} == {
        "rtx-4060-ti-16gb": "pcie4-x8", "rtx-5090": "pcie5-x16"}


def test_key_exists_on_resolved_defaults():
    doc = {"engine": {"parallel": 4}, "workload": {"params": {}}, "policies": [{"kind": "x"}]}
    assert key_exists(doc, "engine.parallel")
    assert key_exists(doc, "workload.params.members")  # open mapping
    assert key_exists(doc, "policies.0.kind")
    assert not key_exists(doc, "engine.paralel")
    assert not key_exists(doc, "policies.1.kind")


@pytest.mark.parametrize("spec,field", [
    ({"factors": {"engine.paralel": [1, 2]}}, "sweep key"),
    ({"factors": {"engine.max_num_seqs": [1, 2]}}, "sweep key"),  # a vllm knob on llama.cpp
    ({"factors": {"engine.parallel": []}}, "sweep.factors.engine.parallel"),
    ({"factors": {}}, "sweep.factors"),
    ({"points": []}, "sweep.points"),
    ({"points": [{"engine.parallel": 0}]}, "sweep point 0 engine.parallel"),
    ({}, "sweep"),
])
def test_bad_sweeps_are_one_line_input_errors(tmp_path, base_yaml, spec, field):
    with pytest.raises(InputError) as exc:
        _points(tmp_path, base_yaml, **spec)
    assert exc.value.field == field
    assert "\n" not in str(exc.value)


def test_store_put_is_atomic_and_skips_existing(tmp_path):
    with ResultStore(tmp_path / "s") as store:
        assert store.put("abc", {"summary": {"x": 1}})
        assert not store.put("abc", {"summary": {"x": 2}})  # kept as is
        assert store.get("abc")["summary"] == {"x": 1}
        assert store.finished() == {"abc"}
    # a killed run leaves a temp dir behind: reopening removes it, entries untouched
    stale = tmp_path / "s" / ".tmp" / "dead-123"
    stale.mkdir()
    (stale / "record.json").write_text("{trunc", encoding="utf-8")
    with ResultStore(tmp_path / "s") as store:
        assert not stale.exists()
        assert store.finished() == {"abc"}


def test_store_is_locked_against_a_second_writer(tmp_path):
    with ResultStore(tmp_path / "s"), pytest.raises(InputError, match="another sweep"):
        ResultStore(tmp_path / "s").open()


def test_sweep_runs_stores_and_resumes(tmp_path, base_yaml):
    pts = _points(tmp_path, base_yaml, factors={"engine.parallel": [1, 2],
                                                "engine.context_tokens": [4096, 8192]})
    with ResultStore(tmp_path / "out") as store:
        first = run_sweep(pts[:2], store, runner=fake_run)
        assert (first.ran, first.skipped) == (2, 0)
        again = run_sweep(pts, store, runner=fake_run)
        assert (again.ran, again.skipped) == (2, 2)
    t = again.table
    assert list(t["point"]) == [p.index for p in pts]
    assert list(t["scenario_hash"]) == [scenario_hash(p.scenario) for p in pts]
    for row, p in zip(t.to_dict("records"), pts):
        assert row["ttft_p95_s"] == fake_summary(p.scenario)["ttft_p95_s"]
        assert row["engine.parallel"] == p.scenario.engine.parallel


def _table(tmp_path, base_yaml, name, executor):
    pts = _points(tmp_path, base_yaml, factors={"engine.parallel": [1, 2, 3],
                                                "engine.cache_type_k": ["f16", "q4_0"]})
    try:
        with ResultStore(tmp_path / name) as store:
            return run_sweep(pts, store, executor=executor, runner=fake_run).table
    finally:
        executor.close()


def test_local_pool_equals_inline(tmp_path, base_yaml):
    a = _table(tmp_path, base_yaml, "inline", InlineExecutor())
    b = _table(tmp_path, base_yaml, "pool", LocalExecutor(2))
    assert a.equals(b)


def test_dask_local_cluster_equals_local_pool(tmp_path, base_yaml):
    import distributed  # dev/dask extras, installed by scripts/test.sh: never a skip
    a = _table(tmp_path, base_yaml, "pool", LocalExecutor(2))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        b = _table(tmp_path, base_yaml, "dask", make_executor(dask=cluster.scheduler_address, dask_timeout_s=60))
    assert a.equals(b)
    assert len(b) == 6


def test_unreachable_dask_address_is_a_quick_input_error():
    import time
    t0 = time.monotonic()
    with pytest.raises(InputError) as exc:
        make_executor(dask="tcp://127.0.0.1:9", dask_timeout_s=1.0)
    assert exc.value.field == "--dask"
    assert time.monotonic() - t0 < 8


def test_a_sweep_key_inside_a_profile_leaves_the_catalogue_untouched():
    # set_key expands a profile name into its mapping and edits it; the profile that
    # later loads must still be the catalogue's (the parsed YAML is cached)
    from kvsim.config.catalog import load_model, load_raw
    from kvsim.plan.sweep import set_key

    raw = {"model": "gemma-2-27b"}
    set_key(raw, "model.layer_groups.1.kind", "full", resolved={})
    assert raw["model"]["layer_groups"][1]["kind"] == "full"
    assert load_raw("models", "gemma-2-27b")["layer_groups"][1]["kind"] == "sliding"
    assert {g.kind for g in load_model("gemma-2-27b").layer_groups} == {"full", "sliding"}


def test_an_edited_input_file_or_a_new_version_is_run_again(tmp_path, monkeypatch):
    # the store key covers what the scenario hash cannot see: the content of the files
    # it reads (here a trace) and the kvsim version
    from kvsim.plan import store as store_mod
    from kvsim.workload.io import write_trace
    from kvsim.workload.schema import Session, Turn

    trace = tmp_path / "t.jsonl"
    one = [Session(session_id="a", turns=(Turn(start_s=0.0, input_tokens=10,
                                               output_tokens=2),))]
    write_trace(trace, one)
    base = {"gpu": "rtx-4090", "model": "llama-3.1-8b", "workload": {"trace": str(trace)}}
    spec = SweepSpec(base=base, factors={"engine.parallel": [1, 2]})
    before = expand(spec, tmp_path)
    write_trace(trace, one + [Session(session_id="b", turns=(Turn(
        start_s=1.0, input_tokens=10, output_tokens=2),))])
    edited = expand(spec, tmp_path)
    assert [p.hash for p in edited] == [p.hash for p in before]  # the hash cannot tell
    assert not {p.key for p in before} & {p.key for p in edited}
    monkeypatch.setattr(store_mod, "__version__", "999")
    assert not {p.key for p in edited} & {p.key for p in expand(spec, tmp_path)}


def test_a_sweep_key_replaces_its_rival_as_set_does():
    # one rule for --set and sweep keys (kvsim.scenario.drop_rival_key): a trace replaces
    # the household preset, llama.cpp's ctx_size the per-session context, and the reverse
    raw = {"workload": {"preset": "family-4", "days": 1},
           "engine": {"preset": "llama.cpp", "ctx_size": 16384, "parallel": 4}}
    resolved = {"engine": {"preset": "llama.cpp"}}
    set_key(raw, "workload.trace", "chat.jsonl", resolved)
    set_key(raw, "engine.context_tokens", 8192, resolved)
    assert raw == {"workload": {"days": 1, "trace": "chat.jsonl"},
                   "engine": {"preset": "llama.cpp", "parallel": 4, "context_tokens": 8192}}
