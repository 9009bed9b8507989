"""`kvsim fit --host`: unset, a unified-memory GPU's host is its own memory (and said so);
a named host of the other memory kind is one line and exit 2."""

import json

import pytest

from kvsim.cli import main

BASE = ["fit", "--model", "llama-3.1-8b", "--context", "8192", "--json"]


def run(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_unified_gpu_without_host_notes_its_own_memory(capsys) -> None:
    code, out, _ = run(capsys, *BASE, "--gpu", "dgx-spark")
    assert code == 0
    # docs/reference/gpus.csv 'NVIDIA DGX Spark (GB10)': 128 GB unified = 128.00 GiB
    assert json.loads(out)["notes"][0] == (
        "host: dgx-spark-unified, the GPU's own 128.00 GiB of unified memory (no separate "
        "host RAM; --host unset)")


@pytest.mark.parametrize("argv", [["--gpu", "rtx-4090"],
                                  ["--gpu", "dgx-spark", "--host", "dgx-spark-128gb"],
                                  ["--gpu", "rtx-4090", "--host", "desktop-32gb"]])
def test_discrete_or_named_host_adds_no_note(capsys, argv) -> None:
    code, out, _ = run(capsys, *BASE, *argv)
    assert code == 0
    assert not any(n.startswith("host:") for n in json.loads(out)["notes"])


@pytest.mark.parametrize("gpu, host, needle", [
    ("strix-halo", "desktop-64gb", ("the host of strix-halo's own memory (unified: its "
     "host RAM is the GPU's")),
    ("rtx-4090", "strix-halo-128gb", ("a host with unified_with_gpu: false (rtx-4090 is a "
     "discrete card")),
])
def test_host_of_the_other_memory_kind_is_refused(capsys, gpu, host, needle) -> None:
    code, out, err = run(capsys, *BASE, "--gpu", gpu, "--host", host)
    assert code == 2 and out == ""
    assert err.startswith(f"error: --host: '{host}' — {needle}")
    assert len(err.strip().splitlines()) == 1
