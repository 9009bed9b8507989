"""``trace inspect`` and ``trace sample`` stream: on a generated trace of two million
requests each runs in a child process whose address space is capped at what it held
after a warm-up on a small trace plus :data:`HEADROOM_BYTES` — far below the ≈ 0.6 KB
(inspect) and ≈ 1.4 KB (sample) a request that loading the whole trace took — and
succeeds.  (Peak RSS for 1 M vs 4 M requests: benchmarks/trace_memory.py.)"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvsim.workload.io import _META_KEY, SESSION_SCHEMA, read_trace
from kvsim.workload.schema import TraceMeta

resource = pytest.importorskip("resource")  # RLIMIT_AS: POSIX only

HEADROOM_BYTES = 400 * 2**20
REQUESTS, TURNS = 2_000_000, 20
_TURN = SESSION_SCHEMA.field("turns").type.value_type


def _empty_lists(n: int, field: str, struct: pa.StructType | pa.Schema = _TURN) -> pa.Array:
    """``n`` empty lists of the type of ``struct``'s ``field``."""
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)),
                                    pa.array([], type=struct.field(field).type.value_type))


def write_big_trace(path, requests: int, turns: int = TURNS) -> None:
    """``requests // turns`` open-loop sessions (2 s apart, turns 7 s apart) sharing a
    300-token system prompt, written with pyarrow directly (a second or two)."""
    n = requests // turns
    m = n * turns
    rng = np.random.default_rng(0)
    start = np.repeat(np.arange(n) * 2.0, turns) + np.tile(np.arange(turns) * 7.0, n)
    turn = pa.StructArray.from_arrays([
        pa.array(start), pa.array(np.zeros(m)), _empty_lists(m, "prefix"),
        pa.array(np.zeros(m, dtype=np.int64)), pa.array(rng.integers(1, 4000, m)),
        pa.array(rng.integers(1, 500, m)), _empty_lists(m, "references")],
        fields=list(_TURN))
    cols = [pa.array([f"s{i:08d}" for i in range(n)]), pa.array(["chat"] * n),
            pa.array([""] * n), _empty_lists(n, "shared_prefix", SESSION_SCHEMA),
            pa.array(["sys"] * n), pa.array(np.full(n, 300)),
            pa.array(["none"] * n),
            pa.ListArray.from_arrays(pa.array(np.arange(0, m + 1, turns, dtype=np.int32)),
                                     turn)]
    meta = TraceMeta(source="generated:big").model_dump_json().encode()
    pq.write_table(pa.Table.from_arrays(cols, schema=SESSION_SCHEMA.with_metadata(
        {_META_KEY: meta})), path, row_group_size=2048)


_CHILD = textwrap.dedent("""
    import contextlib, io, resource, sys
    import psutil
    from kvsim.cli import main

    def run(argv):
        try:
            main(argv)
        except SystemExit as exc:
            if exc.code:
                raise

    headroom, small, big, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    with contextlib.redirect_stdout(io.StringIO()):  # warm-up: every import and pool
        run([small if a == big else a for a in argv])
    limit = psutil.Process().memory_info().vms + headroom
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    run(argv)
""")


def _capped(small, big, *argv):
    """Run ``kvsim ARGV`` in a child capped at its warmed-up size + HEADROOM_BYTES."""
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}  # NOTE: fewer,
    # smaller reserved arenas and thread pools, so the cap measures data, not threads
    return subprocess.run([sys.executable, "-c", _CHILD, str(HEADROOM_BYTES), str(small),
                           str(big), *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=900, check=False)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    write_big_trace(d / "small.parquet", 20_000)
    write_big_trace(d / "big.parquet", REQUESTS)
    return d / "small.parquet", d / "big.parquet"


@pytest.mark.slow
def test_inspect_streams_two_million_requests(traces):
    small, big = traces
    done = _capped(small, big, "trace", "inspect", big, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    stats = json.loads(done.stdout)
    assert stats["rows"] == REQUESTS and stats["sessions"] == REQUESTS // TURNS


@pytest.mark.slow
def test_sample_streams_two_million_requests(traces, tmp_path):
    small, big = traces
    out = tmp_path / "kept.parquet"
    done = _capped(small, big, "trace", "sample", big, "--sessions", "50", "--seed", "3",
                   "-o", out)
    assert done.returncode == 0, done.stderr[-2000:]
    kept = read_trace(out)[1]
    assert len(kept) == 50 and sum(len(s.turns) for s in kept) == 50 * TURNS


def write_azure_csv(path, rows: int) -> None:
    """An Azure-LLM-format CSV of ``rows`` requests, 0.01 s apart (pyarrow, a second)."""
    import pyarrow.csv as pacsv
    t = np.datetime64("2023-11-16T18:15:46", "us") + np.arange(rows) * np.timedelta64(10_000,
                                                                                       "us")
    stamps = pa.array(np.datetime_as_string(t, unit="us")).to_numpy(zero_copy_only=False)
    rng = np.random.default_rng(1)
    table = pa.table({"TIMESTAMP": [s.replace("T", " ") + "0" for s in stamps],
                      "ContextTokens": rng.integers(1, 4000, rows),
                      "GeneratedTokens": rng.integers(1, 500, rows)})
    pacsv.write_csv(table, path, pacsv.WriteOptions(quoting_style="none"))


@pytest.mark.slow
def test_import_streams_a_million_requests(tmp_path):
    small, big = tmp_path / "small.csv", tmp_path / "big.csv"
    write_azure_csv(small, 10_000)
    write_azure_csv(big, 1_000_000)
    out = tmp_path / "az.parquet"
    done = _capped(small, big, "trace", "import", "azure", big, "-o", out)
    assert done.returncode == 0, done.stderr[-2000:]
    assert pq.ParquetFile(out).metadata.num_rows == 1_000_000
