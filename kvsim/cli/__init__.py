"""The ``kvsim`` command line: thin click commands over :mod:`kvsim.api`.

Each command lives in its own module under ``kvsim/cli/`` and is imported lazily,
so ``kvsim fit`` never pays for importing SimPy, Plotly or torch.

NOTE: every user error (:class:`kvsim.errors.InputError`, pydantic validation
errors, unreadable files) is printed as one line on stderr with exit code 2 and
no traceback — see :func:`main`.  A bare group (``kvsim``, ``kvsim trace``) prints its
help on stdout with exit code 0, as ``--help`` does.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import threading
from collections.abc import Iterator

import click

from kvsim import __version__
from kvsim.errors import InputError, Terminated, from_validation_error, single_line

# command name → "module:attribute" (a click.Command or click.Group)
COMMANDS: dict[str, str] = {
    "profiles": "kvsim.cli.profiles:profiles",
    "fit": "kvsim.cli.fit:fit",
    "trace": "kvsim.cli.trace:trace",
    "simulate": "kvsim.cli.simulate:simulate",
    "plan": "kvsim.cli.plan:plan",
    "compare": "kvsim.cli.compare:compare",
    "sweep": "kvsim.cli.sweep:sweep",
    "report": "kvsim.cli.report:report",
    "calibrate": "kvsim.cli.calibrate:calibrate",
    "replay": "kvsim.cli.replay:replay",
    "validate": "kvsim.cli.validate:validate",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n in COMMANDS if _spec_available(COMMANDS[n]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None
            raise
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The ``Commands`` section of ``kvsim --help`` without importing the commands.

        NOTE: each command's help is read from its module's source (:func:`source_help`):
        importing every command would import pandas, scipy and pyarrow (~1 s) to print
        eleven lines; a command whose help is not found there is imported.
        """
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            text = source_help(COMMANDS[name])
            if text is None:
                cmd = self.get_command(ctx, name)
                if cmd is None or cmd.hidden:
                    continue
                rows.append((name, cmd.get_short_help_str(limit)))
            else:
                rows.append((name, click.Command(name, help=text).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _spec_available(target: str) -> bool:
    return importlib.util.find_spec(target.split(":")[0]) is not None


def source_help(target: str) -> str | None:
    """The help click gives command ``target`` ("module:function"), read from the
    function's docstring in the module's source; None when it is not plainly there
    (no docstring, or help or a deprecation set in the decorator)."""
    module_name, attr = target.split(":")
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        return None
    try:
        with open(spec.origin, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    head = f"def {attr}("
    at = next((i for i, line in enumerate(lines) if line.startswith(head)), None)
    if at is None:
        return None
    top = at  # the decorators: the lines just above, up to a blank one
    while top > 0 and lines[top - 1].strip() and not lines[top - 1].startswith(("def ", "class ")):
        top -= 1
    decorators = "\n".join(lines[top:at])
    command = decorators.split("@click.option")[0].split("@click.argument")[0]
    if not command.startswith(("@click.command(", "@click.group(")) or "help=" in command \
            or "deprecated" in command:
        return None
    end = at  # the signature's last line
    while end < len(lines) and not lines[end].rstrip().endswith(":"):
        end += 1
    body = "\n".join(lines[end + 1:end + 200]).lstrip()
    if not body.startswith('"""'):
        return None
    close = body.find('"""', 3)
    # NOTE: click cleans a docstring with inspect.cleandoc (inspect is imported by click)
    return inspect.cleandoc(body[3:close]).split("\f")[0] if close > 0 else None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvsim")
def cli() -> None:
    """kvsim — predict KV-cache memory, latency, OOM risk and recall for a
    household's LLM sessions on one GPU, before you buy or tune it."""


# click >= 8.2 raises this for a group called without a subcommand (older clicks print
# the help and exit 0 themselves); () catches nothing
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _invoke(argv: list[str] | None) -> object:
    """Run the command line as ``click`` does, minus its own handling of Ctrl-C (an empty
    line and "Aborted!"): interrupts reach :func:`main`.

    NOTE: a command's click.exceptions.Exit(code) comes back as the return value."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        with cli.make_context("kvsim", args) as ctx:
            return cli.invoke(ctx)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except BrokenPipeError:  # NOTE: `kvsim … | head`: the reader left, nothing to say
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - held until the exit
        return 1


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` while a command runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning user errors into one line and exit code 2, and
    Ctrl-C / SIGTERM into one line (``interrupted``, exit 130 / ``terminated``, 143)."""
    try:
        with _sigterm_raises():
            code = _invoke(argv)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Terminated:
        click.echo("terminated", err=True)
        sys.exit(143)
    except _NO_ARGS_IS_HELP as exc:  # a bare group: its help, like --help
        click.echo(exc.ctx.get_help())
        sys.exit(0)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        # One line, like every other user error: click's message plus where help is.
        where = exc.ctx.command_path if exc.ctx is not None else "kvsim"
        click.echo(f"error: {single_line(exc.format_message())} (see '{where} --help')",
                   err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"error: {single_line(exc.format_message())}", err=True)
        sys.exit(2 if exc.exit_code in (1, 2) else exc.exit_code)
    except InputError as exc:
        click.echo(f"error: {exc.one_line()}", err=True)
        sys.exit(2)
    except MemoryError:
        # NOTE: no traceback: building one may itself need the memory that ran out
        click.echo("error: out of memory: this machine (or the process's limit) cannot "
                   "hold the run; cut the workload, raise sim.sample_interval_s, or set "
                   "sim.max_rss_bytes to stop it early with its results", err=True)
        sys.exit(1)
    except Exception as exc:  # pydantic errors become one line too
        if type(exc).__name__ == "ValidationError" and hasattr(exc, "errors"):
            click.echo(f"error: {from_validation_error(exc).one_line()}", err=True)
            sys.exit(2)
        raise
    sys.exit(code if isinstance(code, int) else 0)
