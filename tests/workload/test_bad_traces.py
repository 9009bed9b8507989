"""Bad traces, presets and workload bounds: one-line errors naming the session, turn and
field (audit items B13, C22, C23, C28, D39)."""

import json

import pytest
import yaml

from kvsim.cli import main
from kvsim.config.catalog import bundled_path
from kvsim.errors import InputError, RunStopped
from kvsim.scenario import load_scenario
from kvsim.workload.io import iter_sessions, read_meta
from kvsim.workload.preset import load_preset

META = {"trace_meta": {"source": "test", "schema_version": 1}}


def _session(sid="a", start=0.0, turns=None):
    return {"session_id": sid, "turns": turns or [
        {"start_s": start, "input_tokens": 100, "output_tokens": 10}]}


def _write(path, *sessions, meta=META):
    path.write_text("\n".join(json.dumps(x) for x in (meta, *sessions)) + "\n")
    return path


def _err(path) -> str:
    with pytest.raises(InputError) as exc:
        read_meta(path)
        list(iter_sessions(path))
    return exc.value.one_line()


def test_schema_version_must_be_known(tmp_path):
    p = _write(tmp_path / "t.jsonl", _session(), meta={"trace_meta": {"schema_version": 99}})
    assert _err(p) == ("t.jsonl line 1: trace_meta: schema_version: 99 — 1: the only trace "
                       "schema this kvsim reads")


def test_turns_arrive_in_order(tmp_path):
    s = _session(turns=[{"start_s": 100.0, "input_tokens": 5, "output_tokens": 5},
                        {"start_s": 5.0, "input_tokens": 5, "output_tokens": 5}])
    assert _err(_write(tmp_path / "t.jsonl", s)) == (
        "t.jsonl line 2: turns.1.start_s: 5.0 — not before turn 0's start_s (100.0): a "
        "session's turns arrive in order")


def test_duplicate_session_ids(tmp_path):
    p = _write(tmp_path / "t.jsonl", _session("x"), _session("x", 1.0))
    assert _err(p) == ("t.jsonl line 3: session_id: 'x' — already used by an earlier session; "
                       "session ids must be unique")


def test_reference_past_its_part(tmp_path):
    s = _session(turns=[{"start_s": 0.0, "input_tokens": 100, "output_tokens": 5},
                        {"input_tokens": 5, "output_tokens": 5, "references": [
                            {"turn": 0, "part": "input", "offset_tokens": 10**9,
                             "length_tokens": 8}]}])
    assert _err(_write(tmp_path / "t.jsonl", s)) == (
        "t.jsonl line 2: turns.1.references.0.offset_tokens: 1000000000 — offset_tokens + "
        "length_tokens (8) must be at most the 100 tokens of the input it refers to")


def test_missing_field_names_it_not_the_dict(tmp_path):  # D39
    s = _session(turns=[{"start_s": 0.0, "output_tokens": 5}])
    assert _err(_write(tmp_path / "t.jsonl", s)) == (
        "t.jsonl line 2: turns.0.input_tokens: 'missing' — required (given: start_s, "
        "output_tokens)")


def test_binary_trace_files(tmp_path, capsys):  # B13
    p = tmp_path / "binary.jsonl"
    p.write_bytes(json.dumps(META).encode() + b"\n\xff\xfe\x00\x81\n")
    for args in (["trace", "inspect", str(p)],
                 ["trace", "import", "mooncake", str(p), "-o", str(tmp_path / "o.jsonl")],
                 ["trace", "import", "azure", str(p), "-o", str(tmp_path / "o.jsonl")],
                 ["trace", "import", "sharegpt", str(p), "-o", str(tmp_path / "o.jsonl")]):
        with pytest.raises(SystemExit) as exc:
            main(args)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: binary.jsonl: '{p}' — not UTF-8 text; kvsim reads UTF-8 " \
                      "files (save or convert it as UTF-8)", args


def _preset(tmp_path, edit) -> str:
    raw = yaml.safe_load(bundled_path("households", "family-4").read_text())
    edit(raw["kinds"]["chat"])
    p = tmp_path / "hh.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


@pytest.mark.parametrize("edit,line", [
    (lambda k: k["turns"].update(min=40, max=1),
     "preset 'hh'.kinds.chat.turns.lognormal.max: 1.0 — at least min (40)"),
    (lambda k: k["output_tokens"].update(p95=float("inf")),
     ("preset 'hh'.kinds.chat.output_tokens.lognormal.p95: inf — Input should be a finite "
      "number")),
])
def test_bad_preset_distributions(tmp_path, edit, line):  # C28
    with pytest.raises(InputError) as exc:
        load_preset(_preset(tmp_path, edit))
    assert exc.value.one_line() == line


def test_absurd_day_count_is_refused_up_front(tmp_path, capsys):  # C23
    with pytest.raises(SystemExit):
        main(["simulate", "quickstart", "-o", str(tmp_path / "o"), "--set", "workload.days=1e9"])
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: workload.days: 1000000000.0 — at most ")
    assert "days of this preset" in err
    with pytest.raises(SystemExit):
        main(["trace", "generate", "family-4", "--days", "1e9", "-o", str(tmp_path / "t.jsonl")])
    assert "days of this preset" in capsys.readouterr().err


def test_sample_interval_below_a_tenth_of_a_millisecond_is_refused():  # C23
    with pytest.raises(InputError) as exc:
        load_scenario("quickstart", ["sim.sample_interval_s=1e-6"])
    assert exc.value.one_line() == (
        "sim.sample_interval_s: 1e-06 — Input should be greater than or equal to 0.0001")


def test_a_fine_tick_stops_at_the_memory_limit_and_keeps_what_ran():  # C23
    """A 1 ms tick on a busy engine: the process memory is read every 65,536 samples
    and, past sim.max_rss_bytes (1 MiB here: at once), the run stops there with its
    results (rows of the requests that finished, the samples so far)."""
    from kvsim.api import simulate
    s = load_scenario("quickstart", ["sim.sample_interval_s=0.001", "sim.max_rss_bytes=1MiB",
                                     "workload.days=1"])
    res = simulate(s)  # NOTE: the CLI saves these, then reports the stop
    assert isinstance(res.stopped, RunStopped)
    line = res.stopped.one_line()
    assert line.startswith("sim.max_rss_bytes: '") and line.endswith(
        "memory samples' — the run passed its memory limit (1 MiB); down-sample or cut the "
        "workload, raise sim.sample_interval_s or sim.max_rss_bytes")
    assert res.summary["stopped_reason"] == line
    assert len(res.memory) >= 65_536
