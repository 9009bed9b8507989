"""Output locations of the commands that write files or folders.

Two helpers, used by every command with an output flag:

- :func:`check_output` refuses, before any work, a location the command could not
  write (a folder that is a file, a file that is a folder, a parent folder that cannot
  be created or written), so a long run is never lost at its last step;
- :func:`output_errors` turns an ``OSError`` while writing into an
  :class:`~kvsim.errors.InputError` (``<flag>: '<path>' — cannot write: <reason>``),
  one line and exit code 2 instead of a traceback.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvsim.errors import InputError


def _cannot(flag: str, path: str | os.PathLike[str], reason: str) -> InputError:
    return InputError(flag, str(path), f"cannot write: {reason}")


def check_output(flag: str, path: str | os.PathLike[str], *, folder: bool) -> Path:
    """Check that ``path`` (a folder when ``folder``, else a file) can be written.

    Probes by creating the missing parent folders and a temp file in the folder that
    will hold the output, then removes everything it created.  Raises
    :class:`InputError` naming ``flag``, the path and the reason.
    """
    p = Path(path)
    if folder and p.exists() and not p.is_dir():
        raise _cannot(flag, p, "it is a file, not a folder")
    if not folder and p.is_dir():
        raise _cannot(flag, p, "it is a folder, not a file")
    _probe(flag, p, p if folder else p.parent)
    return p


def _probe(flag: str, given: Path, target: Path) -> None:
    missing: list[Path] = []
    d = target
    while not d.is_dir():
        if d.exists() or d == d.parent:
            raise _cannot(flag, given, f"{d} is a file, not a folder")
        missing.append(d)
        d = d.parent
    created: list[Path] = []
    try:
        for m in reversed(missing):
            try:
                m.mkdir()
            except OSError as exc:
                raise _cannot(flag, given, f"cannot create folder {m} ({exc.strerror})") from None
            created.append(m)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".kvsim-probe-", dir=target)
        except OSError as exc:
            raise _cannot(flag, given, f"cannot create files in {target} ({exc.strerror})") \
                from None
        os.close(fd)
        os.unlink(tmp)
    finally:
        for m in reversed(created):
            try:
                m.rmdir()
            except OSError:
                pass


@contextmanager
def output_errors(flag: str, path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an ``OSError`` raised while writing ``path`` into a one-line InputError."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = exc.filename2 or exc.filename  # a rename names its target second
        if where and str(where) != str(path):
            reason = f"{reason} ({where})"
        raise _cannot(flag, path, reason) from None


PLOTLYJS_HELP = ("where the report's plotly.js comes from: inline (in the page, offline; "
                 "~5 MB a report), dir (plotly.min.js written once beside the report and "
                 "shared by every report in that folder, offline) or cdn (loaded from "
                 "cdn.plot.ly: small, needs the network)")


def plotlyjs_option(fn: Any) -> Any:
    """``--plotlyjs inline|dir|cdn`` (kvsim.report.page), offline by default."""
    import click

    return click.option("--plotlyjs", type=click.Choice(["inline", "dir", "cdn"]),
                        default="inline", show_default=True, help=PLOTLYJS_HELP)(fn)
