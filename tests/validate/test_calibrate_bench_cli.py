"""``kvsim calibrate bench`` on committed real llama-bench output (tests/validate/data,
CPU, the tiny GGUF): the artifact, its in-sample fit, its use by ``validate`` and by a
scenario, and bad input."""
import json
from pathlib import Path

import pytest

from kvsim.calibrate.tiny_gguf import write_tiny_gguf
from kvsim.latency.bench_artifact import is_bench_artifact, load_bench_artifact

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("m") / "tiny.gguf")


def test_fit_on_real_cpu_output_and_validate_with_it(kvsim_cli, tmp_path, gguf):
    art = tmp_path / "cpu__tiny.json"
    code, err, out = kvsim_cli("calibrate", "bench", DATA / "bench.json", "--model", gguf,
                               "-o", art)
    assert (code, err) == (0, "")
    assert "8 tests on CPU" in out and "wrote" in out
    assert is_bench_artifact(art)
    a = load_bench_artifact(art)
    # -p 64,128 x -n 16,32 x -d 0,256: 8 tests, one backend, the tiny model's name
    assert (a.rows, a.backend, a.model, a.weights) == (8, "CPU", "kvsim-tiny-llama", ("f32",))
    assert a.device.vendor == "CPU" and a.sources == ("bench.json",)
    # the fitted constants describe those 8 runs: in-sample median within 10 %
    assert a.fit_abs_rel_err["median"] < 0.10
    # validate with the artifact predicts the same runs from the saved constants
    code, err, out = kvsim_cli("validate", DATA / "bench.json", "--calibration", art,
                               "--model", gguf, "--json")
    assert (code, err) == (0, "")
    rows = json.loads(out)["rows"]
    assert len(rows) == 8
    errs = sorted(abs(r["rel_err"]) for r in rows)
    assert errs[len(errs) // 2 - 1] <= a.fit_abs_rel_err["median"] + 1e-9 <= errs[len(errs) // 2]
    assert max(errs) == pytest.approx(a.fit_abs_rel_err["max"], rel=1e-9)


def test_same_measurements_in_two_formats_give_the_same_fit(kvsim_cli, tmp_path, gguf):
    # bench.csv and bench.jsonl are the stdout and stderr of one llama-bench run
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert kvsim_cli("calibrate", "bench", DATA / "bench.csv", "--model", gguf, "-o", a)[0] == 0
    assert kvsim_cli("calibrate", "bench", DATA / "bench.jsonl", "--model", gguf, "-o", b)[0] == 0
    ka, kb = (load_bench_artifact(p).constants.backends["CPU"] for p in (a, b))
    assert ka == kb


def test_scenario_uses_the_artifact(kvsim_cli, tmp_path, gguf):
    art = tmp_path / "cpu__tiny.json"
    assert kvsim_cli("calibrate", "bench", DATA / "bench.json", "--model", gguf, "-o", art)[0] == 0
    from kvsim.latency.factory import make_latency_model
    from kvsim.scenario import load_scenario

    sc = load_scenario("quickstart", ["latency.kind=calibrated", f"latency.path={art}"])
    lat = make_latency_model(sc)
    assert lat.provenance.startswith("calibrated(llama-bench ")
    # the card is the artifact's (the host's CPU), the model the scenario's own: an 8B
    # model's decode on a CPU is hundreds of ms per token, not a GPU's tens
    from kvsim.latency.base import BatchShape

    assert lat.step_time_s(BatchShape(decode_context=(1000,))) > 0.1


def test_bad_input(kvsim_cli, tmp_path, gguf):
    junk = tmp_path / "junk.txt"
    junk.write_text("nothing measured here\n", encoding="utf-8")
    code, err, _ = kvsim_cli("calibrate", "bench", junk, "--model", gguf, "-o", tmp_path / "x.json")
    assert code == 2 and err.startswith("error: FILE") and not (tmp_path / "x.json").exists()
    code, err, _ = kvsim_cli("calibrate", "bench", DATA / "bench.json", "--model", "no-such-model",
                             "-o", tmp_path / "y.json")
    assert code == 2 and "no-such-model" in err and not (tmp_path / "y.json").exists()
