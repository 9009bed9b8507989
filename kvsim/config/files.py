"""The one place kvsim reads user text files: UTF-8 text and YAML documents.

Every reader of a user file goes through here so that the same bad file gets the
same one-line :class:`~kvsim.errors.InputError` wherever it is read:

* a file that cannot be read → ``cannot read file (<reason>)``;
* bytes that are not UTF-8 (a binary file, a Latin-1 export) → ``not UTF-8 text``;
* YAML that does not parse → ``not valid YAML at line N``;
* a YAML mapping that writes one key twice → ``key 'gpu' written twice (lines 2 and
  5)`` — PyYAML would silently keep the last one.

NOTE: :func:`text_lines` streams (trace files may be larger than memory); the YAML
readers load the whole document (scenarios, profiles and presets are small).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import yaml
from yaml.constructor import ConstructorError

from kvsim.errors import InputError

# libyaml's safe loader when available (same documents, ~10x faster on presets).
_BASE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NOT_UTF8 = "not UTF-8 text; kvsim reads UTF-8 files (save or convert it as UTF-8)"


class _UniqueKeyLoader(_BASE_LOADER):  # type: ignore[misc, valid-type]
    """The safe loader, refusing a mapping that writes one key twice."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise ConstructorError(None, None, f"key '{key}' written twice (lines "
                                           f"{seen[key]} and {line})", key_node.start_mark)
                seen[key] = line
            except TypeError:  # an unhashable key: the base constructor says so
                break
        return super().construct_mapping(node, deep=deep)


def no_such_file(field: str, path: str | Path, what: str = "a file") -> InputError:
    """The error for a path that is not a readable file: a folder is named as one (and
    what to give instead), anything else is "file not found"."""
    p = Path(path)
    if p.is_dir():
        return InputError(field, str(path), f"a folder, not a file: give {what} (a path "
                          "to the file itself)")
    return InputError(field, str(path), "file not found")


def read_text(path: Path, field: str) -> str:
    """A whole UTF-8 text file; unreadable or non-UTF-8 files are InputErrors."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(field, str(path), f"cannot read file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(field, str(path), _NOT_UTF8) from None


def text_lines(fh: IO[str] | Iterable[str], field: str, path: Path) -> Iterator[str]:
    """The lines of an open text file; a byte that is not UTF-8 is an InputError."""
    try:
        yield from fh
    except UnicodeDecodeError:
        raise InputError(field, str(path), _NOT_UTF8) from None


def parse_yaml(text: str, field: str, value: Any) -> Any:
    """One YAML document (duplicate keys refused); ``value`` is what an error shows."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except ConstructorError as exc:
        if exc.problem and "written twice" in exc.problem:
            raise InputError(field, value, exc.problem) from None
        raise InputError(field, value, f"not valid YAML{_where(exc)} ({exc.problem})") from None
    except yaml.YAMLError as exc:
        raise InputError(field, value, f"not valid YAML{_where(exc)}") from None


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" at line {mark.line + 1}" if mark is not None else ""


def load_yaml(path: Path, field: str) -> Any:
    """One YAML document from a file (any type); see :func:`parse_yaml`."""
    return parse_yaml(read_text(path, field), field, str(path))


def read_yaml(path: Path, field: str) -> dict[str, Any]:
    """One YAML mapping from a file; malformed, empty or non-mapping files are InputErrors."""
    data = load_yaml(path, field)
    if not isinstance(data, dict):
        raise InputError(field, str(path), "must be a YAML mapping")
    return data
