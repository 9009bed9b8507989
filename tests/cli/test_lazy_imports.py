"""What a command imports: `kvsim --help` and `kvsim fit` stay light, `simulate` imports
no scipy and Plotly only for its report (issue 24: a ~1 s import of pandas/scipy for
eleven help lines).

Each command runs in a fresh interpreter (the test process has imported everything), and
the modules it ended with are read from ``sys.modules`` there.
"""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from kvsim.cli import COMMANDS, cli, source_help

HEAVY = ("pandas", "pyarrow", "plotly", "scipy")

_PROBE = """
import json, sys
sys.argv = ["kvsim", *{args!r}]
from kvsim.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code
print("MODULES " + json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)
      + [code if isinstance(code, int) else 0]), file=sys.stderr)
"""


def _imported(args: list[str]) -> tuple[list[str], int, str]:
    """(heavy modules imported, exit code, stdout) of ``kvsim ARGS`` in a fresh process."""
    code = _PROBE.format(args=args, heavy=HEAVY + ("simpy",))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, check=False)
    line = [x for x in r.stderr.splitlines() if x.startswith("MODULES ")][-1]
    found = json.loads(line.removeprefix("MODULES "))
    return found[:-1], found[-1], r.stdout


def test_help_imports_no_heavy_module_and_lists_every_command():
    mods, code, out = _imported(["--help"])
    assert code == 0
    assert mods == []  # not even SimPy
    listed = [line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == sorted(COMMANDS)


def test_fit_imports_no_heavy_module():
    mods, code, out = _imported(["fit", "--gpu", "rtx-4090", "--model", "llama-3.1-8b"])
    assert code == 0 and "GeForce RTX 4090" in out
    assert mods == []


def test_simulate_imports_plotly_only_for_its_report(tmp_path):
    base = ["simulate", "quickstart", "--set", "workload.max_sessions=2"]
    mods, code, _ = _imported([*base, "-o", str(tmp_path / "a"), "--no-report"])
    assert code == 0
    # the Results are Parquet tables: pandas and pyarrow write them; no plot, and no
    # scipy.stats (~0.6 s): one run's OOM interval is one of two (ONE_RUN_OOM_CI) and its
    # race note is kvsim.plan.races, not the replications' module
    assert mods == ["pandas", "pyarrow", "simpy"]
    mods, code, _ = _imported([*base, "-o", str(tmp_path / "b")])
    assert code == 0 and "plotly" in mods
    assert (tmp_path / "b" / "report.html").is_file()


@pytest.mark.parametrize("width", [40, 80, 200])
def test_help_read_from_source_is_what_the_commands_say(width):
    """The Commands section read from the sources equals click's own (every command
    imported), at any terminal width."""
    lazy = cli.get_help(click.Context(cli, info_name="kvsim", terminal_width=width,
                                      max_content_width=width))
    ctx = click.Context(cli, info_name="kvsim", terminal_width=width, max_content_width=width)
    formatter = ctx.make_formatter()
    click.Group.format_commands(cli, ctx, formatter)  # imports each command
    assert lazy.split("Commands:")[1].rstrip() == formatter.getvalue().split("Commands:")[1].rstrip()


def test_source_help_gives_way_to_an_import_where_help_is_set_in_the_decorator():
    # kvsim validate builds its help in @click.command(help=...): not read from source
    assert source_help(COMMANDS["validate"]) is None
    assert source_help(COMMANDS["fit"]) == cli.get_command(
        click.Context(cli), "fit").help.split("\f")[0]
